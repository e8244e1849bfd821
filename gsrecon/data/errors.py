"""The one exception type dataset readers raise for bad input, and the checks they share."""

from __future__ import annotations

import errno
import math
import os
from pathlib import Path

from gsrecon.errors import InputError


class DatasetError(InputError):
    """A scene on disk is missing, malformed or unsupported; the message names the file and the problem."""


def checked_number(where: str, key: str, value: object, *, positive: bool = False) -> float:
    """``value`` as a float if it is a finite number (and > 0 with ``positive``).

    Raises:
        DatasetError: "<where>: '<key>' must be a finite number[ > 0], got <value>", e.g. ``where`` naming
            the file and the camera or frame the value belongs to.
    """
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not is_number or not math.isfinite(value) or (positive and value <= 0):
        raise DatasetError(f"{where}: '{key}' must be a finite number{' > 0' if positive else ''}, got {value!r}")
    return float(value)


def why_missing(path: Path) -> str:
    """Why ``path``, found to be neither a file nor a folder, is not there, in words that follow it: ``does not
    exist``, or that it is a symbolic link that loops or leads to a missing target."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a symbolic link that loops (it leads back to itself)"
    if path.is_symlink():
        return f"is a symbolic link to {os.readlink(path)}, which does not exist"
    return "does not exist"
