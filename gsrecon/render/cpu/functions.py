"""The CPU kernels as differentiable functions of tensors (float32, on the CPU).

Their backward passes are hand-written in C++ (``rasterize.cpp``, ``project.cpp``): autograd cannot see inside a
compiled per-pixel loop, and the explicit adjoint keeps one pass over the pixels and no per-pixel graph.
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import torch
from torch import Tensor

from gsrecon.render.cpu.kernels import load_kernels


class Projection(NamedTuple):
    """Screen-space Gaussians and their colours for ``C`` cameras (the torch renderer's `Projection` and colours)."""

    means2d: Tensor  # [C, N, 2] pixel coordinates of the centres (0 where not visible)
    conics: Tensor  # [C, N, 3] inverse 2D covariance (xx, xy, yy)
    depths: Tensor  # [C, N] camera-space z
    radii: Tensor  # [C, N, 2] int32 bounding-box half extents in pixels, 0 = not visible
    log_opacities: Tensor  # [C, N] ln(opacity) as composited (antialiased: with the compensation)
    colors: Tensor  # [C, N, 3] SH colours seen from each camera


class _Project(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, means, quats, log_scales, logits, sh0, shN, n_coeffs, viewmats, Ks, settings):
        outputs = load_kernels().project_forward(
            means, quats, log_scales, logits, sh0, shN, n_coeffs, viewmats, Ks, *settings
        )
        radii = outputs[3]
        ctx.save_for_backward(means, quats, log_scales, logits, sh0, shN, viewmats, Ks, radii)
        ctx.n_coeffs, ctx.settings = n_coeffs, settings
        ctx.mark_non_differentiable(radii)
        return tuple(outputs)

    @staticmethod
    def backward(ctx: Any, v_means2d, v_conics, v_depths, _v_radii, v_log_ops, v_colors):
        means, quats, log_scales, logits, sh0, shN, viewmats, Ks, radii = ctx.saved_tensors
        c, n = radii.shape[:2]
        shapes = ((c, n, 2), (c, n, 3), (c, n), (c, n), (c, n, 3))
        outputs = (v_means2d, v_conics, v_depths, v_log_ops, v_colors)
        grads = [g.contiguous() if g is not None else means.new_zeros(s) for g, s in zip(outputs, shapes)]
        pose_grad = ctx.needs_input_grad[7]
        inputs = (means, quats, log_scales, logits, sh0, shN, ctx.n_coeffs, viewmats, Ks, *ctx.settings, radii)
        g_means, g_quats, g_scales, g_logits, g_sh0, g_shN, g_viewmats = load_kernels().project_backward(
            *inputs, *grads, pose_grad
        )
        return g_means, g_quats, g_scales, g_logits, g_sh0, g_shN, None, g_viewmats if pose_grad else None, None, None


def project_pinhole(
    means: Tensor,  # [N, 3]
    quats: Tensor,  # [N, 4] (w, x, y, z), any non-zero norm
    log_scales: Tensor,  # [N, 3]
    logits: Tensor,  # [N] opacity logits
    sh0: Tensor,  # [N, 1, 3] SH coefficients of band 0
    shN: Tensor,  # [N, S, 3] and of the higher bands, of which the first K - 1 are rendered
    n_coeffs: int,  # K = (degree + 1)^2, the coefficients of the degree to render
    viewmats: Tensor,  # [C, 4, 4] world-to-camera
    Ks: Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    near_plane: float,
    far_plane: float,
    eps2d: float,
    antialiased: bool,
) -> Projection:
    """EWA projection into pinhole cameras and SH colours, as `gsrecon.render.torch_renderer.shade_gaussians`
    computes them; differentiable in the Gaussians' parameters and the camera poses (not the intrinsics). The SH
    bands come as the model stores them: no [N, K, 3] copy forward, no split of its gradient backward."""
    inputs = [t.float().contiguous() for t in (means, quats, log_scales, logits, sh0, shN)]
    cams = [viewmats.float().contiguous(), Ks.detach().float().contiguous()]
    settings = (width, height, near_plane, far_plane, eps2d, antialiased)
    return Projection(*_Project.apply(*inputs, n_coeffs, *cams, settings))


class _Rasterize(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, means2d, conics, log_ops, colors, depths, radii, settings, absgrad_of):
        out, median, *binning, last, trans = load_kernels().rasterize_forward(
            means2d, conics, log_ops, colors, depths, radii, *settings
        )
        ctx.save_for_backward(means2d, conics, log_ops, colors, depths, radii, *binning, last, trans)
        ctx.settings, ctx.absgrad_of = settings[:-1], absgrad_of
        ctx.mark_non_differentiable(median)
        return out, median

    @staticmethod
    def backward(ctx: Any, grad_out, _grad_median):
        saved = ctx.saved_tensors
        g_means2d, g_conics, g_log_ops, g_colors, g_depths, g_abs = load_kernels().rasterize_backward(
            *saved, grad_out.contiguous(), *ctx.settings
        )
        target = ctx.absgrad_of() if ctx.absgrad_of is not None else None
        if target is not None:
            target.absgrad = g_abs  # read by the strategies as gsplat's means2d.absgrad
        return g_means2d, g_conics, g_log_ops, g_colors, g_depths, None, None, None


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
    absgrad_of = weakref.ref(inputs[0]) if absgrad else None
    settings = (width, height, tile_size, alpha_max, median_depth)
    return _Rasterize.apply(*inputs, radii.int().contiguous(), settings, absgrad_of)
