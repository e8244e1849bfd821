"""An example export format of your own: the Gaussians' centres and colours as an ASCII ``.xyz`` point cloud.

Import the module to register the format, then name it like a built-in one:

    gsrecon export --exp-dir outputs/synthetic --imports configs/examples/xyz_export.py --format xyz --out scene.xyz

or list it in a run's ``imports:`` and have ExportHook write it when training ends
(``hooks.ExportXyz={name: ExportHook, path: scene.xyz, format: xyz}``). Copy it as a starting point.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from torch import Tensor

from gsrecon.atomic import atomic_path
from gsrecon.export import ExportContext, ExportFormat
from gsrecon.registry import EXPORT_REGISTRY
from gsrecon.sh import sh_to_rgb


@EXPORT_REGISTRY.register("xyz")
class XyzFormat(ExportFormat):
    """ASCII point cloud for CloudCompare / MeshLab: one ``x y z r g b`` line per Gaussian (centre, base colour)."""

    suffixes = (".xyz",)

    def write(self, path: Path, params: Mapping[str, Tensor], *, antialiased: bool, context: ExportContext) -> None:
        """Centres with 6 decimals, the view-independent colour in 0-255; ``antialiased`` has no place here."""
        means = params["means"].detach().cpu().double().numpy()  # [N, 3]
        rgb = (sh_to_rgb(params["sh0"].detach().cpu()[:, 0]).clamp(0, 1) * 255).round().int().numpy()  # [N, 3]
        with atomic_path(path) as tmp:
            np.savetxt(tmp, np.hstack([means, rgb]), fmt="%.6f %.6f %.6f %d %d %d")
