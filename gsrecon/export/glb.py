"""glTF ``KHR_gaussian_splatting`` as an export format (the layout is read and written by `gsrecon.model.gltf`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from gsrecon.export.base import ExportContext, ExportFormat
from gsrecon.model.gltf import save_gltf
from gsrecon.registry import EXPORT_REGISTRY


@EXPORT_REGISTRY.register("glb")
class GlbFormat(ExportFormat):
    """glTF KHR_gaussian_splatting: float32, every SH degree, PlayCanvas's axes; .gltf writes a .bin beside it."""

    suffixes = (".glb", ".gltf")

    @dataclass
    class Config:
        exact: bool = True  # also hold the trained parameters bit for bit (32 bytes per Gaussian) for gsrecon to read

    def __init__(self, cfg: GlbFormat.Config | None = None) -> None:
        self.cfg = cfg if cfg is not None else GlbFormat.Config()

    def write(self, path: Path, params: Mapping[str, Tensor], *, antialiased: bool, context: ExportContext) -> None:
        save_gltf(path, params, antialiased=antialiased, exact=self.cfg.exact)
