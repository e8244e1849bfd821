"""An example dataset reader: photos in ``images/`` and their cameras in one CSV file.

Used by custom_reader.yaml (``imports: [csv_reader.py]``); copy it as a starting point for a capture format of
your own. Its options live in the config section named after it (``data.csv_poses``), checked against its
``Config``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from gsrecon.data.errors import DatasetError
from gsrecon.data.pipeline import DataPipeline
from gsrecon.data.scene import Frame, Scene
from gsrecon.data.splits import split_frames
from gsrecon.registry import DATASET_REGISTRY


@DATASET_REGISTRY.register("csv_poses")
class CsvPosesReader:
    """``data.dataset: csv_poses``: ``<data.path>/images/<name>.png`` and a CSV file with a row per photo,
    ``name, fx, fy, cx, cy`` and the 16 numbers of its world-to-camera matrix (OpenCV axes), row by row.
    No SfM points: training starts from random ones."""

    @dataclass
    class Config:
        poses: str = "poses.csv"  # the CSV file, relative to data.path

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    def read(self, data: DataPipeline.Config) -> Scene:
        root = Path(data.path)
        table = root / self.cfg.poses
        if not table.is_file():
            raise DatasetError(f"{table}: no such file (data.csv_poses.poses names the CSV inside data.path)")
        if data.factor != 1:
            raise DatasetError(f"{table}: this reader reads full-size images; set data.factor=1")
        frames = []
        with table.open(newline="") as f:
            for number, row in enumerate(csv.reader(f), start=1):
                if len(row) != 21:
                    raise DatasetError(f"{table}: line {number} has {len(row)} values, expected 21")
                name, (fx, fy, cx, cy), matrix = row[0], map(float, row[1:5]), [float(v) for v in row[5:]]
                pixels = np.asarray(Image.open(root / "images" / f"{name}.png").convert("RGB"))  # [H, W, 3] uint8
                K = torch.tensor([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])  # [3, 3]
                frames.append(Frame(name, torch.tensor(matrix).reshape(4, 4), K, torch.from_numpy(pixels.copy())))
        train, test = split_frames(sorted(frames, key=lambda frame: frame.name), data.eval_split)
        return Scene(train, test, points=torch.zeros(0, 3), colors=torch.zeros(0, 3))
