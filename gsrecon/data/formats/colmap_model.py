"""COLMAP sparse models (cameras, images, points3D) in binary (.bin) and text (.txt): reading.

The layout follows COLMAP's documented output format. Poses are COLMAP's: ``qvec`` (w, x, y, z) and
``tvec`` map world to camera in the OpenCV convention. Malformed files raise :class:`DatasetError`
naming the file and what is wrong, and so do values no scene can have: camera parameters that are not
finite, focal lengths or principal points <= 0, image names that leave the images folder, points at
non-finite positions.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import numpy as np
import torch

from gsrecon.data.capture_files import leaves
from gsrecon.data.errors import DatasetError, checked_number
from gsrecon.geometry import quat_to_rotmat

_F, _FXY = ("f", "cx", "cy"), ("fx", "fy", "cx", "cy")
# COLMAP camera model id -> (name, parameter names in COLMAP's order).
CAMERA_MODELS: dict[int, tuple[str, tuple[str, ...]]] = {
    0: ("SIMPLE_PINHOLE", _F),
    1: ("PINHOLE", _FXY),
    2: ("SIMPLE_RADIAL", (*_F, "k")),
    3: ("RADIAL", (*_F, "k1", "k2")),
    4: ("OPENCV", (*_FXY, "k1", "k2", "p1", "p2")),
    5: ("OPENCV_FISHEYE", (*_FXY, "k1", "k2", "k3", "k4")),
    6: ("FULL_OPENCV", (*_FXY, "k1", "k2", "p1", "p2", "k3", "k4", "k5", "k6")),
    7: ("FOV", (*_FXY, "omega")),
    8: ("SIMPLE_RADIAL_FISHEYE", (*_F, "k")),
    9: ("RADIAL_FISHEYE", (*_F, "k1", "k2")),
    10: ("THIN_PRISM_FISHEYE", (*_FXY, "k1", "k2", "p1", "p2", "k3", "k4", "sx1", "sy1")),
    11: ("RAD_TAN_THIN_PRISM_FISHEYE", (*_FXY, *(f"k{i}" for i in range(6)), "p0", "p1", "s0", "s1", "s2", "s3")),
    12: ("SIMPLE_DIVISION", (*_F, "k")),
    13: ("DIVISION", (*_FXY, "k")),
    14: ("SIMPLE_FISHEYE", _F),
    15: ("FISHEYE", _FXY),
    16: ("EUCM", (*_FXY, "alpha", "beta")),
    17: ("EQUIRECTANGULAR", ("w", "h")),
}
MODEL_PARAM_NAMES: dict[str, tuple[str, ...]] = dict(CAMERA_MODELS.values())
MODEL_NUM_PARAMS: dict[str, int] = {name: len(names) for name, names in MODEL_PARAM_NAMES.items()}
_POSITIVE_PARAMS = frozenset(_FXY + _F)  # focal lengths and principal point, in pixels

_POINT2D_DTYPE = np.dtype([("x", "<f8"), ("y", "<f8"), ("id", "<i8")])  # one images.bin keypoint
_POINT3D_MIN_BYTES = struct.calcsize("<Q3d3BdQ")  # one points3D.bin point with an empty track


@dataclass
class ColmapCamera:
    """One COLMAP camera (intrinsics shared by the images that reference it)."""

    id: int
    model: str  # e.g. "PINHOLE", "OPENCV"
    width: int
    height: int
    params: np.ndarray  # [P] float64, in the order COLMAP defines for `model`


@dataclass
class ColmapImage:
    """One registered image: pose, camera and 2D keypoints."""

    id: int
    qvec: np.ndarray  # [4] float64, world-to-camera rotation quaternion (w, x, y, z)
    tvec: np.ndarray  # [3] float64, world-to-camera translation
    camera_id: int
    name: str  # path relative to the images folder
    xys: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))  # [K, 2] float64 pixel coordinates
    point3D_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [K] int64, -1 if none

    def viewmat(self) -> np.ndarray:
        """World-to-camera 4x4 matrix (OpenCV), float64."""
        mat = np.eye(4)
        mat[:3, :3] = quat_to_rotmat(torch.as_tensor(self.qvec, dtype=torch.float64)).numpy()
        mat[:3, 3] = self.tvec
        return mat


@dataclass
class ColmapPoints:
    """The sparse point cloud, as parallel arrays."""

    ids: np.ndarray  # [P] int64
    xyz: np.ndarray  # [P, 3] float64
    rgb: np.ndarray  # [P, 3] uint8
    errors: np.ndarray  # [P] float64, mean reprojection error
    tracks: list[np.ndarray]  # P arrays [T, 2] int64 of (image_id, point2D_idx)

    @staticmethod
    def empty() -> ColmapPoints:
        return ColmapPoints(np.zeros(0, np.int64), np.zeros((0, 3)), np.zeros((0, 3), np.uint8), np.zeros(0), [])

    def __len__(self) -> int:
        return int(self.ids.shape[0])


@dataclass
class SparseModel:
    """A COLMAP sparse reconstruction: cameras and images keyed by id, and the points."""

    cameras: dict[int, ColmapCamera]
    images: dict[int, ColmapImage]
    points: ColmapPoints


def find_sparse_dir(scene_dir: str | Path) -> Path:
    """The folder holding the model: ``sparse/0/`` if it has cameras.bin/.txt, else ``sparse/``."""
    scene_dir = Path(scene_dir)
    for candidate in (scene_dir / "sparse" / "0", scene_dir / "sparse"):
        if any((candidate / f"cameras{ext}").is_file() for ext in (".bin", ".txt")):
            return candidate
    raise DatasetError(
        f"{scene_dir}: no COLMAP model found (expected sparse/0/ or sparse/ holding "
        "cameras, images and points3D as .bin or .txt)"
    )


def read_model(sparse_dir: str | Path) -> SparseModel:
    """Read cameras, images and points3D from ``sparse_dir``, binary if present, else text."""
    sparse_dir = Path(sparse_dir)
    for ext, readers in ((".bin", _BIN_READERS), (".txt", _TXT_READERS)):
        if (sparse_dir / f"cameras{ext}").is_file():
            paths = [sparse_dir / f"{stem}{ext}" for stem in ("cameras", "images", "points3D")]
            for path in paths:
                if not path.is_file():
                    raise DatasetError(f"{path}: missing (the COLMAP model in {sparse_dir} is incomplete)")
            cameras, images, points = (read(path) for read, path in zip(readers, paths))
            return SparseModel(cameras, images, points)
    raise DatasetError(f"{sparse_dir}: no cameras.bin or cameras.txt")


# ---------------------------------------------------------------------------------------------- binary


class _BinaryReader:
    """Little-endian reads from a whole file with bounds checks that raise DatasetError."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = path.read_bytes()
        self.pos = 0

    def _need(self, size: int, what: str) -> None:
        if self.pos + size > len(self.data):
            raise DatasetError(
                f"{self.path}: truncated or corrupt: needs {size} more bytes at offset {self.pos} "
                f"for {what}, but the file has {len(self.data)} bytes"
            )

    def unpack(self, fmt: str, what: str) -> tuple:
        size = struct.calcsize("<" + fmt)
        self._need(size, what)
        values = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += size
        return values

    def array(self, dtype: np.dtype | str, count: int, what: str) -> np.ndarray:
        dtype = np.dtype(dtype)
        self._need(dtype.itemsize * count, what)
        values = np.frombuffer(self.data, dtype, count, self.pos).copy()
        self.pos += dtype.itemsize * count
        return values

    def cstring(self, what: str) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise DatasetError(f"{self.path}: truncated or corrupt: unterminated {what} at offset {self.pos}")
        raw, self.pos = self.data[self.pos : end], end + 1
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise DatasetError(f"{self.path}: corrupt: {what} at offset {end - len(raw)} is not UTF-8") from err

    def finish(self) -> None:
        if self.pos != len(self.data):
            raise DatasetError(
                f"{self.path}: corrupt: {len(self.data) - self.pos} unexpected trailing bytes after offset "
                f"{self.pos} (the record count in the header does not match the content)"
            )


