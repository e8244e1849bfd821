"""Per-image depth maps from the capture (a phone's LiDAR through Record3D or Polycam, or maps made offline).

A depth map holds, per pixel, the depth along the camera's optical axis (z, as the renderer's depth) of what the
photo shows there; 0 (or a value that is not a finite positive number) marks a pixel without depth. Two formats:

* a 16-bit greyscale PNG in millimetres: the stored integers times ``depth_unit_scale_factor`` (nerfstudio's field,
  default 0.001) give metres;
* a ``.npy`` array [H, W] (or [H, W, 1]) of depths in metres.

A map may be of another resolution than its photo (LiDAR maps are 256x192 beside 1920x1440 photos) but not of
another aspect ratio. It is prepared like its image: resampled to the image's size at ``data.factor`` by taking
each pixel's nearest depth sample (never averaging across a depth edge), and undistorted the same way where
the image is. Depth maps are found in ``depths/`` beside ``images/`` under the image's path with a ``.png`` or
``.npy`` extension (``images/a/b.jpg`` -> ``depths/a/b.png``, or ``depths/a/b.jpg.npy``), or where a
transforms.json frame's ``depth_file_path`` says.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
from PIL import Image

from gsrecon.data.errors import DatasetError
from gsrecon.data.formats.images import ImageTransform, read_image_size
from gsrecon.data.formats.lens import undistortion_sources

DEPTHS_FOLDER = "depths"
DEPTH_EXTENSIONS = (".png", ".npy")
MILLIMETRES = 0.001  # nerfstudio's default depth_unit_scale_factor: PNG values in millimetres
MAX_DEPTH = 1e5  # metres: a depth map holding more (100 km) has the wrong unit
_PNG_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")  # PIL modes of 16-bit greyscale PNGs
_ASPECT_TOLERANCE = 0.01  # how far a map's height, scaled to its image's width, may differ from the image's


@dataclass(frozen=True)
class DepthFile:
    """A depth map file and the transform of its image: decoded to float32 [h, w] metres (0: no depth) when asked."""

    path: Path
    transform: ImageTransform  # its image's: the size at data.factor, and the undistortion where there is one
    unit: float = MILLIMETRES  # metres per stored integer of a PNG (``depth_unit_scale_factor``); .npy is in metres

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the prepared map: its image's."""
        return self.transform.size

    def load(self) -> np.ndarray:
        """The prepared map, float32 [h, w] in metres, 0 where there is no depth.

        Raises:
            DatasetError: the file is unreadable, not a depth map, or has no valid pixel; the message names it.
        """
        depth = read_depth(self.path, self.unit)  # [H, W]
        width, height = self.transform.size
        if self.transform.K:
            K, K_new = (np.array(values).reshape(3, 3) for values in (self.transform.K, self.transform.K_new))
            column, row = undistortion_sources(width, height, K, self.transform.dist, K_new)  # in image pixels
        else:
            column, row = np.meshgrid(np.arange(width, dtype=np.float64), np.arange(height, dtype=np.float64))
        # image pixel index -> depth pixel index: the depth sample nearest to the pixel's centre
        column = np.floor((column + 0.5) * depth.shape[1] / width)
        row = np.floor((row + 0.5) * depth.shape[0] / height)
        inside = (column >= 0) & (column < depth.shape[1]) & (row >= 0) & (row < depth.shape[0])
        sampled = depth[np.where(inside, row, 0).astype(np.int64), np.where(inside, column, 0).astype(np.int64)]
        return np.where(inside, sampled, 0.0).astype(np.float32)


