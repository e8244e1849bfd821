"""Where gsrecon keeps derived files (generated scenes, resized images, converted weights), and their names.

The cache is only an optimisation: nothing here creates folders. Writers create what they need and skip
caching when that fails; a missing or unreadable entry is recomputed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any


def cache_dir(*parts: str) -> Path:
    """``<root>/<parts...>``, which may not exist yet.

    The root is ``$GSRECON_CACHE`` if set, else ``$XDG_CACHE_HOME/gsrecon``, else ``~/.cache/gsrecon``.
    """
    root = os.environ.get("GSRECON_CACHE")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = os.path.join(xdg, "gsrecon") if xdg else os.path.join(Path.home(), ".cache", "gsrecon")
    return Path(root).joinpath(*parts)


def cache_file(kind: str, key: Mapping[str, Any], suffix: str, folder: str | Path | None = None) -> Path:
    """The cache entry ``<folder>/<kind>_<digest><suffix>`` for ``key`` (``folder`` defaults to ``cache_dir(kind)``).

    The digest hashes ``kind`` and the canonical JSON of ``key``: keys sorted, tuples as lists, floats
    (numpy ones included) written as Python writes them, numpy arrays as nested lists, paths as strings.
    Equal keys give the same file whatever their dict order or number types.
    """
    text = json.dumps({"kind": kind, "key": key}, sort_keys=True, separators=(",", ":"), default=_jsonable)
    digest = hashlib.sha256(text.encode()).hexdigest()[:32]
    return Path(folder if folder is not None else cache_dir(kind)) / f"{kind}_{digest}{suffix}"


def _jsonable(value: Any) -> Any:
    """JSON form of the values ``json`` does not know: numpy scalars and arrays, paths."""
    if hasattr(value, "tolist"):  # numpy scalar or array
        return value.tolist()
    if isinstance(value, PurePath):
        return str(value)
    raise TypeError(f"cache key value {value!r} of type {type(value).__name__} has no canonical JSON form")
