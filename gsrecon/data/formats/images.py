"""Image files: reading, writing, downscaling by a factor, undistortion, and the on-disk cache of the results.

Derived images (resized and/or undistorted) are computed once and kept as PNG under ``cache_dir("images")``,
keyed by the source file's path, modification time and size and by the transform, so editing or replacing
a source image invalidates its cached copies. The cache only saves time: when it cannot be written, it is
skipped.

Images of more than :data:`MAX_IMAGE_PIXELS` pixels (2^27, e.g. 16384x8192) are refused from their header,
before any pixel is decoded, so that a file declaring a huge size (a "decompression bomb") costs no memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor

from gsrecon.atomic import atomic_path
from gsrecon.cache import cache_file
from gsrecon.cameras import PINHOLE, CameraModel
from gsrecon.data.errors import DatasetError
from gsrecon.data.formats.lens import (
    Distortion,
    describe_crop,
    field_of_view,
    undistort_image,
    undistort_points,
    undistorted_intrinsics,
)
from gsrecon.data.scene import Frame, PixelFile
from gsrecon.errors import InputError

FACTORS = (1, 2, 4, 8, 16, 32)  # 16, 32: the coarse levels of detail of a run at 4 or 8 (gsrecon lod)
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")  # lower case: compare `suffix.lower()`
_DEEP_GREY_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")  # PIL modes of 16/32-bit greyscale images
MAX_IMAGE_PIXELS = 2**27  # 134,217,728: e.g. 16384x8192, 384 MiB as 8-bit RGB; above PIL's warning threshold


@dataclass(frozen=True)
class ImageTransform:
    """What to do to a source image: resize to ``size`` (width, height), then undistort from K to K_new."""

    size: tuple[int, int]
    K: tuple[float, ...] = ()  # 9 values, row-major; empty when there is nothing to undistort
    K_new: tuple[float, ...] = ()
    dist: Distortion = field(default_factory=Distortion)

    def points(self, xy: np.ndarray, source_size: tuple[int, int]) -> np.ndarray:
        """Where the pixels ``xy`` [P, 2] (x, y) of the ``source_size`` (width, height) source image land in the
        image this makes of it: [P, 2], resized, then undistorted."""
        xy = xy * (np.asarray(self.size, np.float64) / np.asarray(source_size, np.float64))
        if not self.K:
            return xy
        K, K_new = (np.array(values).reshape(3, 3) for values in (self.K, self.K_new))
        x, y = undistort_points((xy[:, 0] - K[0, 2]) / K[0, 0], (xy[:, 1] - K[1, 2]) / K[1, 1], self.dist)
        return np.stack([K_new[0, 0] * x + K_new[0, 2], K_new[1, 1] * y + K_new[1, 2]], axis=-1)


@contextlib.contextmanager
def _opened(path: str | Path) -> Iterator[Image.Image]:
    """The image file opened with PIL (its header read, no pixels decoded); read errors, also while decoding
    in the block, and images of more than :data:`MAX_IMAGE_PIXELS` pixels raise DatasetError naming the file."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # MAX_IMAGE_PIXELS is the bound
            opened = Image.open(path)
        with opened as im:
            width, height = im.size
            if width * height > MAX_IMAGE_PIXELS:
                raise DatasetError(f"{path}: the image has {width}x{height} pixels; {_size_limit()}")
            yield im
    except FileNotFoundError as err:
        raise DatasetError(f"{path}: image file is missing") from err
    except Image.DecompressionBombError as err:
        raise DatasetError(
            f"{path}: the image has more pixels than PIL opens safely (a possible decompression bomb); {_size_limit()}"
        ) from err
    except (UnidentifiedImageError, OSError, SyntaxError) as err:
        raise DatasetError(f"{path}: cannot read the image ({err})") from err


def _size_limit() -> str:
    return f"gsrecon reads images of at most {MAX_IMAGE_PIXELS:,} pixels (e.g. 16384x8192); downscale it first"


