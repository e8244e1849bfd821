"""The reference 3DGS ``.ply`` as an export format (the layout is read and written by `gsrecon.model.ply`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from torch import Tensor

from gsrecon.export.base import ExportContext, ExportFormat
from gsrecon.model.ply import save_ply
from gsrecon.registry import EXPORT_REGISTRY


@EXPORT_REGISTRY.register("ply")
class PlyFormat(ExportFormat):
    """The reference 3DGS layout, float32, lossless: opens in 3DGS viewers; the header records the render mode."""

    suffixes = (".ply",)

    def write(self, path: Path, params: Mapping[str, Tensor], *, antialiased: bool, context: ExportContext) -> None:
        save_ply(path, params, antialiased=antialiased)
