"""Choosing and naming images: evenly spaced subsets, train/test splits, frame names (shared by the readers)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TypeVar

import numpy as np

from gsrecon.data.errors import DatasetError
from gsrecon.errors import InputError

EVAL_SPLITS = ("every_8", "none", "dataset")
EVERY = 8  # every_8: names sorted, index % 8 == 0 is a test image (Mip-NeRF 360 / 3DGS)

T = TypeVar("T")


@dataclass(frozen=True)
class NameList:
    """Image names a dataset lists for one split, and where it lists them (named in errors)."""

    source: str  # e.g. "scene/test.txt" or "scene/transforms.json 'test_filenames'"
    entries: tuple[str, ...]


def check_eval_split(eval_split: str) -> None:
    """Raise ValueError unless ``eval_split`` is one of :data:`EVAL_SPLITS`."""
    if eval_split not in EVAL_SPLITS:
        raise InputError(f"eval_split must be one of {EVAL_SPLITS}, got {eval_split!r}")


def evenly_spaced(count: int, max_count: int) -> list[int]:
    """Indices of at most ``max_count`` (> 0; 0 means all) evenly spaced items out of ``count``, ascending."""
    if max_count < 0:
        raise InputError(f"max_images must be >= 0, got {max_count}")
    if max_count == 0 or max_count >= count:
        return list(range(count))
    return sorted(set(np.linspace(0, count - 1, max_count).round().astype(int).tolist()))


def split_frames(
    frames: Sequence[T], eval_split: str, is_test: Sequence[bool] | None = None, every: int = EVERY
) -> tuple[list[T], list[T]]:
    """(train, test) of ``frames`` (in name order), each keeping that order.

    ``eval_split`` is ``"none"`` (all train), ``"every_8"`` (index % ``every`` == 0 is test) or
    ``"dataset"`` (``is_test[i]``, the dataset's own split of frame ``i``, decides).
    """
    check_eval_split(eval_split)
    if eval_split == "none":
        flags = [False] * len(frames)
    elif eval_split == "every_8":
        if every <= 0:
            raise ValueError(f"every must be > 0, got {every}")
        flags = [i % every == 0 for i in range(len(frames))]
    elif is_test is None:
        raise ValueError("eval_split 'dataset' needs the dataset's split (is_test)")
    else:
        flags = list(is_test)
    pairs = list(zip(frames, flags, strict=True))
    return [f for f, test in pairs if not test], [f for f, test in pairs if test]


def listed_as_test(names: Sequence[str], test: NameList | None, train: NameList | None) -> list[bool]:
    """Per name, whether the dataset's lists make it a test image: listed in ``test`` if given, else not in ``train``.

    Raises:
        DatasetError: the list has entries that match none of ``names`` (see :func:`match_listed`).
    """
    if test is not None:
        listed = match_listed(test, names)
        return [name in listed for name in names]
    if train is None:
        raise ValueError("listed_as_test needs a test or a train list")
    listed = match_listed(train, names)
    return [name not in listed for name in names]


def match_listed(names_list: NameList, names: Sequence[str]) -> set[str]:
    """The ``names`` (image paths) that the entries of ``names_list`` refer to.

    An entry refers to a name when both are the same path after normalisation (``./a//b.png`` is
    ``a/b.png``), compared with their extensions or, failing that, without them (``a/b`` is ``a/b.png``).

    Raises:
        DatasetError: some entries refer to none of ``names``; the message names the list and them.
    """
    lookup = {_without_extension(name): name for name in names} | {_normalised(name): name for name in names}
    matched, unknown = set(), []
    for entry in names_list.entries:
        name = lookup.get(_normalised(entry), lookup.get(_without_extension(entry)))
        if name is None:
            unknown.append(entry)
        else:
            matched.add(name)
    if unknown:
        shown = ", ".join(repr(e) for e in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        example = f" (its images are named like {names[0]!r})" if names else ""
        raise DatasetError(
            f"{names_list.source}: {len(unknown)} of {len(names_list.entries)} entries name no image of the scene: "
            f"{shown}{example}"
        )
    return matched


def _normalised(path: str) -> str:
    return str(PurePosixPath(path.strip()))


def _without_extension(path: str) -> str:
    normalised = PurePosixPath(path.strip())
    return str(normalised.with_suffix("") if normalised.name else normalised)


def frame_name(relative_path: str) -> str:
    """Frame name of an image path relative to its folder: no extension, sub-folders joined by '_'."""
    return "_".join(part for part in PurePosixPath(relative_path).with_suffix("").parts if part not in (".", "/"))