def read_cameras_bin(path: str | Path) -> dict[int, ColmapCamera]:
    """Read a COLMAP ``cameras.bin``."""
    reader = _BinaryReader(Path(path))
    (count,) = reader.unpack("Q", "the number of cameras")
    cameras = {}
    for i in range(count):
        camera_id, model_id, width, height = reader.unpack("iiQQ", f"camera #{i}")
        if model_id not in CAMERA_MODELS:
            raise DatasetError(f"{path}: camera {camera_id} has unknown camera model id {model_id}")
        model, names = CAMERA_MODELS[model_id]
        params = reader.array("<f8", len(names), f"the parameters of camera {camera_id}")
        cameras[camera_id] = _checked_camera(path, ColmapCamera(camera_id, model, width, height, params))
    reader.finish()
    return cameras


def read_images_bin(path: str | Path) -> dict[int, ColmapImage]:
    """Read a COLMAP ``images.bin``."""
    reader = _BinaryReader(Path(path))
    (count,) = reader.unpack("Q", "the number of images")
    images = {}
    for i in range(count):
        image_id, *pose, camera_id = reader.unpack("I7di", f"image #{i}")
        name = _checked_name(path, image_id, reader.cstring(f"the name of image {image_id}"))
        (num_points2D,) = reader.unpack("Q", f"the number of 2D points of image {image_id}")
        points2D = reader.array(_POINT2D_DTYPE, num_points2D, f"the 2D points of image {image_id}")
        xys = np.stack([points2D["x"], points2D["y"]], axis=-1)  # [K, 2]
        images[image_id] = ColmapImage(
            image_id, np.array(pose[:4]), np.array(pose[4:]), camera_id, name, xys, points2D["id"].copy()
        )
    reader.finish()
    return images


