"""Where gsrecon keeps derived files (generated scenes, undistorted images, converted weights)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """Return (and create) ``<root>/<parts...>``.

    The root is ``$GSRECON_CACHE`` if set, else ``$XDG_CACHE_HOME/gsrecon``, else ``~/.cache/gsrecon``.
    """
    root = os.environ.get("GSRECON_CACHE")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = os.path.join(xdg, "gsrecon") if xdg else os.path.join(Path.home(), ".cache", "gsrecon")
    path = Path(root).joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
