"""Choosing and naming images: evenly spaced subsets, train/test splits, frame names (shared by the readers)."""

from __future__ import annotations

from pathlib import PurePosixPath

import numpy as np

EVAL_SPLITS = ("every_8", "none", "dataset")
EVERY = 8  # every_8: names sorted, index % 8 == 0 is a test image (Mip-NeRF 360 / 3DGS)


def check_eval_split(eval_split: str) -> None:
    """Raise ValueError unless ``eval_split`` is one of :data:`EVAL_SPLITS`."""
    if eval_split not in EVAL_SPLITS:
        raise ValueError(f"eval_split must be one of {EVAL_SPLITS}, got {eval_split!r}")


def evenly_spaced(count: int, max_count: int) -> list[int]:
    """Indices of at most ``max_count`` (> 0; 0 means all) evenly spaced items out of ``count``, ascending."""
    if max_count < 0:
        raise ValueError(f"max_images must be >= 0, got {max_count}")
    if max_count == 0 or max_count >= count:
        return list(range(count))
    return sorted(set(np.linspace(0, count - 1, max_count).round().astype(int).tolist()))


def every_nth_is_test(count: int, every: int = EVERY) -> list[bool]:
    """Per index (in name order), whether it is a test image: ``index % every == 0``."""
    return [i % every == 0 for i in range(count)]


def frame_name(relative_path: str) -> str:
    """Frame name of an image path relative to its folder: no extension, sub-folders joined by '_'."""
    return "_".join(part for part in PurePosixPath(relative_path).with_suffix("").parts if part not in (".", "/"))