def read_depth(path: Path, unit: float = MILLIMETRES) -> np.ndarray:
    """The depth map in ``path`` as float32 [H, W] metres, 0 where there is none (0, negative or not finite).

    Raises:
        DatasetError: unreadable, of an unknown format, not one channel, without a single valid pixel, or with a
            depth beyond :data:`MAX_DEPTH` (a wrong unit).
    """
    suffix = path.suffix.lower()
    if suffix == ".npy":
        try:
            raw = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as err:
            raise DatasetError(f"{path}: cannot read the depth map ({err})") from err
        if raw.ndim == 3 and raw.shape[2] == 1:
            raw = raw[..., 0]
        if raw.ndim != 2 or not (np.issubdtype(raw.dtype, np.floating) or np.issubdtype(raw.dtype, np.integer)):
            raise DatasetError(
                f"{path}: a .npy depth map must be an [H, W] array of numbers (metres); got shape {list(raw.shape)} "
                f"of {raw.dtype}"
            )
        depth = raw.astype(np.float64)
    elif suffix == ".png":
        try:
            with Image.open(path) as im:
                if im.mode not in _PNG_MODES:
                    raise DatasetError(
                        f"{path}: a PNG depth map must be 16-bit greyscale (millimetres); this one is mode {im.mode}"
                    )
                depth = np.asarray(im).astype(np.float64) * unit
        except DatasetError:
            raise
        except (OSError, SyntaxError, ValueError) as err:
            raise DatasetError(f"{path}: cannot read the depth map ({err})") from err
    else:
        raise DatasetError(f"{path}: a depth map must be a 16-bit PNG (millimetres) or a .npy array (metres)")
    valid = np.isfinite(depth) & (depth > 0)
    if not valid.any():
        raise DatasetError(f"{path}: the depth map has no valid pixel (all are 0, negative or not finite)")
    farthest = float(depth[valid].max())
    if farthest > MAX_DEPTH:
        raise DatasetError(
            f"{path}: the depth map holds depths up to {farthest:.3g} m, beyond {MAX_DEPTH:.0e} m: is its unit right "
            "(.npy maps hold metres; PNG maps millimetres times depth_unit_scale_factor)? Mark pixels without depth "
            "with 0 (or NaN in a .npy)"
        )
    return np.where(valid, depth, 0.0).astype(np.float32)


def depth_map_size(path: Path) -> tuple[int, int]:
    """(width, height) of a depth map file, from its header."""
    if path.suffix.lower() != ".npy":
        return read_image_size(path)
    try:
        shape = np.load(path, mmap_mode="r", allow_pickle=False).shape  # the header read, the data mapped, not read
    except (OSError, ValueError, EOFError) as err:
        raise DatasetError(f"{path}: cannot read the depth map ({err})") from err
    if len(shape) not in (2, 3):
        raise DatasetError(f"{path}: a .npy depth map must be an [H, W] array; got shape {list(shape)}")
    return int(shape[1]), int(shape[0])


def find_depth(folder: Path, relative: PurePosixPath) -> Path | None:
    """The depth map in ``folder`` of the image at path ``relative`` (within its image folder), if there is one."""
    for extension in DEPTH_EXTENSIONS:
        for candidate in (folder / relative.with_suffix(extension), folder / f"{relative}{extension}"):
            if candidate.is_file():
                return candidate
    return None


def depth_file(path: Path, transform: ImageTransform, unit: float = MILLIMETRES) -> DepthFile:
    """The depth map at ``path`` of the image that ``transform`` prepares (``unit``: see :class:`DepthFile`).

    Raises:
        DatasetError: the map's aspect ratio differs from its image's; the message names the file and both sizes.
    """
    if path.suffix.lower() not in DEPTH_EXTENSIONS:
        raise DatasetError(f"{path}: a depth map must be a 16-bit PNG (millimetres) or a .npy array (metres)")
    (width, height), (image_width, image_height) = depth_map_size(path), transform.size
    if abs(height * image_width / width - image_height) > max(1.0, _ASPECT_TOLERANCE * image_height):
        raise DatasetError(
            f"{path}: the depth map is {width}x{height}, which is not the shape of its image ({image_width}x"
            f"{image_height}): it must be the image's size or that size scaled (e.g. a LiDAR map at 1/7.5)"
        )
    return DepthFile(path, transform, unit)
