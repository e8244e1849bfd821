"""Browser viewer of Gaussian scenes on viser: ``gsrecon view`` and the live ``ViewerHook``.

viser is an optional dependency (the ``[viewer]`` extra): this package imports it only in
`gsrecon.viewer.server`, after :func:`require_viser` said it is there.
"""

from __future__ import annotations

from gsrecon.errors import InputError

INSTALL_HINT = "pip install -e .[viewer]"
DISPLAYS = {"browser": "browser splats (fast)", "server": "gsrecon render (exact)"}  # key: dropdown label
RESOLUTIONS = (64, 4096)  # px, the range of the longer side of server-side renders


class ViewerUnavailableError(ImportError, InputError):
    """viser is not installed (an InputError too: the command line reports it as one line, exit 2)."""


def require_viser() -> None:
    """Raise :class:`ViewerUnavailableError` with the install command when viser cannot be imported."""
    try:
        import viser  # noqa: F401
    except ImportError as exc:
        raise ViewerUnavailableError(f"the viewer needs viser ({exc}); install it with: {INSTALL_HINT}") from None


def check_view_settings(display: str, resolution: int) -> None:
    """Raise ValueError unless ``display`` is a :data:`DISPLAYS` key and ``resolution`` in :data:`RESOLUTIONS`."""
    if display not in DISPLAYS:
        raise InputError(f"viewer display must be one of {', '.join(DISPLAYS)}; got '{display}'")
    if not RESOLUTIONS[0] <= resolution <= RESOLUTIONS[1]:
        raise InputError(f"viewer resolution must be {RESOLUTIONS[0]} to {RESOLUTIONS[1]} pixels, got {resolution}")
