"""Writing COLMAP sparse models (cameras, images, points3D) as .bin or .txt, for tests that build scenes.

The layout is COLMAP's, as :mod:`gsrecon.data.formats.colmap_model` reads it. The writers check the structure
only, so that files with values no scene can have (which the reader refuses) can be written.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from gsrecon.data.formats.colmap_model import (
    _POINT2D_DTYPE,
    CAMERA_MODELS,
    MODEL_NUM_PARAMS,
    ColmapCamera,
    ColmapImage,
    ColmapPoints,
    SparseModel,
)

MODEL_IDS: dict[str, int] = {name: model_id for model_id, (name, _) in CAMERA_MODELS.items()}


def write_model(model: SparseModel, sparse_dir: str | Path, ext: str = ".bin") -> None:
    """Write ``model`` as cameras/images/points3D ``ext`` (".bin" or ".txt") into ``sparse_dir``."""
    if ext not in (".bin", ".txt"):
        raise ValueError(f"ext must be '.bin' or '.txt', got {ext!r}")
    sparse_dir = Path(sparse_dir)
    sparse_dir.mkdir(parents=True, exist_ok=True)
    binary = ext == ".bin"
    (write_cameras_bin if binary else write_cameras_txt)(model.cameras, sparse_dir / f"cameras{ext}")
    (write_images_bin if binary else write_images_txt)(model.images, sparse_dir / f"images{ext}")
    (write_points3D_bin if binary else write_points3D_txt)(model.points, sparse_dir / f"points3D{ext}")


def write_cameras_bin(cameras: dict[int, ColmapCamera], path: str | Path) -> None:
    """Write a COLMAP ``cameras.bin``."""
    chunks = [struct.pack("<Q", len(cameras))]
    for cam in cameras.values():
        params = _checked_params(cam)
        chunks.append(struct.pack("<iiQQ", cam.id, MODEL_IDS[cam.model], cam.width, cam.height))
        chunks.append(params.astype("<f8").tobytes())
    Path(path).write_bytes(b"".join(chunks))


def write_images_bin(images: dict[int, ColmapImage], path: str | Path) -> None:
    """Write a COLMAP ``images.bin``."""
    chunks = [struct.pack("<Q", len(images))]
    for img in images.values():
        chunks.append(struct.pack("<I7di", img.id, *img.qvec, *img.tvec, img.camera_id))
        chunks.append(img.name.encode("utf-8") + b"\0")
        points2D = np.empty(len(img.point3D_ids), _POINT2D_DTYPE)
        points2D["x"], points2D["y"], points2D["id"] = img.xys[:, 0], img.xys[:, 1], img.point3D_ids
        chunks.append(struct.pack("<Q", len(points2D)) + points2D.tobytes())
    Path(path).write_bytes(b"".join(chunks))


def write_points3D_bin(points: ColmapPoints, path: str | Path) -> None:
    """Write a COLMAP ``points3D.bin``."""
    chunks = [struct.pack("<Q", len(points))]
    for i in range(len(points)):
        track = np.asarray(points.tracks[i], np.int64).reshape(-1, 2)
        chunks.append(
            struct.pack("<Q3d3BdQ", points.ids[i], *points.xyz[i], *points.rgb[i], points.errors[i], len(track))
        )
        chunks.append(track.astype("<i4").tobytes())
    Path(path).write_bytes(b"".join(chunks))


def write_cameras_txt(cameras: dict[int, ColmapCamera], path: str | Path) -> None:
    """Write a COLMAP ``cameras.txt``."""
    lines = ["# Camera list with one line of data per camera:", "#   CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]"]
    for cam in cameras.values():
        params = _checked_params(cam)
        lines.append(" ".join([str(cam.id), cam.model, str(cam.width), str(cam.height), *map(repr, params.tolist())]))
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_images_txt(images: dict[int, ColmapImage], path: str | Path) -> None:
    """Write a COLMAP ``images.txt``."""
    lines = [
        "# Image list with two lines of data per image:",
        "#   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME",
        "#   POINTS2D[] as (X, Y, POINT3D_ID)",
    ]
    for img in images.values():
        pose = [*np.asarray(img.qvec).tolist(), *np.asarray(img.tvec).tolist()]
        lines.append(" ".join([str(img.id), *map(repr, pose), str(img.camera_id), img.name]))
        lines.append(" ".join(f"{x!r} {y!r} {pid}" for (x, y), pid in zip(img.xys.tolist(), img.point3D_ids.tolist())))
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_points3D_txt(points: ColmapPoints, path: str | Path) -> None:
    """Write a COLMAP ``points3D.txt``."""
    lines = [
        "# 3D point list with one line of data per point:",
        "#   POINT3D_ID, X, Y, Z, R, G, B, ERROR, TRACK[] as (IMAGE_ID, POINT2D_IDX)",
    ]
    for i in range(len(points)):
        track = np.asarray(points.tracks[i], np.int64).reshape(-1).tolist()
        fields = [str(points.ids[i]), *map(repr, points.xyz[i].tolist()), *map(str, points.rgb[i].tolist())]
        lines.append(" ".join([*fields, repr(float(points.errors[i])), *map(str, track)]))
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def _checked_params(cam: ColmapCamera) -> np.ndarray:
    if cam.model not in MODEL_NUM_PARAMS:
        raise ValueError(f"camera {cam.id}: unknown camera model {cam.model!r}")
    params = np.asarray(cam.params, np.float64).reshape(-1)
    if len(params) != MODEL_NUM_PARAMS[cam.model]:
        raise ValueError(f"camera {cam.id} ({cam.model}) needs {MODEL_NUM_PARAMS[cam.model]} params, got {len(params)}")
    return params
