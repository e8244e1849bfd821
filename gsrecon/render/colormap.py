"""Depth maps as colour images (validation panels, rendered depth videos, the viewer's depth display)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:
    from gsrecon.render.base import RenderOutput

# 17 evenly spaced samples (index 0, 16, ..., 240, 255) of Google's Turbo colormap (Apache-2.0), sRGB bytes.
_TURBO = np.array(
    [[48, 18, 59], [64, 64, 162], [70, 107, 227], [66, 148, 255], [40, 188, 235], [24, 221, 194],
     [50, 242, 152], [109, 254, 98], [164, 252, 60], [205, 236, 52], [238, 207, 58], [253, 172, 52],
     [251, 126, 33], [235, 80, 14], [208, 47, 5], [169, 22, 1], [122, 4, 3]], dtype=np.float64
)  # fmt: skip
_TURBO_POSITIONS = np.append(np.arange(0, 256, 16), 255) / 255.0


def depth_to_rgb(depth: Tensor | np.ndarray, alpha: Tensor | np.ndarray | None = None) -> np.ndarray:
    """Colour a depth map ``[H, W]`` (or ``[H, W, 1]``) as uint8 ``[H, W, 3]`` with a Turbo-like colormap.

    Near is dark blue, far is dark red. Depths are normalised between their 1st and 99th percentiles
    over the pixels with ``alpha > 0.5`` (all pixels when ``alpha`` is None), and the colour is
    multiplied by ``alpha [H, W]`` so empty space is black.
    """
    depth = _numpy(depth).astype(np.float64)
    if depth.ndim == 3 and depth.shape[-1] == 1:  # a renderer's [H, W, 1]
        depth = depth[..., 0]
    alpha = np.ones_like(depth) if alpha is None else _numpy(alpha).astype(np.float64).reshape(depth.shape)
    valid = depth[(alpha > 0.5) & np.isfinite(depth)]
    if valid.size == 0:
        return np.zeros((*depth.shape, 3), np.uint8)
    near, far = np.percentile(valid, [1, 99])
    t = np.clip((np.nan_to_num(depth, nan=far) - near) / max(far - near, 1e-12), 0.0, 1.0)  # [H, W]
    rgb = np.stack([np.interp(t, _TURBO_POSITIONS, _TURBO[:, c]) for c in range(3)], axis=-1)  # [H, W, 3]
    return np.round(rgb * np.clip(alpha, 0.0, 1.0)[..., None]).astype(np.uint8)


DEPTH_KINDS = ("expected", "median")  # what a depth image shows: the blended depth, or the surface's


def depth_image(out: RenderOutput, depth: str = "expected") -> np.ndarray:
    """The first camera's ``expected`` or ``median`` depth (``out.median_depth``), colour-mapped as uint8
    [H, W, 3], black where nothing is (the median depth: where the opacity stays below 1/2)."""
    if depth == "median":
        median = out.median_depth[0, ..., 0]  # [H, W]
        return depth_to_rgb(median, (median > 0).float())
    return depth_to_rgb(out.depth[0, ..., 0], out.alpha[0, ..., 0])


def _numpy(x: Tensor | np.ndarray) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
