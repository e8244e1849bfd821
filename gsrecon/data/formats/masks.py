"""Per-image masks: pixels the loss and the metrics ignore (moving people, a hand, the sky).

A mask is an image file of the photo's size; a pixel is kept where it is nonzero and ignored where it is
zero (as nerfstudio reads them; a colour mask is kept where any colour channel is nonzero, its alpha is not
read). Masks are found in ``masks/`` beside ``images/`` under the image's path with a ``.png`` extension
(``images/a/b.jpg`` -> ``masks/a/b.png``, or COLMAP's ``masks/a/b.jpg.png``), or where a transforms.json
frame's ``mask_path`` says; ``masks_<f>/`` holds them at 1/f when the images come from ``images_<f>/``.

A mask is prepared like its image (resized, undistorted) so that no ignored pixel leaks into a kept one:
a resized pixel is ignored where an ignored source pixel lies under it or moves the resized image (its
Lanczos filter) by at least 1/255 of the full range, and an undistorted pixel where an ignored pixel is
among those it is interpolated from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
from PIL import Image

from gsrecon.data.errors import DatasetError
from gsrecon.data.formats.images import ImageFile, ImageTransform, read_image, read_image_size
from gsrecon.data.formats.lens import undistort_image

MASKS_FOLDER = "masks"
_LEAK = 1.0 / 255.0  # the least change of a resized pixel that an ignored source pixel may not make


@dataclass(frozen=True)
class MaskFile:
    """A mask file and the transform of its image: decoded to [h, w] bool (True where kept) when asked for."""

    path: Path
    transform: ImageTransform

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the prepared mask: its image's."""
        return self.transform.size

    def load(self) -> np.ndarray:
        """The prepared mask, bool [h, w], True where the pixel is kept.

        Raises:
            DatasetError: the prepared mask keeps no pixel (nothing of its photo could be trained on or scored).
        """
        ignored = ~read_mask(self.path)  # [H, W]
        if (ignored.shape[1], ignored.shape[0]) != self.transform.size:
            ignored = _resized_ignored(ignored, self.transform.size)
        if self.transform.K:
            K, K_new = (np.array(values).reshape(3, 3) for values in (self.transform.K, self.transform.K_new))
            spread = undistort_image(ignored.astype(np.uint8)[..., None] * 255, K, self.transform.dist, K_new)
            ignored = spread[..., 0] > 0
        if ignored.all():
            width, height = self.transform.size
            raise DatasetError(
                f"{self.path}: the mask keeps no pixel of its {width}x{height} photo (a mask is kept where nonzero, "
                "ignored where zero: white where the photo counts); fix or remove the mask"
            )
        return ~ignored


def read_mask(path: Path) -> np.ndarray:
    """The mask file's pixels as bool [H, W], True where nonzero (kept)."""
    return read_image(path)[..., :3].max(axis=-1) > 0


def _resized_ignored(ignored: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Where a bool [H, W] map of ignored pixels resized to (width, height) ``size`` is ignored, [h, w] bool."""
    source = Image.fromarray(ignored.astype(np.float32), mode="F")
    covered = np.asarray(source.resize(size, Image.Resampling.BOX)) > 0
    influence = np.abs(np.asarray(source.resize(size, Image.Resampling.LANCZOS))) >= _LEAK
    return covered | influence


def find_mask(folder: Path, relative: PurePosixPath) -> Path | None:
    """The mask in ``folder`` of the image at path ``relative`` (within its image folder), if there is one."""
    for candidate in (folder / relative.with_suffix(".png"), folder / f"{relative}.png"):
        if candidate.is_file():
            return candidate
    return None


def mask_file(path: Path, prescaled_path: Path | None, image: ImageFile, image_path: Path) -> MaskFile:
    """The mask at ``path`` (full resolution) of the image ``image_path`` as prepared by ``image``.

    ``prescaled_path`` (``masks_<f>/...``) is used instead, when it exists and the image itself comes from a
    prescaled folder (``image.path`` is not ``image_path``).

    Raises:
        DatasetError: the mask's size differs from its image's; the message names both files.
    """
    if prescaled_path is not None and image.path != image_path and prescaled_path.is_file():
        path, image_path = prescaled_path, image.path
    size, expected = read_image_size(path), read_image_size(image_path)
    if size != expected:
        raise DatasetError(
            f"{path}: the mask is {size[0]}x{size[1]}, but its image {image_path} is {expected[0]}x{expected[1]}"
        )
    return MaskFile(path, image.transform)
