"""A COLMAP capture with consistent distractors: textured boxes standing in the scene for a while, as a person or a
parked car stays in a run of photos.

Pasted patches (``scripts/paste_distractors.py``, the easy case) sit at a place of their own in each photo, so the
scene barely learns them. Here each of ``--objects`` textured boxes (or, ``--kind billboard``, thin panels facing the
run's middle camera) of a side U(``--min-size``, ``--max-size``) x the scene's extent is placed along the ray of a
pixel in the middle of the run's middle photo: U(0.3, 0.6) x the median depth of the SfM points in front of that
photo beyond the run's camera farthest along its view (a forward walk passes nothing), in front of every camera of
the run, turned about the cameras' mean up, textured with a crop of a training photo outside the run (one shade per
face). Each box is drawn through the known camera of every photo of a contiguous run of ``--fraction`` of the
training photos (sorted by name, the run's start drawn from ``--seed``), with a depth test against the other boxes
and nothing else: they stand in front of the scene. The test photos of the ``every_8`` split (``gsrecon train
--data``'s) and the other training photos are copied as they are, byte for byte; the sparse model is copied
unchanged. ``distractors.json`` lists the run's photos, the boxes (centre, half sizes, rotation, the photo each is
textured from) and the share of each photo they cover.

    python scripts/make_distractors.py ../shared/data/lund /tmp/lund_boxes --seed 0
    gsrecon train --data /tmp/lund_boxes data.factor=4 max_steps=2000

The scene's extent is the spread of its cameras, small in a forward-facing capture: LLFF's horns takes ``--min-size
0.5 --max-size 1.0`` for boxes covering 31-43 % of its run (the defaults cover 2 %). Photos taken through a lens
(radial or fisheye distortion in the COLMAP camera) get the boxes where the lens puts them.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from gsrecon.cameras.paths import mean_up
from gsrecon.data.formats.colmap_model import find_sparse_dir, read_model
from gsrecon.data.formats.lens import Distortion, camera_intrinsics, undistort_points
from gsrecon.data.readers.colmap import load_colmap
from gsrecon.data.scene import Frame, Scene
from gsrecon.geometry import camera_centers

TEXTURE = 256  # texels along a texture's side (a crop of a photo resized to it)
SHADES = (1.0, 0.85, 0.7)  # brightness of the faces across the box's x, y and z axes


@dataclass
class Box:
    """A textured box in the world: ``centre`` [3], ``half`` sizes [3], ``rotation`` [3, 3] (columns: its axes in
    world coordinates), ``texture`` [T, T, 3] uint8 and the photo it was cut from."""

    centre: Tensor
    half: Tensor
    rotation: Tensor
    texture: Tensor
    source: str


@dataclass
class Lens:
    """A photo's camera as its file was taken: ``K`` [3, 3] and the lens's distortion (all zero: a pinhole)."""

    K: np.ndarray
    distortion: Distortion
    width: int
    height: int


def lenses(scene_dir: Path) -> dict[str, Lens]:
    """The camera of each photo of the COLMAP model in ``scene_dir``, by frame name (the file name without its
    extension), as the photo's file was taken (the loaded frames are undistorted)."""
    model = read_model(find_sparse_dir(scene_dir))
    found = {}
    for image in model.images.values():
        camera = model.cameras[image.camera_id]
        K, distortion = camera_intrinsics(camera, str(scene_dir / "sparse"))
        found[Path(image.name).stem] = Lens(K, distortion, camera.width, camera.height)
    return found


def pixel_rays(frame: Frame, lens: Lens) -> tuple[Tensor, Tensor]:
    """The camera centre [3] and the unit world directions [H, W, 3] of the centres of the pixels of ``frame``'s
    photo file, taken through ``lens`` (its distortion undone)."""
    v, u = np.meshgrid(np.arange(lens.height, dtype=np.float64), np.arange(lens.width, dtype=np.float64), indexing="ij")
    xd, yd = (u + 0.5 - lens.K[0, 2]) / lens.K[0, 0], (v + 0.5 - lens.K[1, 2]) / lens.K[1, 1]
    x, y = (xd, yd) if lens.distortion.is_zero else undistort_points(xd, yd, lens.distortion)
    camera = torch.from_numpy(np.stack([x, y, np.ones_like(x)], -1))  # [H, W, 3]
    viewmat = frame.viewmat.double()
    directions = camera @ viewmat[:3, :3]  # R^T d per pixel: camera to world
    return camera_centers(viewmat), directions / directions.norm(dim=-1, keepdim=True)


