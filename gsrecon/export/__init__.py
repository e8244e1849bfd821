"""Writers of trained Gaussians in the formats 3DGS viewers read, one module per format family.

Importing this package registers the built-in formats in ``EXPORT_REGISTRY`` (``ply``, ``splat``,
``compressed_ply``, ``spz``, ``sog``, ``glb``, ``mesh``; ``lod``, a run's levels of detail, registers in
``gsrecon.lod.export``); `gsrecon.export.base` says what a format implements.
"""

from gsrecon.export import compressed_ply, glb, mesh, ply, sog, splat, spz  # noqa: F401
from gsrecon.export.base import ExportContext, ExportFormat, TrainedRun, export_gaussians

__all__ = ["ExportContext", "ExportFormat", "TrainedRun", "export_gaussians"]
