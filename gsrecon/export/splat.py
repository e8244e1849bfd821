"""The 32-byte-per-Gaussian ``.splat`` layout of the antimatter15 web viewer."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from torch import Tensor

from gsrecon.atomic import atomic_path
from gsrecon.export.base import ExportContext, ExportFormat
from gsrecon.io.ply import WRITE_CHUNK_ROWS
from gsrecon.model.ply import cpu_params
from gsrecon.registry import EXPORT_REGISTRY
from gsrecon.sh import SH_C0


def save_splat(path: str | os.PathLike, params: Mapping[str, Tensor], *, antialiased: bool = False) -> None:
    """Write Gaussians in the ``.splat`` layout; the layout has no header, so ``antialiased`` is not recorded.

    Per Gaussian, little-endian: position 3 x float32, scale 3 x float32 (activated, ``exp``),
    colour RGBA 4 x uint8 (``0.5 + SH_C0 * sh0`` and ``sigmoid(opacity)``, times 255, clipped and
    truncated), rotation 4 x uint8 (normalised quaternion w, x, y, z encoded as ``q * 128 + 128``,
    clipped). View-dependent colour (``shN``) is dropped. Gaussians are ordered by decreasing
    ``volume * opacity`` (as the viewer's own converter does). Written atomically.
    """
    arrays = {key: value.numpy() for key, value in cpu_params(params).items()}
    log_scales, logit_opacity = arrays["scales"], arrays["opacities"]  # [N, 3], [N]
    opacity = 1.0 / (1.0 + np.exp(-logit_opacity))  # [N]
    order = np.argsort(-np.exp(log_scales.sum(axis=1)) * opacity, kind="stable")  # [N]
    dtype = np.dtype([("position", "<f4", 3), ("scale", "<f4", 3), ("rgba", "u1", 4), ("rot", "u1", 4)])
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        for start in range(0, len(order), WRITE_CHUNK_ROWS):  # bounded memory at millions of Gaussians
            ids = order[start : start + WRITE_CHUNK_ROWS]  # [M]
            rgba = np.concatenate([0.5 + SH_C0 * arrays["sh0"][ids, 0, :], opacity[ids, None]], axis=1)  # [M, 4]
            quats = arrays["quats"][ids]
            quats = quats / np.linalg.norm(quats, axis=1, keepdims=True)  # [M, 4]
            records = np.empty(len(ids), dtype=dtype)
            records["position"] = arrays["means"][ids]
            records["scale"] = np.exp(log_scales[ids])
            records["rgba"] = np.clip(rgba * 255, 0, 255).astype(np.uint8)
            records["rot"] = np.clip(quats * 128 + 128, 0, 255).astype(np.uint8)
            f.write(records.tobytes())


@EXPORT_REGISTRY.register("splat")
class SplatFormat(ExportFormat):
    """antimatter15 web viewer: 32 bytes per Gaussian, no view-dependent colour, no render mode."""

    suffixes = (".splat",)

    def write(self, path: Path, params: Mapping[str, Tensor], *, antialiased: bool, context: ExportContext) -> None:
        save_splat(path, params, antialiased=antialiased)