def read_image(path: str | Path) -> np.ndarray:
    """Pixels of an image file as uint8 [H, W, 3], or [H, W, 4] when it has an alpha channel.

    16-bit greyscale images keep their high byte; 32-bit integer ones must hold 16-bit values
    (0-65535) and float ones values in [0, 1], else :class:`DatasetError` names the file and mode.
    """
    with _opened(path) as im:
        if im.mode in _DEEP_GREY_MODES:
            return _deep_grey_to_uint8(im, path)
        has_alpha = im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info
        return np.array(im.convert("RGBA" if has_alpha else "RGB"))


def _deep_grey_to_uint8(im: Image.Image, path: str | Path) -> np.ndarray:
    """uint8 [H, W, 3] (or [H, W, 4] with a transparent grey value) of a 16/32-bit greyscale image."""
    raw = np.asarray(im)  # [H, W] uint16, int32 or float32
    low, high = raw.min(), raw.max()
    if im.mode != "F" and low >= 0 and high <= 65535:
        grey = (raw >> 8).astype(np.uint8)
    elif im.mode == "F" and low >= 0.0 and high <= 1.0:
        grey = np.rint(raw * 255.0).astype(np.uint8)
    else:
        raise DatasetError(
            f"{path}: cannot convert a mode {im.mode} greyscale image with values in [{low:g}, {high:g}] to 8 bits "
            "(integer images must hold 16-bit values 0-65535, float images values in [0, 1]); save it as an "
            "8-bit PNG or JPEG"
        )
    channels = [grey, grey, grey]
    if "transparency" in im.info:
        channels.append(np.where(raw == im.info["transparency"], 0, 255).astype(np.uint8))
    return np.stack(channels, axis=-1)


def read_image_size(path: str | Path) -> tuple[int, int]:
    """(width, height) of an image file, from its header."""
    with _opened(path) as im:
        return im.size


def to_uint8(image: Tensor | np.ndarray) -> np.ndarray:
    """A uint8 array of ``image`` (any shape, e.g. [H, W, 3]): floats are clipped to [0, 1], scaled by 255 and
    rounded to the nearest integer; uint8 is returned as is. A tensor may be on any device or need grad."""
    if isinstance(image, Tensor):
        image = image.detach().cpu()
        image = (image.float() if image.is_floating_point() else image).numpy()
    if image.dtype == np.uint8:
        return image
    if not np.issubdtype(image.dtype, np.floating):
        raise ValueError(f"to_uint8 needs a float image in [0, 1] or a uint8 one, got dtype {image.dtype}")
    return np.rint(np.clip(image, 0.0, 1.0) * 255.0).astype(np.uint8)


def write_png(path: str | Path, image: Tensor | np.ndarray) -> None:
    """Write ``image`` ([H, W], [H, W, 1], [H, W, 3] or [H, W, 4]; float in [0, 1] or uint8, see
    :func:`to_uint8`) as a PNG file, atomically, creating its folder."""
    pixels = to_uint8(image)
    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[..., 0]
    with atomic_path(path) as tmp:
        Image.fromarray(pixels).save(tmp, format="PNG")


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
        raise InputError(f"factor must be one of {FACTORS}, got {factor!r}")


@dataclass(frozen=True)
class ImageFile:
    """An image file and the transform that prepares it: pixels decoded when asked for (``data.cache: disk``)."""

    path: Path
    transform: ImageTransform

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the prepared image."""
        return self.transform.size

    def load(self) -> np.ndarray:
        """The prepared pixels, uint8 [h, w, C] (derived images read from the cache once made)."""
        return load_transformed(self.path, self.transform)


class CameraImage(NamedTuple):
    """A camera's image as training reads it (see :func:`camera_image_file`)."""

    file: ImageFile  # the source file and how it is transformed
    K: np.ndarray  # [3, 3] intrinsics of the prepared image: a pinhole's, or a kept fisheye lens's
    source: str  # how it is made: "images_8/", "resized 1/8", "as stored", plus ", undistorted (kept ...)" ...
    camera_model: CameraModel  # a pinhole, or the fisheye lens the image is kept through (coeffs [4] float32)