def draw_boxes(pixels: Tensor, frame: Frame, lens: Lens, boxes: list[Box]) -> Tensor:
    """[H, W] bool where ``boxes`` cover the photo of ``frame`` taken through ``lens``, drawn into its uint8
    ``pixels`` [H, W, 3] in place: each pixel takes the nearest box its ray enters (a camera inside a box does not
    see it)."""
    origin, directions = pixel_rays(frame, lens)
    nearest = torch.full(directions.shape[:2], math.inf, dtype=torch.float64)  # [H, W]
    for box in boxes:
        rotation, half = box.rotation.double(), box.half.double()
        start = rotation.T @ (origin - box.centre.double())  # [3] the camera in the box's frame
        local = directions @ rotation  # [H, W, 3]
        low, high = (-half - start) / local, (half - start) / local  # [H, W, 3] slab crossings (inf where parallel)
        enter, leave = torch.minimum(low, high), torch.maximum(low, high)
        t_in, axis = enter.max(-1)  # [H, W]: where the ray enters the box, and the face's axis
        hit = (t_in > 0) & (t_in <= leave.min(-1).values) & (t_in < nearest)
        if not hit.any():
            continue
        point = (start + t_in[..., None] * local)[hit]  # [P, 3] on the box's surface, its frame
        face = axis[hit]  # [P]
        others = torch.stack([(face + 1) % 3, (face + 2) % 3], -1)  # [P, 2] the face's two in-plane axes
        uv = (point.gather(1, others) / half[others] + 1) / 2  # [P, 2] in [0, 1]
        texel = (uv.clamp(0, 1 - 1e-9) * TEXTURE).long()
        colour = box.texture[texel[:, 1], texel[:, 0]].double() * torch.tensor(SHADES, dtype=torch.float64)[face, None]
        pixels[hit] = colour.round().clamp(0, 255).to(torch.uint8)
        nearest[hit] = t_in[hit]
    return nearest.isfinite()


def training_run(train: list[Frame], fraction: float, generator: torch.Generator) -> list[Frame]:
    """A contiguous run of ``round(fraction x len(train))`` (at least 1) of the training frames, sorted by name, its
    start drawn from ``generator``."""
    ordered = sorted(train, key=lambda frame: frame.name)
    length = max(1, round(fraction * len(ordered)))
    start = int(torch.randint(len(ordered) - length + 1, (1,), generator=generator))
    return ordered[start : start + length]


