"""Tiny captures in every layout users bring to ``gsrecon train --data`` (docs/training.md): each writer
makes a few small files under ``root`` and returns the path to pass to ``--data``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image
from test_blender import _write_ngp, _write_synthetic
from test_colmap import H, W, _make_scene, _write_images
from test_nerfstudio import write_nerfstudio

from gsrecon.data.readers.synthetic import SyntheticConfig, load_synthetic
from gsrecon.data.readers.transforms import OPENGL_TO_OPENCV
from gsrecon.data.scene import Frame
from gsrecon.render.video import write_video

TINY = {"width": 64, "height": 48, "num_views": 9, "supersample": 1}  # the synthetic scene, small
OWN_TEST = (1, 5)  # the frames a capture with its own split files lists as test views (not every_8's 0, 8)


def tiny_frames(cache: Path, **scene) -> list[Frame]:
    """Views of the synthetic scene (``TINY`` unless ``scene`` says otherwise), in order around it."""
    cfg = SyntheticConfig(**{**TINY, "cache_dir": str(cache), **scene})
    return load_synthetic(cfg, eval_split="none").train


def _c2w(frame: Frame) -> list[list[float]]:
    """The OpenGL camera-to-world ``transform_matrix`` of a frame."""
    return (np.linalg.inv(frame.viewmat.double().numpy()) @ OPENGL_TO_OPENCV).tolist()


def _intrinsics(frame: Frame) -> dict[str, float]:
    K = frame.K.double()
    return {"fl_x": K[0, 0].item(), "fl_y": K[1, 1].item(), "cx": K[0, 2].item(), "cy": K[1, 2].item()}


def _photos(root: Path, frames: list[Frame], folder: str = "images") -> list[str]:
    """The frames' pixels as JPEG photos in ``root/folder``; their paths relative to ``root``."""
    (root / folder).mkdir(parents=True, exist_ok=True)
    paths = [f"{folder}/frame_{index + 1:05d}.jpg" for index in range(len(frames))]
    for path, frame in zip(paths, frames):
        Image.fromarray(frame.image.numpy()).save(root / path, quality=95)
    return paths


def colmap(root: Path, cache: Path) -> Path:
    """A COLMAP scene: ``images/``, ``images_2/`` and ``sparse/0/`` (binary)."""
    _, _, written = _make_scene(root)
    _write_images(root / "images_2", sorted(written["pixels"]), size=(W // 2, H // 2))
    return root


def ns_process_data(root: Path, cache: Path) -> Path:
    """nerfstudio's ns-process-data output: ``camera_model``, ``ply_file_path``, masks, ``images_2/``."""
    write_nerfstudio(root, cache)
    return root


def polycam(root: Path, cache: Path) -> Path:
    """A Polycam export as nerfstudio converts it: JPEG photos, intrinsics on every frame, no points."""
    frames = tiny_frames(cache)
    paths = _photos(root, frames)
    entries = [
        {"file_path": path, "transform_matrix": _c2w(frame), **_intrinsics(frame), "w": frame.width, "h": frame.height}
        for path, frame in zip(paths, frames)
    ]
    (root / "transforms.json").write_text(json.dumps({"frames": entries}, indent=2))
    return root


def record3d(root: Path, cache: Path) -> Path:
    """A Record3D capture as nerfstudio converts it: ``camera_model``, JPEG photos, a depth map per frame."""
    frames = tiny_frames(cache)
    paths = _photos(root, frames)
    (root / "depth").mkdir()
    entries = []
    for path, frame in zip(paths, frames):
        depth = f"depth/{Path(path).stem}.png"
        Image.fromarray(np.full((frame.height, frame.width), 1000, np.uint16)).save(root / depth)
        entries.append({"file_path": path, "transform_matrix": _c2w(frame), "depth_file_path": depth})
    content = {"camera_model": "OPENCV", **_intrinsics(frames[0]), "w": TINY["width"], "h": TINY["height"]}
    (root / "transforms.json").write_text(json.dumps(content | {"frames": entries}, indent=2))
    return root


def instant_ngp(root: Path, cache: Path) -> Path:
    """instant-ngp's layout: ``aabb_scale``, global intrinsics one frame overrides, JPEG photos."""
    _write_ngp(root, aabb_scale=16)
    return root


def split_capture(root: Path, frames: list[Frame]) -> Path:
    """A phone capture published as many NeRF repositories publish theirs: JPEG photos, ``transforms.json`` with
    every frame and ``transforms_train.json`` + ``transforms_test.json`` with the capture's own split
    (:data:`OWN_TEST` are test views)."""
    paths = _photos(root, frames)
    K = _intrinsics(frames[0])
    fields = {"camera_model": "OPENCV", **K, "w": frames[0].width, "h": frames[0].height}
    entries = [{"file_path": path, "transform_matrix": _c2w(frame)} for path, frame in zip(paths, frames)]
    test = [entry for index, entry in enumerate(entries) if index % 8 in OWN_TEST]
    train = [entry for entry in entries if entry not in test]
    for name, listed in (("transforms", entries), ("transforms_train", train), ("transforms_test", test)):
        (root / f"{name}.json").write_text(json.dumps(fields | {"frames": listed}, indent=2))
    return root


def phone_split(root: Path, cache: Path) -> Path:
    """:func:`split_capture` of the tiny scene."""
    return split_capture(root, tiny_frames(cache))


def nerf_synthetic(root: Path, cache: Path) -> Path:
    """NeRF-synthetic: RGBA renders with transparent backgrounds, ``transforms_{train,val,test}.json``."""
    _write_synthetic(root)
    return root


def rgba_one_file(root: Path, cache: Path) -> Path:
    """Renders with a transparent background listed in one ``transforms.json`` (instant-ngp's synthetic scenes)."""
    frames = tiny_frames(cache)
    (root / "images").mkdir(parents=True)
    entries = []
    for index, frame in enumerate(frames):
        rgba = np.dstack([frame.image.numpy(), np.full(frame.image.shape[:2], 255, np.uint8)])
        rgba[:8, :, 3] = 0  # a transparent band at the top
        Image.fromarray(rgba).save(root / "images" / f"r_{index}.png")
        entries.append({"file_path": f"images/r_{index}.png", "transform_matrix": _c2w(frame)})
    content = {"camera_angle_x": 2 * np.arctan(frames[0].width / (2 * frames[0].K[0, 0].item()))}
    (root / "transforms.json").write_text(json.dumps(content | {"frames": entries}))
    return root


def video(root: Path, cache: Path) -> Path:
    """One video file: ``root``.mp4."""
    path = root.with_suffix(".mp4")
    write_video(path, [frame.image.numpy() for frame in tiny_frames(cache)], fps=10)
    return path


def videos(root: Path, cache: Path) -> Path:
    """A folder of two videos."""
    root.mkdir(parents=True)
    frames = [frame.image.numpy() for frame in tiny_frames(cache)]
    write_video(root / "orbit_a.mp4", frames[:5], fps=10)
    write_video(root / "orbit_b.mov", frames[4:], fps=10)
    return root


def photos(root: Path, cache: Path) -> Path:
    """A folder of bare photos."""
    _photos(root, tiny_frames(cache), folder=".")
    return root
