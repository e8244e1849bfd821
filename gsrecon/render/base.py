"""The renderer interface shared by the gsplat (CUDA), compiled CPU and pure-PyTorch renderers."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor

from gsrecon.data.scene import PINHOLE, CameraModel
from gsrecon.model.params import check_params

if TYPE_CHECKING:
    from gsrecon.logging.console import Logger


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


class Renderer(abc.ABC):
    """Renders Gaussians given in pre-activation form (see `gsrecon.model.gaussians`).

    ``params`` maps ``means`` [N, 3], ``scales`` [N, 3] (log), ``quats`` [N, 4] (w, x, y, z, not
    necessarily unit), ``opacities`` [N] (logit), ``sh0`` [N, 1, 3] and ``shN`` [N, K-1, 3]; the
    renderer applies exp / sigmoid / normalisation itself. Subclasses define a nested ``Config``
    dataclass extending :class:`RendererConfig`, are constructed as ``Renderer(cfg)`` and
    implement :meth:`_render`; :meth:`render` checks the inputs first.
    """

    @property
    def sparse_grad(self) -> bool:
        """Whether backward leaves sparse gradients on the Gaussian parameters (then training uses
        `gsrecon.model.optim.RowSparseAdam`). False unless a renderer says otherwise."""
        return False

    def setup(self, logger: Logger) -> None:
        """Prepare before the first `render` (e.g. build kernels, reporting through ``logger``).

        The default does nothing; renderers with expensive or fallible preparation override it.
        """

    def render(
        self,
        params: Mapping[str, Tensor],
        viewmats: Tensor,  # [C, 4, 4] world-to-camera, OpenCV convention
        Ks: Tensor,  # [C, 3, 3] intrinsics in pixels (of ``camera_model``)
        width: int,
        height: int,
        sh_degree: int,
        backgrounds: Tensor,  # [C, 3]
        *,
        camera_model: CameraModel = PINHOLE,  # the C cameras' model: pinholes, or fisheye lenses (coeffs [C, 4])
    ) -> RenderOutput:
        """Render ``C`` cameras of size ``width`` x ``height`` using SH up to ``sh_degree``; through a fisheye
        ``camera_model``, ``Ks`` are the lenses' intrinsics and the images are what the lenses see (not undistorted).

        Raises ValueError naming the offending input when shapes or sizes are inconsistent.
        """
        model_degree = check_params(params)
        if not 0 <= sh_degree <= model_degree:
            raise ValueError(f"sh_degree={sh_degree} is not between 0 and the model's SH degree {model_degree}")
        c = viewmats.shape[0]
        if tuple(viewmats.shape) != (c, 4, 4):
            raise ValueError(f"viewmats has shape {tuple(viewmats.shape)}, expected (C, 4, 4)")
        if tuple(Ks.shape) != (c, 3, 3):
            raise ValueError(f"Ks has shape {tuple(Ks.shape)}, expected ({c}, 3, 3)")
        if tuple(backgrounds.shape) != (c, 3):
            raise ValueError(f"backgrounds has shape {tuple(backgrounds.shape)}, expected ({c}, 3)")
        if width <= 0 or height <= 0:
            raise ValueError(f"image size must be positive, got width={width}, height={height}")
        if not isinstance(camera_model, CameraModel):
            raise ValueError(f"camera_model must be a CameraModel, got {type(camera_model).__name__}")
        if camera_model.kind == "fisheye" and tuple(camera_model.coeffs.shape) != (c, 4):
            raise ValueError(
                f"fisheye camera_model coeffs have shape {tuple(camera_model.coeffs.shape)}, expected ({c}, 4)"
            )
        return self._render(params, viewmats, Ks, width, height, sh_degree, backgrounds, camera_model=camera_model)

    @abc.abstractmethod
    def _render(
        self,
        params: Mapping[str, Tensor],
        viewmats: Tensor,
        Ks: Tensor,
        width: int,
        height: int,
        sh_degree: int,
        backgrounds: Tensor,
        *,
        camera_model: CameraModel,
    ) -> RenderOutput:
        """:meth:`render` for inputs already checked."""
