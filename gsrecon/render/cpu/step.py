"""A training step of the ``cpu`` renderer whose loss is its L1 and SSIM terms, in two compiled calls: forward
projects, rasterizes, composites over the backgrounds and scores the image against its photo (each term's value and
its gradient in the image); backward weighs the two gradients by autograd's and goes back through the composite,
the rasterizer and the projection (``gsrecon/kernels/train_step.cpp``).

That is the arithmetic of the render (`gsrecon.render.cpu.renderer`) followed by the compiled terms
(`gsrecon.losses.compiled`), bit for bit, without the graph of tensor operations between them (the composite, the
depth, the terms' weights, and their backward); the step is what the trainer's forward (`gsrecon.engine.forward`)
calls where it applies (:meth:`FusedStep.__call__`).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gsrecon.data.pipeline import Batch
from gsrecon.params import check_params
from gsrecon.render.base import RenderOutput
from gsrecon.render.cpu.functions import call_kernel, projection_settings
from gsrecon.render.cpu.renderer import CpuRenderer

_INPUTS = ("means", "quats", "log_scales", "logits", "sh0", "shN")
_PARAMS = ("means", "quats", "scales", "opacities", "sh0", "shN")  # the model's names of the same, in that order
_STATE = (
    *("means2d", "conics", "depths", "radii", "log_opacities", "colors"),
    *("offsets", "ids", "first", "slots", "last", "trans_final"),
)


@dataclass(frozen=True)
class StepTerms:
    """The loss a fused step computes: the keys of the run's L1 and SSIM terms with their weights (None: the loss has
    no such term), and SSIM's settings (`gsrecon.losses.ssim`)."""

    l1: tuple[str, float] | None
    ssim: tuple[str, float] | None
    window: Tensor  # [taps] SSIM's normalised 1D Gaussian window (float32, on the CPU)
    c1: float
    c2: float
    l1_first: bool = True  # the L1 term comes before the SSIM term in the loss's order


class _ScreenGrads:
    """Where backward puts the gradients of the screen-space centres: the ``means2d`` the strategies read."""

    def __init__(self, absgrad: bool) -> None:
        self.means2d: weakref.ref[Tensor] | None = None  # set once the leaf exists, after forward
        self.absgrad = absgrad  # also set means2d.absgrad (AbsGS)


def _weight(grad: Tensor | None) -> float:
    """Autograd's gradient of a term's value as the weight of the term's image gradient (0: the term is not used)."""
    return 0.0 if grad is None else float(grad)


class _TrainStep(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, means, quats, log_scales, logits, sh0, shN, arguments, screen):
        gaussians = dict(zip(_INPUTS, (means, quats, log_scales, logits, sh0, shN)))
        out = call_kernel("step_forward", **gaussians, **arguments["forward"])
        ctx.save_for_backward(*gaussians.values(), *(out[k] for k in _STATE))
        ctx.term_grads = {"l1_grad": out["l1_grad"], "ssim_grad": out["ssim_grad"]}
        ctx.arguments = arguments["backward"]
        ctx.screen = screen
        zero = means.new_zeros(())
        values = (out["l1"] if out["l1"] is not None else zero, out["ssim"] if out["ssim"] is not None else zero)
        alpha = out["composited"][..., 4:5]
        rendered = (out["image"], alpha, out["depth"], out["means2d"], out["radii"], out["depths"])
        ctx.mark_non_differentiable(*rendered)
        return (*values, *rendered)

    @staticmethod
    def backward(ctx: Any, grad_l1, grad_ssim, *_rendered):
        saved = ctx.saved_tensors
        gaussians = dict(zip(_INPUTS, saved[: len(_INPUTS)]))
        state = dict(zip(_STATE, saved[len(_INPUTS) :]))
        weights = {"l1_weight": _weight(grad_l1), "ssim_weight": _weight(grad_ssim)}
        out = call_kernel("step_backward", **gaussians, **ctx.arguments, **state, **ctx.term_grads, **weights)
        target = ctx.screen.means2d() if ctx.screen.means2d is not None else None
        if target is not None:
            target.grad = out["means2d"]
            if ctx.screen.absgrad:
                target.absgrad = out["abs_means2d"]  # read by the strategies as gsplat's means2d.absgrad
        return (*(out[name] for name in _INPUTS), None, None)


class FusedStep:
    """The render of a training batch and its L1 and SSIM terms from the ``cpu`` renderer's two step calls."""

    def __init__(self, renderer: CpuRenderer, terms: StepTerms) -> None:
        self.cfg = renderer.cfg
        self.terms = terms

    def applies(self, params: Mapping[str, Tensor], batch: Batch) -> bool:
        """Whether this step can take ``batch``: float32 Gaussians and photos on the CPU, pinhole cameras whose
        intrinsics and poses need no gradient, images larger than half the SSIM window, and gradients enabled."""
        cameras = batch.cameras
        return (
            torch.is_grad_enabled()
            and params["means"].dtype == torch.float32
            and params["means"].device.type == "cpu"
            and batch.images.dtype == torch.float32
            and cameras.model.kind == "pinhole"
            and not cameras.Ks.requires_grad
            and not cameras.viewmats.requires_grad
            and (self.terms.ssim is None or min(cameras.width, cameras.height) > len(self.terms.window) // 2)
        )

    def __call__(
        self, params: Mapping[str, Tensor], batch: Batch, sh_degree: int
    ) -> tuple[RenderOutput, dict[str, Tensor]]:
        """The render of ``batch`` (image, alpha, depth and the strategies' info; none of them differentiable) and
        ``{key: weight × value}`` of the terms, differentiable in ``params``. Call where :meth:`applies`."""
        check_params(params)
        cfg, cameras, terms = self.cfg, batch.cameras, self.terms
        shared = {
            "viewmats": cameras.viewmats.float().contiguous(),
            "Ks": cameras.Ks.float().contiguous(),
            **projection_settings(cameras, sh_degree, cfg),
            "tile_size": cfg.tile_size,
            "alpha_max": cfg.alpha_max,
        }
        backgrounds = batch.backgrounds.float().contiguous()
        photos = {
            "photos": batch.images.contiguous(),
            "mask": None if batch.masks is None else batch.masks[..., 0].float().contiguous(),
            "backgrounds": backgrounds,
            "l1": terms.l1 is not None,
            "window": None if terms.ssim is None else terms.window,
            "c1": terms.c1,
            "c2": terms.c2,
        }
        arguments = {"forward": {**shared, **photos}, "backward": {**shared, "backgrounds": backgrounds}}
        screen = _ScreenGrads(cfg.absgrad)
        inputs = [params[name].contiguous() for name in _PARAMS]
        l1, ssim, image, alpha, depth, means2d, radii, depths = _TrainStep.apply(*inputs, arguments, screen)
        means2d = means2d.requires_grad_()  # a leaf: backward sets its .grad (and .absgrad), as a render's has
        screen.means2d = weakref.ref(means2d)
        info = {
            "means2d": means2d,
            "radii": radii,
            "depths": depths,
            "width": cameras.width,
            "height": cameras.height,
            "n_cameras": len(cameras),
            "gaussian_ids": None,
        }
        values = {}
        if terms.l1 is not None:
            values[terms.l1[0]] = terms.l1[1] * l1
        if terms.ssim is not None:
            values[terms.ssim[0]] = terms.ssim[1] * (1.0 - ssim)
        if not terms.l1_first:
            values = dict(reversed(values.items()))
        return RenderOutput(image=image, alpha=alpha, depth=depth, info=info), values
