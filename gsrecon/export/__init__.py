"""Writers of trained Gaussians in the formats 3DGS viewers read, one module per format family.

Every writer is called ``writer(path, params, *, antialiased=False)`` with gsrecon's pre-activation
parameters (see `gsrecon.model.gaussians`) and records ``antialiased`` where its format can.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from torch import Tensor

from gsrecon.errors import InputError
from gsrecon.export.compressed_ply import save_compressed_ply
from gsrecon.export.sog import save_sog
from gsrecon.export.splat import save_splat
from gsrecon.export.spz import save_spz
from gsrecon.model.ply import save_ply

EXPORT_FORMATS: dict[str, Callable[..., None]] = {
    "ply": save_ply,  # reference 3DGS layout, float32, lossless
    "splat": save_splat,  # antimatter15 web viewer: 32 bytes per Gaussian, no view-dependent colour
    "compressed_ply": save_compressed_ply,  # SuperSplat / PlayCanvas: 16 bytes per Gaussian + 8-bit SH
    "spz": save_spz,  # Niantic SPZ version 3, gzip-compressed
    "sog": save_sog,  # PlayCanvas SOG: codebook-quantised attributes in lossless WebP images, zipped
}


def export_gaussians(
    params: Mapping[str, Tensor], path: str | os.PathLike, fmt: str, antialiased: bool = False
) -> Path:
    """Write ``params`` to ``path`` in format ``fmt`` (a key of `EXPORT_FORMATS`); return the path.

    Raises ValueError naming the formats when ``fmt`` is not one of them.
    """
    if fmt not in EXPORT_FORMATS:
        raise InputError(f"unknown export format '{fmt}'; use one of {', '.join(EXPORT_FORMATS)}")
    EXPORT_FORMATS[fmt](path, params, antialiased=antialiased)
    return Path(path)
