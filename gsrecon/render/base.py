"""The renderer interface every renderer shares (gsplat's CUDA one, the compiled CPU one, the pure-PyTorch reference,
plugins)."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor

from gsrecon.cameras import Cameras
from gsrecon.component import RunChecked
from gsrecon.params import check_params

if TYPE_CHECKING:
    from gsrecon.data.pipeline import Batch


@dataclass
class RendererConfig:
    """Settings every renderer shares; each renderer's nested ``Config`` extends it."""

    near_plane: float = 0.01  # Gaussians with camera z at or below this are culled
    far_plane: float = 1e10  # ... and at or above this
    eps2d: float = 0.3  # px^2 added to the 2D covariance (low-pass filter of 3DGS)
    tile_size: int = 16  # px; rasterization works on tile_size x tile_size pixel blocks
    antialiased: bool = False  # Mip-Splatting opacity compensation for the eps2d dilation (gsplat "antialiased")
    median_depth: bool = False  # also render RenderOutput.median_depth (a surface's depth; costs render time)

    def __post_init__(self) -> None:
        if not 0.0 < self.near_plane < self.far_plane:
            raise ValueError(
                f"renderer near_plane={self.near_plane} / far_plane={self.far_plane}: need 0 < near_plane < far_plane"
            )
        if self.eps2d < 0.0:
            raise ValueError(f"renderer eps2d={self.eps2d} must be >= 0")
        if self.tile_size < 1:
            raise ValueError(f"renderer tile_size={self.tile_size} must be >= 1")


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
    # [C, H, W, 1], the depth of the Gaussian at which the accumulated opacity crosses 1/2 (a surface, where the
    # expected depth blends the surfaces a pixel sees); 0 where it stays below 1/2. None unless the renderer's
    # median_depth setting asks for it. Not differentiable.
    median_depth: Tensor | None = None


class Renderer(abc.ABC, RunChecked):
    """Renders Gaussians given in pre-activation form (see :mod:`gsrecon.params`).

    ``params`` maps ``means`` [N, 3], ``scales`` [N, 3] (log), ``quats`` [N, 4] (w, x, y, z, not
    necessarily unit), ``opacities`` [N] (logit), ``sh0`` [N, 1, 3] and ``shN`` [N, K-1, 3]; the
    renderer applies exp / sigmoid / normalisation itself. Subclasses define a nested ``Config``
    dataclass extending :class:`RendererConfig`, are constructed as ``Renderer(cfg)`` and
    implement :meth:`_render`; :meth:`render` checks the inputs first. Expensive or fallible preparation (building
    kernels) belongs in :meth:`~gsrecon.component.RunChecked.setup`, which runs before the first render; a renderer
    may be set up without a run's data (``run.data`` None) to draw a trained scene.
    """

    @property
    def sparse_grad(self) -> bool:
        """Whether backward leaves sparse gradients on the Gaussian parameters (then training uses
        `gsrecon.model.optim.RowSparseAdam`). False unless a renderer says otherwise."""
        return False

    @property
    def compiled(self) -> bool:
        """Whether it draws with gsrecon's compiled CPU kernels (:mod:`gsrecon.kernels`): then its run's loss terms and
        metrics take them too (:attr:`~gsrecon.component.RunSetup.compiled`). False unless a renderer says otherwise."""
        return False

    def render(
        self,
        params: Mapping[str, Tensor],
        cameras: Cameras,
        sh_degree: int,
        backgrounds: Tensor | None = None,  # [C, 3]; None: black
    ) -> RenderOutput:
        """Render the ``C`` ``cameras`` using SH up to ``sh_degree``; through fisheye cameras, the images are what
        the lenses see (not undistorted).

        Raises ValueError naming the offending input when shapes or sizes are inconsistent.
        """
        model_degree = check_params(params)
        if not 0 <= sh_degree <= model_degree:
            raise ValueError(f"sh_degree={sh_degree} is not between 0 and the model's SH degree {model_degree}")
        if not isinstance(cameras, Cameras):
            raise ValueError(f"cameras must be a Cameras, got {type(cameras).__name__}")
        c = len(cameras)
        if backgrounds is None:
            backgrounds = params["means"].new_zeros(c, 3)
        if tuple(backgrounds.shape) != (c, 3):
            raise ValueError(f"backgrounds has shape {tuple(backgrounds.shape)}, expected ({c}, 3)")
        return self._render(params, cameras, sh_degree, backgrounds)

    def render_batch(self, params: Mapping[str, Tensor], batch: Batch, sh_degree: int) -> RenderOutput:
        """Render ``batch``'s cameras over its backgrounds (see :meth:`render`)."""
        return self.render(params, batch.cameras, sh_degree, batch.backgrounds)

    @abc.abstractmethod
    def _render(
        self, params: Mapping[str, Tensor], cameras: Cameras, sh_degree: int, backgrounds: Tensor
    ) -> RenderOutput:
        """:meth:`render` for inputs already checked (``backgrounds`` [C, 3] given)."""
