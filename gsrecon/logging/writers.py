"""Writers: where scalars, images and the config of a run go. Chosen in the YAML ``writers:`` list."""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gsrecon.config import to_container
from gsrecon.registry import WRITER_REGISTRY


class Writer(ABC):
    """Destination for a run's scalars, images and config. ``exp_dir`` is the run's output folder."""

    def __init__(self, cfg: Any, exp_dir: str | Path) -> None:
        self.cfg = cfg
        self.exp_dir = Path(exp_dir)

    @abstractmethod
    def write_scalar(self, name: str, value: float, step: int) -> None:
        """Record one scalar, e.g. ``train/loss``."""

    @abstractmethod
    def write_image(self, name: str, image: torch.Tensor | np.ndarray, step: int) -> None:
        """Record one image, ``[H, W, 3]`` float in [0, 1] (or uint8)."""

    @abstractmethod
    def write_config(self, config: dict[str, Any]) -> None:
        """Record the resolved run config."""

    def write_histogram(self, name: str, values: torch.Tensor, step: int) -> None:
        """Record a histogram of ``values``; writers that cannot show one ignore it."""

    def outputs(self) -> list[str]:
        """Paths (relative to ``exp_dir``) this writer writes; ``--overwrite`` replaces them with the run."""
        return []

    def flush(self) -> None:
        """Push buffered records to disk."""

    def close(self) -> None:
        """Flush and release files."""


def _as_hwc_float(image: torch.Tensor | np.ndarray) -> np.ndarray:
    array = image.detach().cpu().numpy() if isinstance(image, torch.Tensor) else np.asarray(image)
    if array.dtype == np.uint8:
        return array.astype(np.float32) / 255.0
    return np.clip(array.astype(np.float32), 0.0, 1.0)


@WRITER_REGISTRY.register()
class TensorboardWriter(Writer):
    """TensorBoard event files under ``<exp_dir>/<subdir>``."""

    @dataclass
    class Config:
        subdir: str = "tb"
        flush_secs: int = 30

    def __init__(self, cfg: Config, exp_dir: str | Path) -> None:
        super().__init__(cfg, exp_dir)
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = self.exp_dir / cfg.subdir
        self._writer = SummaryWriter(str(self.log_dir), flush_secs=cfg.flush_secs)

    def outputs(self) -> list[str]:
        return [self.cfg.subdir]

    def write_scalar(self, name: str, value: float, step: int) -> None:
        self._writer.add_scalar(name, value, step)

    def write_image(self, name: str, image: torch.Tensor | np.ndarray, step: int) -> None:
        self._writer.add_image(name, _as_hwc_float(image), step, dataformats="HWC")

    def write_config(self, config: dict[str, Any]) -> None:
        import yaml

        text = yaml.safe_dump(to_container(config), sort_keys=False)
        self._writer.add_text("config", "```yaml\n" + text + "\n```", 0)

    def write_histogram(self, name: str, values: torch.Tensor, step: int) -> None:
        self._writer.add_histogram(name, values.detach().float().cpu(), step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


@WRITER_REGISTRY.register()
class JsonlWriter(Writer):
    """Appends one JSON object per scalar (``{"name", "value", "step"}``) to ``<exp_dir>/<filename>``.

    Images are not stored; non-finite values are written as ``null``.
    """

    @dataclass
    class Config:
        filename: str = "scalars.jsonl"

    def __init__(self, cfg: Config, exp_dir: str | Path) -> None:
        super().__init__(cfg, exp_dir)
        self.path = self.exp_dir / cfg.filename
        self._file = self.path.open("a")

    def outputs(self) -> list[str]:
        return [self.cfg.filename]

    def write_scalar(self, name: str, value: float, step: int) -> None:
        value = float(value)
        record = {"name": name, "value": value if math.isfinite(value) else None, "step": int(step)}
        self._file.write(json.dumps(record) + "\n")

    def write_image(self, name: str, image: torch.Tensor | np.ndarray, step: int) -> None:
        pass

    def write_config(self, config: dict[str, Any]) -> None:
        pass

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class Writers:
    """A run's writers as one: every record goes to each of them (to none on non-main ranks)."""

    def __init__(self, writers: list[Writer]) -> None:
        self.writers = writers

    def write_scalar(self, name: str, value: float, step: int) -> None:
        for writer in self.writers:
            writer.write_scalar(name, value, step)

    def write_image(self, name: str, image: torch.Tensor | np.ndarray, step: int) -> None:
        for writer in self.writers:
            writer.write_image(name, image, step)

    def write_histogram(self, name: str, values: torch.Tensor, step: int) -> None:
        for writer in self.writers:
            writer.write_histogram(name, values, step)

    def write_config(self, config: dict[str, Any]) -> None:
        for writer in self.writers:
            writer.write_config(config)

    def outputs(self) -> list[str]:
        return [path for writer in self.writers for path in writer.outputs()]

    def flush(self) -> None:
        for writer in self.writers:
            writer.flush()

    def close(self) -> None:
        for writer in self.writers:
            writer.close()
