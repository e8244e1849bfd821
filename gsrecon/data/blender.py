"""NeRF / Blender ``transforms*.json`` scenes as a :class:`Scene`.

Two flavours are read:

* nerf_synthetic: ``transforms_train.json`` and ``transforms_test.json`` (``transforms_val.json`` is
  ignored) with a global ``camera_angle_x`` and RGBA PNGs named without extension (``./train/r_0``).
* instant-ngp / nerfstudio: one ``transforms.json`` with ``fl_x fl_y cx cy w h`` (or ``camera_angle_x``),
  optional ``k1 k2 k3 p1 p2`` distortion, any of them overridable per frame; file paths with or without
  an extension; ``images_<f>/`` beside ``images/`` used for downscale factor ``f`` when present.

``transform_matrix`` is camera-to-world in the OpenGL convention (x right, y up, z backward); frames
carry world-to-camera matrices in the OpenCV convention. These scenes have no points: the returned
point cloud is empty and the model initialises randomly.
"""

from __future__ import annotations

import json
import math
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch

from gsrecon.data.cameras import Frame, Scene
from gsrecon.data.errors import DatasetError
from gsrecon.data.images import check_factor, load_camera_image, read_image_size
from gsrecon.data.splits import check_eval_split, evenly_spaced, every_nth_is_test, frame_name
from gsrecon.data.undistort import Distortion, intrinsics_matrix

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".PNG", ".JPG", ".JPEG")
OPENGL_TO_OPENCV = np.diag([1.0, -1.0, -1.0, 1.0])  # flips the camera's y and z axes
_PINHOLE_MODELS = ("OPENCV", "PINHOLE", "SIMPLE_PINHOLE")
_INTRINSIC_KEYS = ("fl_x", "fl_y", "cx", "cy", "w", "h", "camera_angle_x", "camera_angle_y")
_DISTORTION_KEYS = ("k1", "k2", "k3", "p1", "p2")


