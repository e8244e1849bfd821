"""Image files: reading, downscaling by a factor, undistortion, and the on-disk cache of the results.

Derived images (resized and/or undistorted) are computed once and kept as PNG under
``cache_dir("scenes", "images")``, keyed by the source file's path, modification time and size and by
the transform, so editing or replacing a source image invalidates its cached copies.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from gsrecon.cache import cache_dir
from gsrecon.data.errors import DatasetError
from gsrecon.data.undistort import Distortion, undistort_image, undistorted_intrinsics

FACTORS = (1, 2, 4, 8)


@dataclass(frozen=True)
class ImageTransform:
    """What to do to a source image: resize to ``size`` (width, height), then undistort from K to K_new."""

    size: tuple[int, int]
    K: tuple[float, ...] = ()  # 9 values, row-major; empty when there is nothing to undistort
    K_new: tuple[float, ...] = ()
    dist: Distortion = field(default_factory=Distortion)


def read_image(path: str | Path) -> np.ndarray:
    """Pixels of an image file as uint8 [H, W, 3], or [H, W, 4] when it has an alpha channel."""
    try:
        with Image.open(path) as im:
            has_alpha = im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info
            return np.array(im.convert("RGBA" if has_alpha else "RGB"))
    except FileNotFoundError as err:
        raise DatasetError(f"{path}: image file is missing") from err
    except (UnidentifiedImageError, OSError, SyntaxError) as err:
        raise DatasetError(f"{path}: cannot read the image ({err})") from err


def read_image_size(path: str | Path) -> tuple[int, int]:
    """(width, height) of an image file, from its header."""
    try:
        with Image.open(path) as im:
            return im.size
    except FileNotFoundError as err:
        raise DatasetError(f"{path}: image file is missing") from err
    except (UnidentifiedImageError, OSError, SyntaxError) as err:
        raise DatasetError(f"{path}: cannot read the image ({err})") from err


def resize_image(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resample uint8 [H, W, C] to (width, height) = ``size`` with an antialiasing filter (alpha-aware)."""
    if (image.shape[1], image.shape[0]) == tuple(size):
        return image
    return np.array(Image.fromarray(image).resize(size, Image.Resampling.LANCZOS))


def downscaled_size(width: int, height: int, factor: int) -> tuple[int, int]:
    """(width, height) of an image downscaled by ``factor``, rounded as the 3DGS scripts do."""
    return max(1, round(width / factor)), max(1, round(height / factor))


def check_factor(factor: int) -> None:
    """Raise ValueError unless ``factor`` is one of :data:`FACTORS`."""
    if factor not in FACTORS:
        raise ValueError(f"factor must be one of {FACTORS}, got {factor!r}")


def load_camera_image(
    path: Path,
    camera_size: tuple[int, int],
    K: np.ndarray,
    dist: Distortion,
    factor: int,
    prescaled_path: Path | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A camera's image at 1/``factor`` resolution, undistorted to a pinhole: (image [h, w, C] uint8, K [3, 3]).

    ``path`` is the full-resolution image of a ``camera_size`` (width, height) camera with intrinsics ``K``
    and distortion ``dist``. ``prescaled_path``, when it exists, is the same image already downscaled by
    ``factor`` (``images_<factor>/``) and is used instead of resizing. The returned K is scaled per axis
    by the actual size ratio (and, for distorted cameras, is the undistorted pinhole K).
    """
    width, height = camera_size
    if prescaled_path is not None and factor > 1 and prescaled_path.is_file():
        source = prescaled_path
        size = read_image_size(source)
        if any(abs(n - full / factor) >= 1.0 for n, full in zip(size, camera_size)):
            raise DatasetError(
                f"{source}: image is {size[0]}x{size[1]}, but its camera is {width}x{height}, which at factor "
                f"{factor} should give about {width / factor:g}x{height / factor:g}"
            )
    else:
        source = path
        source_size = read_image_size(source)
        if source_size != (width, height):
            raise DatasetError(
                f"{source}: image is {source_size[0]}x{source_size[1]}, but its camera says {width}x{height}"
            )
        size = downscaled_size(width, height, factor)
    K = np.asarray(K, np.float64).copy()
    K[0, :] *= size[0] / width
    K[1, :] *= size[1] / height
    K[2, :] = (0.0, 0.0, 1.0)
    transform = ImageTransform(size)
    if not dist.is_zero:
        K_new = undistorted_intrinsics(K, dist, *size)
        transform = ImageTransform(size, tuple(K.flat), tuple(K_new.flat), dist)
        K = K_new
    return load_transformed(source, transform), K


def load_transformed(path: Path, transform: ImageTransform) -> np.ndarray:
    """``path`` read and transformed as ``transform`` says; derived images come from (and go to) the cache."""
    if not transform.K and read_image_size(path) == transform.size:
        return read_image(path)
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_mtime_ns}|{stat.st_size}|{transform!r}"
    cached = cache_dir("scenes", "images") / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.png"
    if cached.is_file():
        try:
            return read_image(cached)
        except DatasetError:
            pass  # a damaged cache entry is recomputed below
    image = resize_image(read_image(path), transform.size)
    if transform.K:
        K, K_new = (np.array(values).reshape(3, 3) for values in (transform.K, transform.K_new))
        image = undistort_image(image, K, transform.dist, K_new)
    tmp = cached.with_name(f"{cached.stem}.{os.getpid()}.tmp.png")
    Image.fromarray(image).save(tmp, compress_level=1)
    os.replace(tmp, cached)
    return image
