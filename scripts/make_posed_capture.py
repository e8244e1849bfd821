"""A COLMAP scene as a transforms.json capture without points, its training poses made wrong in the file.

Phone captures come with poses from the device's tracking and no SfM model; training triangulates their points from
those poses (``model.init: auto``), so a pose error reaches the points too. This writes such a capture from a COLMAP
scene: its images at 1/``--factor`` (PNG) with per-frame intrinsics, every training pose (all but every 8th frame
by name, ``data.eval_split: every_8``) turned by ``--rotation-deg`` about a random axis through the camera centre and
moved by ``--translation`` x the scene's extent (as ``scripts/perturb_poses.py`` draws them), the test views at
their true poses.

    python scripts/make_posed_capture.py /work/shared/data/statuette_colmap /tmp/statuette_1deg --factor 2 \\
        --rotation-deg 1 --translation 0.01
    gsrecon train --config configs/phone.yaml data.path=/tmp/statuette_1deg data.factor=4 views.pose_opt.name=se3
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))

from perturb_poses import perturbed_viewmats

from gsrecon.data.readers.colmap import load_colmap
from gsrecon.data.readers.transforms import OPENGL_TO_OPENCV


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scene", type=Path, help="a COLMAP scene folder (images/, sparse/0/)")
    parser.add_argument("out", type=Path, help="the capture folder to write (must not exist)")
    parser.add_argument("--factor", type=int, default=1, help="image downscale factor (1, 2, 4, 8)")
    parser.add_argument("--rotation-deg", type=float, default=0.0, help="each training camera turned by this angle")
    parser.add_argument("--translation", type=float, default=0.0, help="... and moved by this fraction of the extent")
    parser.add_argument("--seed", type=int, default=0, help="draws the axes and directions")
    args = parser.parse_args()
    scene = load_colmap(str(args.scene), factor=args.factor, eval_split="none")
    frames = scene.train  # sorted by name
    truth = scene.train_cameras.viewmats  # [N, 4, 4]
    moved = perturbed_viewmats(truth, args.rotation_deg, args.translation * scene.extent, args.seed)
    test = torch.arange(len(frames)) % 8 == 0  # the every_8 split's test views keep their true poses
    moved[test] = truth[test]
    (args.out / "images").mkdir(parents=True)
    content: dict = {"camera_model": "OPENCV", "frames": []}
    for frame, viewmat in zip(frames, moved):
        Image.fromarray(frame.image.numpy()).save(args.out / "images" / f"{frame.name}.png")
        K = frame.K.double()
        c2w = np.linalg.inv(viewmat.double().numpy()) @ OPENGL_TO_OPENCV  # OpenCV world-to-camera -> OpenGL c2w
        content["frames"].append(
            {
                "file_path": f"images/{frame.name}.png",
                "transform_matrix": c2w.tolist(),
                **{"fl_x": K[0, 0].item(), "fl_y": K[1, 1].item(), "cx": K[0, 2].item(), "cy": K[1, 2].item()},
                **{"w": frame.width, "h": frame.height},
            }
        )
    (args.out / "transforms.json").write_text(json.dumps(content, indent=4) + "\n")
    print(f"wrote {args.out}: {len(frames)} frames, {int((~test).sum())} training poses moved")


if __name__ == "__main__":
    main()