def place_boxes(
    scene: Scene,
    run: list[Frame],
    lens: dict[str, Lens],
    count: int,
    sizes: tuple[float, float],
    kind: str,
    generator: torch.Generator,
) -> list[Box]:
    """``count`` boxes in front of the scene where the run's middle photo sees them (see the module docstring), none
    enclosing or touching a camera of the run."""
    middle = run[len(run) // 2]
    origin, directions = pixel_rays(middle, lens[middle.name])
    height, width = directions.shape[:2]
    seen = scene.points.double() if scene.points.numel() else origin[None] + directions.reshape(-1, 3)
    depths = (seen - origin) @ directions[height // 2, width // 2]
    depth = float(depths[depths > 0].median()) if (depths > 0).any() else scene.extent
    up = mean_up(torch.stack([frame.viewmat for frame in scene.train])).double()
    in_run = {frame.name for frame in run}
    textures = [frame for frame in scene.train if frame.name not in in_run] or scene.train
    viewmats = torch.stack([frame.viewmat for frame in run]).double()  # [R, 4, 4]
    centres = camera_centers(viewmats)  # [R, 3]
    ahead = max(0.0, float(((centres - origin) @ directions[height // 2, width // 2]).max()))
    boxes: list[Box] = []
    while len(boxes) < count:
        for _ in range(1000):
            row = int(height * (0.3 + 0.4 * float(torch.rand(1, generator=generator))))
            col = int(width * (0.2 + 0.6 * float(torch.rand(1, generator=generator))))
            distance = ahead + depth * (0.3 + 0.3 * float(torch.rand(1, generator=generator)))
            side = scene.extent * (sizes[0] + (sizes[1] - sizes[0]) * float(torch.rand(1, generator=generator)))
            centre = origin + distance * directions[row, col]
            half = torch.full((3,), side / 2, dtype=torch.float64) * (0.6 + 0.8 * torch.rand(3, generator=generator))
            if kind == "billboard":  # a panel facing the middle camera: thin along its own z
                facing = origin - centre
                rotation = _frame_of(up, facing)
                half[2] = side * 0.02
            else:
                rotation = _frame_of(up, torch.randn(3, generator=generator, dtype=torch.float64))  # a random turn
            in_camera = viewmats[:, :3, :3] @ centre + viewmats[:, :3, 3]  # [R, 3] its centre in each camera of the run
            if in_camera[:, 2].min() > 1.5 * half.norm():  # in front of every one, well clear of it
                break
        else:
            raise SystemExit(
                "error: found no place for a box that no camera of the run stands in: use --max-size lower"
            )
        source = textures[int(torch.randint(len(textures), (1,), generator=generator))]
        boxes.append(Box(centre, half, rotation, _crop(source, generator), source.name))
    return boxes


def _frame_of(up: Tensor, forward: Tensor) -> Tensor:
    """[3, 3] a rotation whose y axis is ``up`` and whose z axis is ``forward`` made orthogonal to it."""
    forward = forward - (forward @ up) * up
    if forward.norm() < 1e-9:
        forward = torch.linalg.svd(up[None]).Vh[-1]  # any direction across ``up``
    z = forward / forward.norm()
    x = torch.linalg.cross(up, z)
    return torch.stack([x, up, z], dim=1)


def _crop(frame: Frame, generator: torch.Generator) -> Tensor:
    """[TEXTURE, TEXTURE, 3] uint8: a square crop of a third of ``frame``'s shorter side, at a random place."""
    image = frame.image[..., :3]
    side = max(1, min(image.shape[:2]) // 3)
    top = int(torch.randint(image.shape[0] - side + 1, (1,), generator=generator))
    left = int(torch.randint(image.shape[1] - side + 1, (1,), generator=generator))
    crop = Image.fromarray(image[top : top + side, left : left + side].numpy())
    return torch.from_numpy(np.array(crop.resize((TEXTURE, TEXTURE), Image.BILINEAR)))


def image_path(scene_dir: Path, name: str) -> Path:
    """The photo file of the frame ``name`` in ``scene_dir/images`` (the name, with the file's extension)."""
    matches = [path for path in (scene_dir / "images").glob(f"{name}.*") if path.stem == name]
    if len(matches) != 1:
        raise SystemExit(f"error: {scene_dir / 'images'} has {len(matches)} files named {name}.*, expected one")
    return matches[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scene", type=Path, help="a COLMAP scene folder (images/, sparse/)")
    parser.add_argument("out", type=Path, help="the capture folder to write (must not exist)")
    parser.add_argument("--objects", type=int, default=2, help="boxes placed (default 2)")
    parser.add_argument("--kind", choices=("box", "billboard"), default="box")
    parser.add_argument("--min-size", type=float, default=0.1, help="smallest side, x the scene's extent (0.1)")
    parser.add_argument("--max-size", type=float, default=0.3, help="largest side, x the scene's extent (0.3)")
    parser.add_argument("--fraction", type=float, default=0.3, help="share of the training photos in the run (0.3)")
    parser.add_argument("--seed", type=int, default=0, help="draws the run, the places, sizes and textures")
    args = parser.parse_args(argv)
    if not (args.objects >= 1 and 0 < args.min_size <= args.max_size and 0 < args.fraction <= 1):
        raise SystemExit("error: --objects >= 1, 0 < --min-size <= --max-size and --fraction in (0, 1], please")
    if args.out.exists():
        raise SystemExit(f"error: {args.out} exists: give a new folder")
    scene = load_colmap(str(args.scene), factor=1, eval_split="every_8")
    lens = lenses(args.scene)
    generator = torch.Generator().manual_seed(args.seed)
    run = training_run(scene.train, args.fraction, generator)
    boxes = place_boxes(scene, run, lens, args.objects, (args.min_size, args.max_size), args.kind, generator)
    (args.out / "images").mkdir(parents=True)
    shutil.copytree(args.scene / "sparse", args.out / "sparse")
    covered, in_run = {}, {frame.name for frame in run}
    for frame in sorted(scene.train + scene.test, key=lambda frame: frame.name):
        source = image_path(args.scene, frame.name)
        if frame.name not in in_run:
            shutil.copyfile(source, args.out / "images" / source.name)
            continue
        with Image.open(source) as photo:
            pixels = torch.from_numpy(np.array(photo.convert("RGB")))
        covered[frame.name] = float(draw_boxes(pixels, frame, lens[frame.name], boxes).double().mean())
        Image.fromarray(pixels.numpy()).save(args.out / "images" / source.name, quality=95)
    record = {
        "run": [frame.name for frame in run],
        "covered": covered,
        "boxes": [
            {
                "centre": box.centre.tolist(),
                "half": box.half.tolist(),
                "rotation": box.rotation.tolist(),
                "texture_from": box.source,
            }
            for box in boxes
        ],
        "seed": args.seed,
        "kind": args.kind,
    }
    (args.out / "distractors.json").write_text(json.dumps(record, indent=2) + "\n")
    shares = ", ".join(f"{100 * share:.0f} %" for share in covered.values())
    print(
        f"wrote {args.out}: {len(boxes)} {args.kind}es in {len(run)} of {len(scene.train)} training photos ({shares})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