def camera_image_file(
    path: Path,
    camera_size: tuple[int, int],
    K: np.ndarray,
    dist: Distortion,
    factor: int,
    prescaled_path: Path | None = None,
    *,
    camera: str,
    keep_fisheye: bool = False,
) -> CameraImage:
    """A camera's image at 1/``factor`` resolution, undistorted to a pinhole (a fisheye with ``keep_fisheye``: as
    the lens saw it), from its header only.

    ``path`` is the full-resolution image of a ``camera_size`` (width, height) camera with intrinsics ``K``
    and distortion ``dist``. ``prescaled_path``, when it exists, is the same image already downscaled by
    ``factor`` (``images_<factor>/``) and is used instead of resizing. The returned K is scaled per axis
    by the actual size ratio (and, for distorted cameras, is the undistorted pinhole K). ``camera`` says
    where the camera is defined, for error messages (e.g. "camera 2 of sparse/0/cameras.bin").
    """
    width, height = camera_size
    if prescaled_path is not None and factor > 1 and prescaled_path.is_file():
        source, how = prescaled_path, f"{prescaled_path.parent.name}/"
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
        how = f"resized 1/{factor}" if factor > 1 else "as stored"
    K = np.asarray(K, np.float64).copy()
    K[0, :] *= size[0] / width
    K[1, :] *= size[1] / height
    K[2, :] = (0.0, 0.0, 1.0)
    transform = ImageTransform(size)
    if dist.fisheye and keep_fisheye:
        fov = field_of_view(K, dist, *size)
        seen = f"{fov[0]:.0f}x{fov[1]:.0f} degrees " if np.isfinite(fov).all() else ""
        lens = CameraModel.fisheye(torch.from_numpy(np.array(dist.fisheye_coeffs, np.float32)))
        return CameraImage(ImageFile(source, transform), K, f"{how}, {seen}through the fisheye lens", lens)
    if not dist.is_zero:
        try:
            K_new = undistorted_intrinsics(K, dist, *size)
        except ValueError as err:
            raise DatasetError(f"{path}: cannot undistort the image of {camera}: {err}") from err
        transform = ImageTransform(size, tuple(K.flat), tuple(K_new.flat), dist)
        crop = f" ({describe_crop(K, dist, K_new, *size)})" if dist.fisheye else ""
        K, how = K_new, f"{how}, undistorted{crop}"
    return CameraImage(ImageFile(source, transform), K, how, PINHOLE)


def camera_frame(
    name: str,
    viewmat: np.ndarray,
    image: CameraImage,
    mask: Tensor | PixelFile | None,
    lazy: bool,
    depth: PixelFile | None = None,
) -> Frame:
    """The :class:`Frame` of a camera's ``image`` posed by ``viewmat`` [4, 4], its pixels (and ``depth`` map)
    decoded unless ``lazy``."""
    return Frame(
        name=name,
        viewmat=torch.from_numpy(viewmat.astype(np.float32)),
        K=torch.from_numpy(image.K.astype(np.float32)),
        pixels=image.file if lazy else torch.from_numpy(image.file.load()),
        source=image.source,
        mask=mask,
        camera_model=image.camera_model,
        depth=depth if depth is None or lazy else torch.from_numpy(depth.load()),
    )


def load_transformed(path: Path, transform: ImageTransform) -> np.ndarray:
    """``path`` read and transformed as ``transform`` says; derived images come from (and go to) the cache."""
    if not transform.K and read_image_size(path) == transform.size:
        return read_image(path)
    stat = path.stat()
    key = {
        "source": str(path.resolve()),
        "mtime_ns": stat.st_mtime_ns,
        "bytes": stat.st_size,
        "transform": dataclasses.asdict(transform),
    }
    cached = cache_file("images", key, ".png")
    if cached.is_file():
        try:
            return read_image(cached)
        except DatasetError:
            pass  # a damaged cache entry is recomputed below
    image = resize_image(read_image(path), transform.size)
    if transform.K:
        K, K_new = (np.array(values).reshape(3, 3) for values in (transform.K, transform.K_new))
        image = undistort_image(image, K, transform.dist, K_new)
    with contextlib.suppress(OSError):  # an unwritable cache only costs time
        write_png(cached, image)
    return image