def load_blender(path: str, factor: int = 1, eval_split: str = "every_8", max_images: int = 0) -> Scene:
    """Read a transforms.json scene folder: pinhole frames at 1/``factor`` resolution, split, no points.

    Args:
        path: the folder holding ``transforms_train.json`` (+ ``transforms_test.json``) or ``transforms.json``.
        factor: downscale factor (1, 2, 4 or 8).
        eval_split: ``"every_8"`` (names sorted, index % 8 == 0 is test), ``"none"`` (all train) or
            ``"dataset"`` (nerf_synthetic's train/test files, or nerfstudio's ``train_filenames`` /
            ``test_filenames``).
        max_images: if > 0, keep this many evenly spaced frames (in name order) before splitting.

    Raises:
        DatasetError: missing or malformed files, missing intrinsics, unsupported cameras, images that
            disagree with their camera; the message names the file.
    """
    check_factor(factor)
    check_eval_split(eval_split)
    root = Path(path)
    entries = _read_entries(root, eval_split)  # (json file, frame dict, global dict, is_test or None)
    if not entries:
        raise DatasetError(f"{root}: the transforms file(s) list no frames")
    names = _frame_names([str(frame["file_path"]) for _, frame, _, _ in entries])
    seen: dict[str, Path] = {}
    for (json_path, frame, _, _), name in zip(entries, names):
        if name in seen:
            raise DatasetError(f"{json_path}: frame {frame['file_path']!r} duplicates an image of {seen[name]}")
        seen[name] = json_path
    order = sorted(range(len(entries)), key=lambda i: names[i])
    order = [order[i] for i in evenly_spaced(len(order), max_images)]
    if eval_split == "none":
        is_test = [False] * len(order)
    elif eval_split == "every_8":
        is_test = every_nth_is_test(len(order))
    else:
        is_test = [bool(entries[i][3]) for i in order]
    frames = [_frame(root, *entries[i][:3], names[i], factor) for i in order]
    return Scene(
        train=[f for f, test in zip(frames, is_test) if not test],
        test=[f for f, test in zip(frames, is_test) if test],
        points=torch.zeros(0, 3),
        colors=torch.zeros(0, 3),
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DatasetError(f"{path}: invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}") from err
    except (OSError, UnicodeDecodeError) as err:
        raise DatasetError(f"{path}: cannot read ({err})") from err
    if not isinstance(content, dict) or not isinstance(content.get("frames"), list):
        raise DatasetError(f"{path}: expected a JSON object with a 'frames' list")
    for i, frame in enumerate(content["frames"]):
        if not isinstance(frame, dict) or "file_path" not in frame or "transform_matrix" not in frame:
            raise DatasetError(f"{path}: frame {i} needs 'file_path' and 'transform_matrix'")
    return content


def _read_entries(root: Path, eval_split: str) -> list[tuple[Path, dict, dict, bool | None]]:
    """(json file, frame, global fields, is_test per the dataset's own split or None) for every frame."""
    train_json, test_json, single_json = (
        root / f for f in ("transforms_train.json", "transforms_test.json", "transforms.json")
    )
    if train_json.is_file():
        if eval_split == "dataset" and not test_json.is_file():
            raise DatasetError(f"{test_json}: missing, and eval_split 'dataset' needs it")
        entries = []
        for json_path, is_test in ((train_json, False), (test_json, True)):
            if json_path.is_file():
                content = _read_json(json_path)
                entries += [(json_path, frame, content, is_test) for frame in content["frames"]]
        return entries
    if single_json.is_file():
        content = _read_json(single_json)
        test_names = None
        if eval_split == "dataset":
            test_names = _listed_test_files(single_json, content)
        return [
            (single_json, frame, content, None if test_names is None else _normalise(frame["file_path"]) in test_names)
            for frame in content["frames"]
        ]
    raise DatasetError(f"{root}: no transforms_train.json or transforms.json found")


def _normalise(file_path: str) -> str:
    return str(PurePosixPath(str(file_path)))


def _listed_test_files(json_path: Path, content: dict) -> set[str]:
    """Test file paths from nerfstudio's ``test_filenames`` (or all frames not in ``train_filenames``)."""
    if isinstance(content.get("test_filenames"), list):
        return {_normalise(p) for p in content["test_filenames"]}
    if isinstance(content.get("train_filenames"), list):
        train = {_normalise(p) for p in content["train_filenames"]}
        return {_normalise(f["file_path"]) for f in content["frames"]} - train
    raise DatasetError(
        f"{json_path}: eval_split 'dataset' needs 'test_filenames' or 'train_filenames' in this file; "
        "use eval_split 'every_8' or 'none' otherwise"
    )


def _frame_names(file_paths: list[str]) -> list[str]:
    """Frame names from file paths, without a leading folder that all of them share."""
    parts = [[p for p in PurePosixPath(fp).parts if p not in (".", "/")] for fp in file_paths]
    if parts and all(len(p) > 1 for p in parts) and len({p[0] for p in parts}) == 1:
        parts = [p[1:] for p in parts]
    return [frame_name("/".join(p)) for p in parts]


def _image_path(root: Path, json_path: Path, file_path: str) -> Path:
    path = root / file_path
    if path.is_file():
        return path
    for ext in IMAGE_EXTENSIONS:
        candidate = path.with_name(path.name + ext)
        if candidate.is_file():
            return candidate
    raise DatasetError(
        f"{path}: image file is missing (referenced by {json_path}; also tried {', '.join(IMAGE_EXTENSIONS)})"
    )


def _number(fields: dict, key: str, json_path: Path, where: str) -> float | None:
    value = fields.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DatasetError(f"{json_path}: {where}: '{key}' must be a finite number, got {value!r}")
    return float(value)


def _frame(root: Path, json_path: Path, frame: dict, global_fields: dict, name: str, factor: int) -> Frame:
    where = f"frame {str(frame['file_path'])!r}"
    fields = {k: v for k, v in global_fields.items() if k != "frames"} | frame  # per-frame values win
    path = _image_path(root, json_path, str(frame["file_path"]))
    size, K, dist = _camera(fields, path, json_path, where)
    pixels, K = load_camera_image(path, size, K, dist, factor, _prescaled_path(root, path, factor))
    return Frame(
        name=name,
        viewmat=torch.from_numpy(_viewmat(frame["transform_matrix"], json_path, where).astype(np.float32)),
        K=torch.from_numpy(K.astype(np.float32)),
        image=torch.from_numpy(pixels),
    )


def _camera(fields: dict, path: Path, json_path: Path, where: str) -> tuple[tuple[int, int], np.ndarray, Distortion]:
    """((width, height), K [3, 3], distortion) of a frame from its merged global + per-frame fields."""
    model = fields.get("camera_model", "OPENCV")
    if model not in _PINHOLE_MODELS:
        raise DatasetError(
            f"{json_path}: {where} uses the {model} camera model, which gsrecon cannot undistort "
            f"(supported: {', '.join(_PINHOLE_MODELS)} with k1 k2 k3 p1 p2)"
        )
    if fields.get("is_fisheye") or _number(fields, "k4", json_path, where):
        raise DatasetError(
            f"{json_path}: {where} uses a fisheye camera (is_fisheye / k4), which gsrecon cannot undistort"
        )
    values = {k: _number(fields, k, json_path, where) for k in _INTRINSIC_KEYS + _DISTORTION_KEYS}
    if values["w"] is not None and values["h"] is not None:
        size = (int(values["w"]), int(values["h"]))
    else:
        size = read_image_size(path)
    fx = values["fl_x"]
    if fx is None and values["camera_angle_x"] is not None:
        fx = 0.5 * size[0] / math.tan(0.5 * values["camera_angle_x"])
    if fx is None:
        raise DatasetError(
            f"{json_path}: {where} has no intrinsics: need 'fl_x' or 'camera_angle_x' (globally or per frame)"
        )
    fy = values["fl_y"]
    if fy is None and values["camera_angle_y"] is not None:
        fy = 0.5 * size[1] / math.tan(0.5 * values["camera_angle_y"])
    fy = fx if fy is None else fy
    cx = size[0] / 2 if values["cx"] is None else values["cx"]
    cy = size[1] / 2 if values["cy"] is None else values["cy"]
    dist = Distortion(**{k: values[k] or 0.0 for k in _DISTORTION_KEYS})
    return size, intrinsics_matrix(fx, fy, cx, cy), dist


def _prescaled_path(root: Path, path: Path, factor: int) -> Path | None:
    """``<root>/images_<factor>/...`` for an image under ``<root>/images/``, else None."""
    try:
        relative = path.relative_to(root).parts
    except ValueError:
        return None
    if len(relative) < 2 or relative[0] != "images":
        return None
    return root / f"images_{factor}" / Path(*relative[1:])


def _viewmat(transform_matrix: Any, json_path: Path, where: str) -> np.ndarray:
    """World-to-camera OpenCV [4, 4] of an OpenGL camera-to-world ``transform_matrix``."""
    try:
        c2w = np.array(transform_matrix, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise DatasetError(f"{json_path}: {where}: 'transform_matrix' is not a 4x4 matrix of numbers") from err
    if c2w.shape == (3, 4):
        c2w = np.vstack([c2w, [0.0, 0.0, 0.0, 1.0]])
    if c2w.shape != (4, 4) or not np.isfinite(c2w).all() or abs(np.linalg.det(c2w[:3, :3])) < 1e-12:
        raise DatasetError(f"{json_path}: {where}: 'transform_matrix' must be an invertible 4x4 (or 3x4) matrix")
    return np.linalg.inv(c2w @ OPENGL_TO_OPENCV)
