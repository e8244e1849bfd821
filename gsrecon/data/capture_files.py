"""The one rule for the files a capture names (its images, masks, depth maps and point cloud): they lie inside the
capture's folder, unless the user says otherwise (``data.outside_capture``), so that a capture from elsewhere reads
nothing else on this machine."""

from __future__ import annotations

import os
from pathlib import Path

from gsrecon.data.errors import DatasetError

OUTSIDE_KEY = "data.outside_capture"


def leaves(root: Path, value: str) -> bool:
    """Whether the path ``value``, relative to the folder ``root``, leads out of it: an absolute path, or ``..`` past
    it. Symbolic links inside the folder are the user's own, and followed; a ``..`` is taken where the system takes
    it, after the links before it (``link/..`` is the folder above the link's target, not the capture folder)."""
    parts = Path(value).parts
    if Path(value).is_absolute() or ".." not in parts:
        return not Path(os.path.abspath(root / value)).is_relative_to(os.path.abspath(root))
    last = len(parts) - 1 - parts[::-1].index("..")
    climbed = os.path.realpath(root.joinpath(*parts[: last + 1]))  # what follows the last '..' climbs no further
    return not Path(climbed).is_relative_to(os.path.realpath(root))


def capture_file(root: Path, value: str, what: str, where: str, outside: bool = False) -> Path:
    """The path of the file ``value`` (relative to the capture folder ``root``) that ``where`` names as its ``what``.
    Raises DatasetError when it :func:`leaves` ``root``, unless ``outside``."""
    path = root / value
    if not outside and leaves(root, value):
        raise DatasetError(
            f"{where}: the {what} {value!r} lies outside the capture folder {root}; gsrecon reads only files inside "
            f"it: move the file there, or set {OUTSIDE_KEY}=true if you keep files elsewhere on purpose"
        )
    return path
