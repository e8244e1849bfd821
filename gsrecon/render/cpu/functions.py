"""The CPU kernels as differentiable functions of tensors (float32, on the CPU).

Their backward passes are hand-written in C++ (``rasterize.cpp``, ``project.cpp``): autograd cannot see inside a
compiled per-pixel loop, and the explicit adjoint keeps one pass over the pixels and no per-pixel graph. Arguments
cross into C++ by keyword and come back as dicts of named tensors (``kernels.h`` declares both sides).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import torch
from torch import Tensor

from gsrecon.cameras import Cameras
from gsrecon.errors import InputError
from gsrecon.kernels.build import load_kernels
from gsrecon.render.base import RendererConfig


class KernelInputError(InputError):
    """A tensor that reached the kernels had the wrong dtype, shape or layout (the message names the argument)."""


class Projection(NamedTuple):
    """Screen-space Gaussians and their colours for ``C`` cameras (the torch renderer's `Projection` and colours)."""

    means2d: Tensor  # [C, N, 2] pixel coordinates of the centres (0 where not visible)
    conics: Tensor  # [C, N, 3] inverse 2D covariance (xx, xy, yy)
    depths: Tensor  # [C, N] camera-space z
    radii: Tensor  # [C, N, 2] int32 bounding-box half extents in pixels, 0 = not visible
    log_opacities: Tensor  # [C, N] ln(opacity) as composited (antialiased: with the compensation)
    colors: Tensor  # [C, N, 3] SH colours seen from each camera


@functools.cache
def _kernels() -> ModuleType:
    """The loaded kernels, looked up once: `load_kernels` hashes the sources to name them (ms a call, four a step)."""
    return load_kernels()


def call_kernel(kernel: str, **arguments: Any) -> dict[str, Tensor]:
    """The kernel ``kernel`` called with ``arguments``; its checks' ValueError as a one-line KernelInputError."""
    try:
        return getattr(_kernels(), kernel)(**arguments)
    except ValueError as exc:
        raise KernelInputError(f"cpu renderer, {kernel}: {str(exc).splitlines()[0]}") from None


_GAUSSIANS = ("means", "quats", "log_scales", "logits", "sh0", "shN")


class _Project(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, means, quats, log_scales, logits, sh0, shN, viewmats, Ks, settings):
        out = call_kernel(
            "project_forward", **dict(zip(_GAUSSIANS, (means, quats, log_scales, logits, sh0, shN))),
            viewmats=viewmats, Ks=Ks, **settings,
        )  # fmt: skip
        ctx.save_for_backward(means, quats, log_scales, logits, sh0, shN, viewmats, Ks, out["radii"])
        ctx.settings = settings
        ctx.mark_non_differentiable(out["radii"])
        return tuple(out[name] for name in Projection._fields)

    @staticmethod
    def backward(ctx: Any, v_means2d, v_conics, v_depths, _v_radii, v_log_opacities, v_colors):
        *gaussians, viewmats, Ks, radii = ctx.saved_tensors
        c, n = radii.shape[:2]
        wanted = {
            "v_means2d": (v_means2d, (c, n, 2)),
            "v_conics": (v_conics, (c, n, 3)),
            "v_depths": (v_depths, (c, n)),
            "v_log_opacities": (v_log_opacities, (c, n)),
            "v_colors": (v_colors, (c, n, 3)),
        }
        grads = {k: g.contiguous() if g is not None else radii.new_zeros(s, dtype=torch.float32)
                 for k, (g, s) in wanted.items()}  # fmt: skip
        pose_grad = ctx.needs_input_grad[6]
        out = call_kernel(
            "project_backward", **dict(zip(_GAUSSIANS, gaussians)), viewmats=viewmats, Ks=Ks, **ctx.settings,
            radii=radii, **grads, pose_grad=pose_grad,
        )  # fmt: skip
        return (*(out[name] for name in _GAUSSIANS), out["viewmats"] if pose_grad else None, None, None)


def project_pinhole(
    means: Tensor,  # [N, 3]
    quats: Tensor,  # [N, 4] (w, x, y, z), any non-zero norm
    log_scales: Tensor,  # [N, 3]
    logits: Tensor,  # [N] opacity logits
    sh0: Tensor,  # [N, 1, 3] SH coefficients of band 0
    shN: Tensor,  # [N, S, 3] and of the higher bands, of which the first (sh_degree + 1)^2 - 1 are rendered
    sh_degree: int,
    cameras: Cameras,  # C pinhole cameras
    cfg: RendererConfig,  # near_plane, far_plane, eps2d, antialiased
) -> Projection:
    """EWA projection into pinhole cameras and SH colours, as `gsrecon.render.torch_renderer.shade_gaussians`
    computes them; differentiable in the Gaussians' parameters and the camera poses (not the intrinsics). The SH
    bands come as the model stores them: no [N, K, 3] copy forward, no split of its gradient backward."""
    inputs = [t.float().contiguous() for t in (means, quats, log_scales, logits, sh0, shN)]
    viewmats, Ks = cameras.viewmats.float().contiguous(), cameras.Ks.detach().float().contiguous()
    return Projection(*_Project.apply(*inputs, viewmats, Ks, projection_settings(cameras, sh_degree, cfg)))


def projection_settings(cameras: Cameras, sh_degree: int, cfg: RendererConfig) -> dict[str, Any]:
    """The projection kernels' settings (besides the tensors) for ``cameras`` at ``sh_degree``."""
    return {
        "width": cameras.width,
        "height": cameras.height,
        "sh_degree": sh_degree,
        "near_plane": cfg.near_plane,
        "far_plane": cfg.far_plane,
        "eps2d": cfg.eps2d,
        "antialiased": cfg.antialiased,
    }


_SPLATS = ("means2d", "conics", "log_opacities", "colors", "depths")
_BINNING = ("offsets", "ids", "first", "slots", "last", "trans_final")


class _Rasterize(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, means2d, conics, log_opacities, colors, depths, radii, settings, absgrad_of):
        splats = dict(zip(_SPLATS, (means2d, conics, log_opacities, colors, depths)))
        out = call_kernel("rasterize_forward", **splats, radii=radii, **settings)
        ctx.save_for_backward(means2d, conics, log_opacities, colors, depths, radii, *(out[k] for k in _BINNING))
        ctx.settings = {k: v for k, v in settings.items() if k != "median_depth"}
        ctx.absgrad_of = absgrad_of
        ctx.mark_non_differentiable(out["median"])
        return out["image"], out["median"]

    @staticmethod
    def backward(ctx: Any, grad_image, _grad_median):
        saved = ctx.saved_tensors
        inputs = dict(zip((*_SPLATS, "radii", *_BINNING), saved))
        out = call_kernel("rasterize_backward", **inputs, grad_image=grad_image.contiguous(), **ctx.settings)
        target = ctx.absgrad_of() if ctx.absgrad_of is not None else None
        if target is not None:
            target.absgrad = out["abs_means2d"]  # read by the strategies as gsplat's means2d.absgrad
        return (*(out[k] for k in _SPLATS), None, None, None)


def rasterize(
    means2d: Tensor,  # [C, N, 2]
    conics: Tensor,  # [C, N, 3]
    log_opacities: Tensor,  # [C, N]
    colors: Tensor,  # [C, N, 3]
    depths: Tensor,  # [C, N]
    radii: Tensor,  # [C, N, 2] int32, 0 = not visible
    width: int,
    height: int,
    tile_size: int,
    alpha_max: float,
    median_depth: bool = False,
    absgrad: bool = False,
) -> tuple[Tensor, Tensor]:
    """Composite the visible Gaussians front to back: ``[C, H, W, 5]`` (premultiplied rgb, sum of w z, alpha
    ``1 - T``; no background) and the median depth ``[C, H, W]`` (0 unless ``median_depth``, not differentiable).

    Conventions are the torch renderer's `rasterize_tiles`: pixel centres at +0.5, alpha clamped to ``alpha_max``,
    alpha below 1/255 skipped, a pixel stops before the Gaussian that would take its transmittance to 1e-4 or
    below. With ``absgrad``, backward also sets ``means2d.absgrad`` [C, N, 2], the sum over pixels of the absolute
    gradient of ``means2d`` (AbsGS); ``means2d`` is then used as given (it must be float32 and contiguous).
    """
    inputs = [t.float().contiguous() for t in (means2d, conics, log_opacities, colors, depths)]
    absgrad_of: Callable[[], Tensor | None] | None = weakref.ref(inputs[0]) if absgrad else None
    settings = {"width": width, "height": height, "tile_size": tile_size, "alpha_max": alpha_max,
                "median_depth": median_depth}  # fmt: skip
    return _Rasterize.apply(*inputs, radii.int().contiguous(), settings, absgrad_of)