def read_points3D_bin(path: str | Path) -> ColmapPoints:
    """Read a COLMAP ``points3D.bin``."""
    reader = _BinaryReader(Path(path))
    (count,) = reader.unpack("Q", "the number of points")
    if count * _POINT3D_MIN_BYTES > len(reader.data) - reader.pos:
        raise DatasetError(
            f"{path}: truncated or corrupt: the header claims {count} points in {len(reader.data)} bytes"
        )
    ids, errors = np.empty(count, np.int64), np.empty(count)
    xyz, rgb = np.empty((count, 3)), np.empty((count, 3), np.uint8)
    tracks = []
    for i in range(count):
        fields = reader.unpack("Q3d3BdQ", f"point #{i}")
        ids[i], xyz[i], rgb[i], errors[i] = fields[0], fields[1:4], fields[4:7], fields[7]
        track = reader.array("<i4", 2 * fields[8], f"the track of point {ids[i]}")
        tracks.append(track.reshape(-1, 2).astype(np.int64))
    reader.finish()
    return _checked_points(path, ColmapPoints(ids, xyz, rgb, errors, tracks))


# ------------------------------------------------------------------------------------------------ text


def _data_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the non-comment lines of a text file, blank lines kept."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DatasetError(f"{path}: not a UTF-8 text file") from err
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if not line.startswith("#")]


def _parse_error(path: Path, line_no: int, what: str, line: str) -> DatasetError:
    return DatasetError(f"{path}:{line_no}: cannot parse {what} from {line[:120]!r}")


def read_cameras_txt(path: str | Path) -> dict[int, ColmapCamera]:
    """Read a COLMAP ``cameras.txt`` (CAMERA_ID MODEL WIDTH HEIGHT PARAMS[])."""
    path = Path(path)
    cameras = {}
    for line_no, line in _data_lines(path):
        if not line:
            continue
        tokens = line.split()
        try:
            camera_id, model, width, height = int(tokens[0]), tokens[1], int(tokens[2]), int(tokens[3])
            params = np.array([float(t) for t in tokens[4:]])
        except (IndexError, ValueError) as err:
            raise _parse_error(path, line_no, "a camera", line) from err
        if model not in MODEL_NUM_PARAMS:
            raise DatasetError(f"{path}:{line_no}: camera {camera_id} has unknown camera model {model!r}")
        if len(params) != MODEL_NUM_PARAMS[model]:
            raise DatasetError(
                f"{path}:{line_no}: camera {camera_id} ({model}) needs {MODEL_NUM_PARAMS[model]} parameters, "
                f"got {len(params)}"
            )
        cameras[camera_id] = _checked_camera(path, ColmapCamera(camera_id, model, width, height, params))
    return cameras


