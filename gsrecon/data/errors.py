"""The one exception type dataset readers raise for bad input."""

from __future__ import annotations


class DatasetError(ValueError):
    """A scene on disk is missing, malformed or unsupported; the message names the file and the problem."""
