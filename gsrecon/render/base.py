"""The renderer interface shared by the gsplat (CUDA) and pure-PyTorch renderers."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor

if TYPE_CHECKING:
    from gsrecon.logging.console import Logger

PARAM_KEYS = ("means", "scales", "quats", "opacities", "sh0", "shN")


@dataclass
class RenderOutput:
    """What a renderer returns for a batch of ``C`` cameras (mirrors ``gsplat.rasterization``).

    ``info`` holds what densification strategies read (``gsplat.strategy`` compatible):
    ``"means2d"`` [C, N, 2] projected centres in pixels (a non-leaf tensor whose ``.grad`` is
    filled by backward when gradients are enabled), ``"radii"`` [C, N, 2] int32 screen-space
    half extents in pixels (0 = not visible in that camera), ``"depths"`` [C, N] camera-space z,
    ``"width"``, ``"height"`` and ``"n_cameras"``.
    """

    image: Tensor  # [C, H, W, 3], composited over the background
    alpha: Tensor  # [C, H, W, 1], accumulated opacity 1 - T
    depth: Tensor  # [C, H, W, 1], expected depth sum(w * z) / alpha; 0 where alpha is 0
    info: dict[str, Any]


class Renderer(abc.ABC):
    """Renders Gaussians given in pre-activation form (see `PARAM_KEYS`).

    ``params`` maps ``means`` [N, 3], ``scales`` [N, 3] (log), ``quats`` [N, 4] (w, x, y, z, not
    necessarily unit), ``opacities`` [N] (logit), ``sh0`` [N, 1, 3] and ``shN`` [N, K-1, 3]; the
    renderer applies exp / sigmoid / normalisation itself. Subclasses define a nested ``Config``
    dataclass and are constructed as ``Renderer(cfg)``.
    """

    def setup(self, logger: Logger) -> None:
        """Prepare before the first `render` (e.g. build kernels, reporting through ``logger``).

        The default does nothing; renderers with expensive or fallible preparation override it.
        """

    @abc.abstractmethod
    def render(
        self,
        params: Mapping[str, Tensor],
        viewmats: Tensor,  # [C, 4, 4] world-to-camera, OpenCV convention
        Ks: Tensor,  # [C, 3, 3] pinhole intrinsics in pixels
        width: int,
        height: int,
        sh_degree: int,
        backgrounds: Tensor,  # [C, 3]
    ) -> RenderOutput:
        """Render ``C`` cameras of size ``width`` x ``height`` using SH up to ``sh_degree``."""


def check_render_inputs(
    params: Mapping[str, Tensor],
    viewmats: Tensor,
    Ks: Tensor,
    width: int,
    height: int,
    sh_degree: int,
    backgrounds: Tensor,
) -> None:
    """Raise ValueError naming the offending input if shapes or sizes are inconsistent."""
    missing = [k for k in PARAM_KEYS if k not in params]
    if missing:
        raise ValueError(f"Gaussian parameters are missing {missing}; expected keys {list(PARAM_KEYS)}")
    n = params["means"].shape[0]
    expected = {
        "means": (n, 3),
        "scales": (n, 3),
        "quats": (n, 4),
        "opacities": (n,),
        "sh0": (n, 1, 3),
    }
    for key, shape in expected.items():
        if tuple(params[key].shape) != shape:
            raise ValueError(f"params['{key}'] has shape {tuple(params[key].shape)}, expected {shape}")
    shn = params["shN"]
    if shn.dim() != 3 or shn.shape[0] != n or shn.shape[2] != 3:
        raise ValueError(f"params['shN'] has shape {tuple(shn.shape)}, expected ({n}, K, 3)")
    n_coeffs = 1 + shn.shape[1]
    if sh_degree < 0 or (sh_degree + 1) ** 2 > n_coeffs:
        raise ValueError(
            f"sh_degree={sh_degree} needs {(sh_degree + 1) ** 2} SH coefficients per channel but the "
            f"model has {n_coeffs} (sh0 + shN)"
        )
    c = viewmats.shape[0]
    if tuple(viewmats.shape) != (c, 4, 4):
        raise ValueError(f"viewmats has shape {tuple(viewmats.shape)}, expected (C, 4, 4)")
    if tuple(Ks.shape) != (c, 3, 3):
        raise ValueError(f"Ks has shape {tuple(Ks.shape)}, expected ({c}, 3, 3)")
    if tuple(backgrounds.shape) != (c, 3):
        raise ValueError(f"backgrounds has shape {tuple(backgrounds.shape)}, expected ({c}, 3)")
    if width <= 0 or height <= 0:
        raise ValueError(f"image size must be positive, got width={width}, height={height}")