def read_images_txt(path: str | Path) -> dict[int, ColmapImage]:
    """Read a COLMAP ``images.txt``: per image, a pose line and a (possibly empty) 2D points line."""
    path = Path(path)
    lines = _data_lines(path)
    while lines and not lines[-1][1]:  # trailing blank lines, except one per image without points
        lines.pop()
    if len(lines) % 2:
        lines.append((lines[-1][0] + 1, ""))  # the last image's empty points line was cut off
    images = {}
    for (line_no, header), (points_no, points_line) in zip(lines[::2], lines[1::2]):
        tokens = header.split()
        try:
            if len(tokens) < 10:
                raise ValueError("too few fields")
            image_id, camera_id = int(tokens[0]), int(tokens[8])
            pose = np.array([float(t) for t in tokens[1:8]])  # [7] QW QX QY QZ TX TY TZ
        except ValueError as err:
            raise _parse_error(
                path, line_no, "an image (IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME)", header
            ) from err
        name = _checked_name(path, image_id, " ".join(tokens[9:]))
        try:
            values = np.array([float(t) for t in points_line.split()]).reshape(-1, 3)  # [K, 3]
        except ValueError as err:
            raise _parse_error(
                path, points_no, f"the 2D points (X Y POINT3D_ID) of image {image_id}", points_line
            ) from err
        images[image_id] = ColmapImage(
            image_id, pose[:4], pose[4:], camera_id, name, values[:, :2], values[:, 2].astype(np.int64)
        )
    return images


def read_points3D_txt(path: str | Path) -> ColmapPoints:
    """Read a COLMAP ``points3D.txt`` (POINT3D_ID X Y Z R G B ERROR TRACK[])."""
    path = Path(path)
    ids, xyz, rgb, errors, tracks = [], [], [], [], []
    for line_no, line in _data_lines(path):
        if not line:
            continue
        tokens = line.split()
        try:
            if len(tokens) < 8 or (len(tokens) - 8) % 2:
                raise ValueError("wrong number of fields")
            ids.append(int(tokens[0]))
            xyz.append([float(t) for t in tokens[1:4]])
            rgb.append([int(t) for t in tokens[4:7]])
            errors.append(float(tokens[7]))
            tracks.append(np.array([int(t) for t in tokens[8:]], np.int64).reshape(-1, 2))
        except ValueError as err:
            raise _parse_error(path, line_no, "a point (POINT3D_ID X Y Z R G B ERROR TRACK[])", line) from err
    if not ids:
        return ColmapPoints.empty()
    rgb_array = np.array(rgb)
    if rgb_array.min() < 0 or rgb_array.max() > 255:
        raise DatasetError(f"{path}: point colours must be integers in [0, 255]")
    points = ColmapPoints(np.array(ids, np.int64), np.array(xyz), rgb_array.astype(np.uint8), np.array(errors), tracks)
    return _checked_points(path, points)


def _checked_camera(path: str | Path, camera: ColmapCamera) -> ColmapCamera:
    """``camera`` if its parameters are finite and its focal lengths and principal point > 0, else DatasetError."""
    for name, value in zip(MODEL_PARAM_NAMES[camera.model], camera.params.tolist()):
        checked_number(f"{path}: camera {camera.id} ({camera.model})", name, value, positive=name in _POSITIVE_PARAMS)
    return camera


def _checked_name(path: str | Path, image_id: int, name: str) -> str:
    """``name`` if it is a path that stays inside the images folder (:func:`~gsrecon.data.capture_files.leaves`:
    the rule of every file a capture names; a COLMAP model's names are always relative to it), else DatasetError."""
    if not PurePosixPath(name).parts or leaves(Path("images"), name):
        raise DatasetError(
            f"{path}: image {image_id} has the name {name!r}; image names must be paths inside the scene's images/ "
            "folder (relative, not leading out of it with '..')"
        )
    return name


def _checked_points(path: str | Path, points: ColmapPoints) -> ColmapPoints:
    """``points`` if every position is finite, else DatasetError naming the first bad point."""
    bad = ~np.isfinite(points.xyz).all(axis=1)
    if bad.any():
        i = int(np.argmax(bad))
        raise DatasetError(
            f"{path}: point {points.ids[i]} has a non-finite position {points.xyz[i].tolist()} "
            f"({int(bad.sum())} of {len(points)} points); rerun the reconstruction"
        )
    return points


_BIN_READERS = (read_cameras_bin, read_images_bin, read_points3D_bin)
_TXT_READERS = (read_cameras_txt, read_images_txt, read_points3D_txt)
