"""The one exception type dataset readers raise for bad input, and the number check they share."""

from __future__ import annotations

import math

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
