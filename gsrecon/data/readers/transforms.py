"""NeRF / Blender ``transforms*.json`` scenes as a :class:`Scene`.

Two flavours are read:

* nerf_synthetic: ``transforms_train.json`` and ``transforms_test.json`` (``transforms_val.json`` is
  ignored) with a global ``camera_angle_x`` and RGBA PNGs named without extension (``./train/r_0``).
  The test file is read for eval_split "dataset" only: the other splits divide the train frames.
* instant-ngp / nerfstudio: one ``transforms.json`` with ``fl_x fl_y cx cy w h`` (or ``camera_angle_x``),
  optional ``k1 k2 k3 p1 p2`` distortion (``k1..k4`` with ``camera_model: OPENCV_FISHEYE``), any of them
  overridable per frame; file paths with or without
  an extension; ``images_<f>/`` beside ``images/`` used for downscale factor ``f`` when present.

``transform_matrix`` is camera-to-world in the OpenGL convention (x right, y up, z backward); frames
carry world-to-camera matrices in the OpenCV convention. A top-level ``ply_file_path`` (nerfstudio's
exports) names a point cloud in the same world coordinates, which ``model.init: auto`` starts from.
nerfstudio's ``applied_transform`` (3x4) is the transform it applied to the poses of the COLMAP model it
converted; its ``ply_file_path`` points were transformed alike, so both are read as they are, and only the
points of a ``colmap/sparse/0/`` model beside the file (older ``ns-process-data`` output, no
``ply_file_path``) are moved by it (by nerfstudio's former fixed transform where the field is absent).
Without either the point cloud is empty, and the scene's ``posed_capture`` says that one can be triangulated
from the images and their known poses when ``model.init: auto`` asks (pycolmap, cached:
:mod:`gsrecon.data.prepare.triangulate`, whose ``gsrecon data triangulate`` writes it into the folder instead);
pose refinement asks it for the keypoints a point cloud file does not carry. A frame's mask
(:mod:`gsrecon.data.formats.masks`) is its ``mask_path``, else the file of its name in ``masks/`` beside
``images/``; its depth map (:mod:`gsrecon.data.formats.depths`) is its ``depth_file_path`` (in
``depth_unit_scale_factor``, global or per frame), else the file of its name in ``depths/``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from gsrecon.data.capture_files import capture_file
from gsrecon.data.errors import DatasetError, checked_number
from gsrecon.data.formats.colmap_model import read_model
from gsrecon.data.formats.depths import DEPTHS_FOLDER, MILLIMETRES, DepthFile, depth_file, find_depth
from gsrecon.data.formats.images import (
    ImageFile,
    camera_frame,
    camera_image_file,
    check_factor,
    read_image_size,
)
from gsrecon.data.formats.lens import SUPPORTED_MODELS, Distortion, fov_to_focal, intrinsics_matrix
from gsrecon.data.formats.masks import MASKS_FOLDER, MaskFile, find_mask, mask_file
from gsrecon.data.formats.transforms_json import image_path, read_transforms, transforms_file
from gsrecon.data.pipeline import DataPipeline, folder_arguments
from gsrecon.data.scene import Frame, PosedCapture, Scene
from gsrecon.data.splits import NameList, check_eval_split, evenly_spaced, frame_name, listed_as_test, split_frames
from gsrecon.io.ply import read_ply
from gsrecon.registry import DATASET_REGISTRY

OPENGL_TO_OPENCV = np.diag([1.0, -1.0, -1.0, 1.0])  # flips the camera's y and z axes
MIN_FOCAL_SHARE = 100  # a focal length under an image's side / this (a pinhole's view of 178 degrees) is a typo
_MAX_VIEW_DEGREES = 2 * math.degrees(math.atan(MIN_FOCAL_SHARE / 2))
_INTRINSIC_KEYS = ("fl_x", "fl_y", "cx", "cy", "w", "h", "camera_angle_x", "camera_angle_y")
_POSITIVE_KEYS = (*_INTRINSIC_KEYS, "depth_unit_scale_factor")
_DISTORTION_KEYS = ("k1", "k2", "k3", "p1", "p2")
# nerfstudio's applied_transform for COLMAP conversions made before the field was written: swaps x and y, flips z.
_LEGACY_APPLIED_TRANSFORM = np.array([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, -1.0, 0.0]])


class _Entry(NamedTuple):
    """One frame as listed in a transforms file."""

    json_path: Path
    frame: dict  # the frame's own fields
    global_fields: dict  # the file's top-level fields (per-frame ones override them)
    is_test: bool | None  # the dataset's own split; None unless eval_split is "dataset"
    outside: bool  # the files it names may lie outside the capture folder (data.outside_capture)


@DATASET_REGISTRY.register("blender")  # the name it had, for configs written before
@DATASET_REGISTRY.register("transforms")
class TransformsReader:
    """``data.dataset: transforms`` (alias ``blender``): a transforms.json folder at ``data.path`` (no options of its
    own: ``data.transforms`` takes none)."""

    def read(self, data: DataPipeline.Config) -> Scene:
        layout = "a folder with transforms.json or transforms_train.json"
        return load_transforms(**folder_arguments(data, layout), outside_capture=data.outside_capture)


def load_transforms(
    path: str,
    factor: int = 1,
    eval_split: str = "every_8",
    max_images: int = 0,
    *,
    point_cloud: bool = True,
    lazy: bool = False,
    keep_fisheye: bool = False,
    outside_capture: bool = False,
) -> Scene:
    """Read a transforms.json scene folder: pinhole frames at 1/``factor`` resolution, split, and the point
    cloud its ``ply_file_path`` names (nerfstudio's exports; none otherwise).

    Args:
        path: the folder holding ``transforms_train.json`` (+ ``transforms_test.json``) or ``transforms.json``.
        factor: downscale factor (1, 2, 4 or 8).
        eval_split: ``"every_8"`` (names sorted, index % 8 == 0 is test), ``"none"`` (all train) or
            ``"dataset"`` (nerf_synthetic's train/test files, or nerfstudio's ``test_filenames`` /
            ``train_filenames``). nerf_synthetic's ``every_8`` and ``none`` use the train file's frames only,
            so that no official test image is trained on.
        max_images: if > 0, keep this many evenly spaced frames (in name order) before splitting.
        point_cloud: False leaves ``ply_file_path`` unread (the scene's points empty), e.g. to replace it.
        lazy: leave the pixels in their files (read headers only), to be decoded when needed (``data.cache: disk``).
        keep_fisheye: keep fisheye images as the lens saw them (their ``Frame.camera_model`` a fisheye
            :class:`~gsrecon.cameras.CameraModel`), instead of undistorting them.
        outside_capture: read the images, masks, depth maps and point cloud the file names also where they lie
            outside ``path`` (refused otherwise).

    Raises:
        DatasetError: missing or malformed files, files outside the folder, missing intrinsics, unsupported
            cameras, images that disagree with their camera, split lists naming unknown frames; the message names
            the file.
    """
    check_factor(factor)
    check_eval_split(eval_split)
    root = Path(path)
    entries = _read_entries(root, eval_split, outside_capture)
    if not entries:
        raise DatasetError(f"{root}: the transforms file(s) list no frames")
    names = _frame_names([str(entry.frame["file_path"]) for entry in entries])
    seen: dict[str, Path] = {}
    for entry, name in zip(entries, names):
        if name in seen:
            raise DatasetError(
                f"{entry.json_path}: frame {entry.frame['file_path']!r} duplicates an image of {seen[name]}"
            )
        seen[name] = entry.json_path
    order = sorted(range(len(entries)), key=lambda i: names[i])
    order = [order[i] for i in evenly_spaced(len(order), max_images)]
    frames = [_frame(root, entries[i], names[i], factor, lazy, keep_fisheye) for i in order]
    is_test = [bool(entries[i].is_test) for i in order] if eval_split == "dataset" else None
    train, test = split_frames(frames, eval_split, is_test)
    points, colors = torch.zeros(0, 3), torch.zeros(0, 3)
    if point_cloud:
        points, colors = _point_cloud(entries[0])
    sizes = {frame.name: (frame.width, frame.height) for frame in frames if frame.camera_model.kind == "pinhole"}
    capture = PosedCapture(root, outside_capture, sizes)
    hint = "" if len(points) else f"`gsrecon data triangulate --data {path}` triangulates them from the known poses"
    return Scene(train, test, points, colors, points_hint=hint, posed_capture=capture)


def every_frame(root: Path, factor: int, max_images: int = 0, outside: bool = False) -> list[Frame]:
    """Every frame the capture in ``root`` lists (nerf_synthetic's test file left out), as training reads them at
    ``factor`` (pinhole, undistorted), ``max_images`` of them if > 0 (``outside``: as ``outside_capture`` of
    :func:`load_transforms`): what triangulation starts from."""
    return load_transforms(str(root), factor, "none", max_images, point_cloud=False, outside_capture=outside).train


def _point_cloud(entry: _Entry) -> tuple[Tensor, Tensor]:
    """The points ``[P, 3]`` and colours ``[P, 3]`` in [0, 1] of the PLY that the ``ply_file_path`` of ``entry``'s
    file names (relative to its folder), in the frames' world coordinates; without one, those of a
    ``colmap/sparse/0/`` model beside it moved by ``applied_transform``; empty without either."""
    json_path, fields = entry.json_path, entry.global_fields
    applied = _applied_transform(json_path, fields)  # [3, 4]
    if "ply_file_path" not in fields:
        return _colmap_points(json_path.parent / "colmap" / "sparse" / "0", applied)
    value = fields["ply_file_path"]
    if not isinstance(value, str) or not value:
        raise DatasetError(f"{json_path}: 'ply_file_path' must be a file name, got {value!r}")
    path = capture_file(json_path.parent, value, "point cloud", f"{json_path}: 'ply_file_path'", entry.outside)
    try:
        vertex = read_ply(path)["vertex"]
        points = np.stack([np.asarray(vertex[axis], np.float32) for axis in "xyz"], axis=-1)  # [P, 3]
    except (OSError, ValueError) as err:
        raise DatasetError(f"{json_path}: 'ply_file_path' {value!r}: {err}") from err
    names = vertex.data.dtype.names or ()
    if all(c in names for c in ("red", "green", "blue")):
        colors = np.stack([np.asarray(vertex[c], np.float32) for c in ("red", "green", "blue")], axis=-1) / 255.0
    else:
        colors = np.full_like(points, 0.5)  # grey where the cloud has no colours
    if not np.isfinite(points).all():
        raise DatasetError(f"{json_path}: 'ply_file_path' {value!r}: the points are not all finite")
    return torch.from_numpy(points), torch.from_numpy(colors.astype(np.float32))


def _applied_transform(json_path: Path, fields: dict[str, Any]) -> np.ndarray:
    """nerfstudio's ``applied_transform`` [3, 4] (from COLMAP's world to the poses'), or its former fixed value."""
    if "applied_transform" not in fields:
        return _LEGACY_APPLIED_TRANSFORM
    value = fields["applied_transform"]
    try:
        transform = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        transform = np.zeros(0)
    if transform.shape != (3, 4) or not np.isfinite(transform).all():
        raise DatasetError(f"{json_path}: 'applied_transform' must be a 3x4 matrix of finite numbers, got {value!r}")
    return transform


def _colmap_points(sparse_dir: Path, applied: np.ndarray) -> tuple[Tensor, Tensor]:
    """The points [P, 3] moved by ``applied`` [3, 4] and colours [P, 3] in [0, 1] of the COLMAP model in
    ``sparse_dir``; empty where there is none."""
    if not any((sparse_dir / f"points3D{ext}").is_file() for ext in (".bin", ".txt")):
        return torch.zeros(0, 3), torch.zeros(0, 3)
    points = read_model(sparse_dir).points
    xyz = points.xyz @ applied[:, :3].T + applied[:, 3]  # [P, 3]
    return torch.from_numpy(xyz.astype(np.float32)), torch.from_numpy(points.rgb.astype(np.float32) / 255.0)


def _read_entries(root: Path, eval_split: str, outside: bool) -> list[_Entry]:
    """The frames to load: nerf_synthetic's train file (plus its test file for eval_split "dataset"), or
    the one ``transforms.json``."""
    main_json, test_json = transforms_file(root), root / "transforms_test.json"
    dataset = eval_split == "dataset"
    if main_json.name == "transforms_train.json":
        files = [(main_json, False)]
        if dataset:
            if not test_json.is_file():
                raise DatasetError(f"{test_json}: missing, and eval_split 'dataset' needs it")
            files.append((test_json, True))
        entries = []
        for json_path, is_test in files:
            content = read_transforms(json_path)
            entries += [
                _Entry(json_path, frame, content, is_test if dataset else None, outside) for frame in content["frames"]
            ]
        return entries
    content = read_transforms(main_json)
    flags = _listed_test(main_json, content) if dataset else [None] * len(content["frames"])
    return [_Entry(main_json, frame, content, flag, outside) for frame, flag in zip(content["frames"], flags)]


def _listed_test(json_path: Path, content: dict) -> list[bool]:
    """Per frame, whether nerfstudio's ``test_filenames`` (or, without it, ``train_filenames``) make it a test one."""
    lists = {}
    for kind in ("test", "train"):
        key = f"{kind}_filenames"
        if key in content:
            entries = content[key]
            if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
                raise DatasetError(f"{json_path}: '{key}' must be a list of image file paths")
            lists[kind] = NameList(f"{json_path} '{key}'", tuple(entries))
    if not lists:
        raise DatasetError(
            f"{json_path}: eval_split 'dataset' needs 'test_filenames' or 'train_filenames' in this file; "
            "use eval_split 'every_8' or 'none' otherwise (configs/phone.yaml is made for such captures)"
        )
    file_paths = [str(frame["file_path"]) for frame in content["frames"]]
    return listed_as_test(file_paths, lists.get("test"), lists.get("train"))


def _frame_names(file_paths: list[str]) -> list[str]:
    """Frame names from file paths, without a leading folder that all of them share."""
    parts = [[p for p in PurePosixPath(fp).parts if p not in (".", "/")] for fp in file_paths]
    if parts and all(len(p) > 1 for p in parts) and len({p[0] for p in parts}) == 1:
        parts = [p[1:] for p in parts]
    return [frame_name("/".join(p)) for p in parts]


def _number(fields: dict, key: str, json_path: Path, where: str) -> float | None:
    """The finite number ``fields[key]`` (> 0 for sizes, focal lengths, principal point, angles and the depth
    unit), or None."""
    value = fields.get(key)
    if value is None:
        return None
    number = checked_number(f"{json_path}: {where}", key, value, positive=key in _POSITIVE_KEYS)
    if key.startswith("camera_angle") and number >= math.pi:
        raise DatasetError(f"{json_path}: {where}: '{key}' must be below pi (180 degrees, in radians), got {value!r}")
    return number


def _frame(root: Path, entry: _Entry, name: str, factor: int, lazy: bool, keep_fisheye: bool) -> Frame:
    json_path, frame = entry.json_path, entry.frame
    where = f"frame {str(frame['file_path'])!r}"
    fields = {k: v for k, v in entry.global_fields.items() if k != "frames"} | frame  # per-frame values win
    path = image_path(root, json_path, str(frame["file_path"]), entry.outside)
    size, K, dist = _camera(fields, path, json_path, where)
    prepared = camera_image_file(
        path,
        size,
        K,
        dist,
        factor,
        _prescaled_path(root, path, factor),
        camera=f"{where} of {json_path}",
        keep_fisheye=keep_fisheye,
    )
    viewmat = _viewmat(frame["transform_matrix"], json_path, where)
    mask = _mask(root, entry, path, prepared.file, factor, where, lazy)
    depth = _depth(root, entry, fields, path, prepared.file, where)
    return camera_frame(name, viewmat, prepared, mask, lazy, depth)


def _depth(root: Path, entry: _Entry, fields: dict, path: Path, image_file: ImageFile, where: str) -> DepthFile | None:
    """The frame's depth map (its ``depth_file_path``, else its file in ``depths/`` beside ``images/``) in the
    ``depth_unit_scale_factor`` of its fields, None without one."""
    depth_path = _frame_file(root, entry, path, "depth_file_path", "depth map", DEPTHS_FOLDER, find_depth, where)
    if depth_path is None:
        return None
    unit = _number(fields, "depth_unit_scale_factor", entry.json_path, where)
    return depth_file(depth_path, image_file.transform, MILLIMETRES if unit is None else unit)


def _mask(
    root: Path, entry: _Entry, path: Path, image_file: ImageFile, factor: int, where: str, lazy: bool
) -> Tensor | MaskFile | None:
    """The frame's mask (its ``mask_path``, else its file in ``masks/`` beside ``images/``), None without one."""
    mask_path = _frame_file(root, entry, path, "mask_path", "mask", MASKS_FOLDER, find_mask, where)
    if mask_path is None:
        return None
    prescaled = _prescaled_path(root, mask_path, factor, MASKS_FOLDER) if factor > 1 else None
    mask = mask_file(mask_path, prescaled, image_file, path)
    return mask if lazy else torch.from_numpy(mask.load())


def _frame_file(
    root: Path,
    entry: _Entry,
    path: Path,
    key: str,
    what: str,
    folder: str,
    find: Callable[[Path, PurePosixPath], Path | None],
    where: str,
) -> Path | None:
    """The file of a frame's ``key`` (``mask_path``, ``depth_file_path``), else its file in ``folder`` beside
    ``images/`` (``find(folder, image path relative to images/)``); None without one. A named file that is missing
    is a DatasetError."""
    if key not in entry.frame:
        relative = _images_relative(root, path)
        return None if relative is None else find(root / folder, relative)
    value = entry.frame[key]
    if not isinstance(value, str) or not value:
        raise DatasetError(f"{entry.json_path}: {where}: '{key}' must be a file name, got {value!r}")
    named = capture_file(root, value, what, f"{entry.json_path}: {where}", entry.outside)
    if not named.is_file():
        raise DatasetError(f"{named}: {what} file is missing (the '{key}' of {where} in {entry.json_path})")
    return named


def _images_relative(root: Path, path: Path, folder: str = "images") -> PurePosixPath | None:
    """``path`` relative to ``<root>/<folder>/``, or None where it lies elsewhere."""
    try:
        relative = path.relative_to(root).parts
    except ValueError:
        return None
    if len(relative) < 2 or relative[0] != folder:
        return None
    return PurePosixPath(*relative[1:])


def _camera(fields: dict, path: Path, json_path: Path, where: str) -> tuple[tuple[int, int], np.ndarray, Distortion]:
    """((width, height), K [3, 3], distortion) of a frame from its merged global + per-frame fields."""
    model = fields.get("camera_model", "OPENCV")
    if model not in SUPPORTED_MODELS:
        raise DatasetError(
            f"{json_path}: {where} uses the {model} camera model, which gsrecon cannot undistort "
            f"(supported: {', '.join(SUPPORTED_MODELS)} with k1 k2 k3 k4 p1 p2)"
        )
    fisheye = model.endswith("FISHEYE") or bool(fields.get("is_fisheye"))
    values = {k: _number(fields, k, json_path, where) for k in _INTRINSIC_KEYS + _DISTORTION_KEYS}
    if values["w"] is not None and values["h"] is not None:
        size = (int(values["w"]), int(values["h"]))
    else:
        size = read_image_size(path)
    fx = values["fl_x"]
    if fx is None and values["camera_angle_x"] is not None:
        fx = fov_to_focal(values["camera_angle_x"], size[0])
    if fx is None:
        raise DatasetError(
            f"{json_path}: {where} has no intrinsics: need 'fl_x' or 'camera_angle_x' (globally or per frame)"
        )
    fy = values["fl_y"]
    if fy is None and values["camera_angle_y"] is not None:
        fy = fov_to_focal(values["camera_angle_y"], size[1])
    fy = fx if fy is None else fy
    for key, focal, side in (("fl_x", fx, size[0]), ("fl_y", fy, size[1])):
        if focal < side / MIN_FOCAL_SHARE:
            raise DatasetError(
                f"{json_path}: {where}: '{key}' {focal:g} is no focal length for an image {side} pixels across (at "
                f"least {side / MIN_FOCAL_SHARE:g} pixels: a view under {_MAX_VIEW_DEGREES:.0f} degrees)"
            )
    cx = size[0] / 2 if values["cx"] is None else values["cx"]
    cy = size[1] / 2 if values["cy"] is None else values["cy"]
    dist = Distortion(
        **{k: values[k] or 0.0 for k in _DISTORTION_KEYS},
        k4=_number(fields, "k4", json_path, where) or 0.0,
        fisheye=fisheye,
    )
    return size, intrinsics_matrix(fx, fy, cx, cy), dist


def _prescaled_path(root: Path, path: Path, factor: int, folder: str = "images") -> Path | None:
    """``<root>/<folder>_<factor>/...`` for a file under ``<root>/<folder>/``, else None."""
    relative = _images_relative(root, path, folder)
    return None if relative is None else root / f"{folder}_{factor}" / relative


def _viewmat(transform_matrix: Any, json_path: Path, where: str) -> np.ndarray:
    """World-to-camera OpenCV [4, 4] of an OpenGL camera-to-world ``transform_matrix``."""
    try:
        c2w = np.array(transform_matrix, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise DatasetError(f"{json_path}: {where}: 'transform_matrix' is not a 4x4 matrix of numbers") from err
    if c2w.shape == (3, 4):
        c2w = np.vstack([c2w, [0.0, 0.0, 0.0, 1.0]])
    usable = (
        c2w.shape == (4, 4)
        and np.isfinite(c2w).all()
        and abs(np.linalg.det(c2w[:3, :3])) >= 1e-12
        and np.array_equal(c2w[3], [0.0, 0.0, 0.0, 1.0])
    )
    if not usable:
        raise DatasetError(
            f"{json_path}: {where}: 'transform_matrix' must be a finite, invertible 4x4 (or 3x4) matrix with last "
            f"row [0, 0, 0, 1], got {c2w.round(4).tolist()}"
        )
    return np.linalg.inv(c2w @ OPENGL_TO_OPENCV)
