"""The synthetic exposure capture: the synthetic scene as a transforms.json capture whose training photos each
have their own exposure, white balance and black level (as ``scripts/perturb_colours.py`` draws them); the test
views (every 8th, ``data.eval_split: every_8``) keep the true colours.

    python scripts/make_exposure_capture.py /tmp/exposure_capture --seed 0
    gsrecon train --config configs/phone.yaml data.path=/tmp/exposure_capture data.factor=1 views.appearance.name=affine

The capture holds ``transforms.json``, ``images/`` and the scene's points (``ply_file_path``); 64x48 px, 24 views.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from perturb_colours import with_camera_colours  # noqa: E402
from test_triangulate import _write_transforms  # noqa: E402

from gsrecon.data.readers.synthetic import SyntheticConfig, load_synthetic  # noqa: E402
from gsrecon.io.ply import write_points_ply  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the capture folder to write (must not exist)")
    parser.add_argument("--seed", type=int, default=0, help="draws each training photo's colours")
    args = parser.parse_args()
    scene = load_synthetic(SyntheticConfig(), eval_split="none")
    _write_transforms(args.out, scene.train)
    colors = np.rint(scene.colors.numpy() * 255).astype(np.uint8)
    write_points_ply(args.out / "sparse_pc.ply", scene.points.numpy(), colors)
    content = json.loads((args.out / "transforms.json").read_text())
    (args.out / "transforms.json").write_text(json.dumps({"ply_file_path": "sparse_pc.ply", **content}, indent=4))
    generator = torch.Generator().manual_seed(args.seed)
    for index, frame in enumerate(scene.train):
        if index % 8 != 0:  # a training view of the every_8 split
            pixels = with_camera_colours(frame.image, generator)
            Image.fromarray(pixels.numpy()).save(args.out / "images" / f"{frame.name}.png")
    print(f"wrote {args.out}: {len(scene.train)} views, {len(scene.points)} points")


if __name__ == "__main__":
    main()
