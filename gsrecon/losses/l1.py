"""The L1 photometric term: the mean absolute difference between the render and the photo."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from torch import Tensor

from gsrecon.losses.base import LossInputs
from gsrecon.losses.compiled import CompiledTerm, compiled_kernels, compiled_term
from gsrecon.registry import LOSS_REGISTRY


def l1_loss(pred: Tensor, gt: Tensor, mask: Tensor | None = None, kernels: ModuleType | None = None) -> Tensor:
    """Mean absolute difference of ``[B, H, W, 3]`` images, over the pixels ``mask`` ([B, H, W, 1]) keeps (on the
    ``kernels`` where given and `compiled_kernels` allows)."""
    kernels = compiled_kernels(pred, gt, mask, kernels)
    if kernels is not None:
        return compiled_term(kernels, "l1_loss", pred, gt, mask)
    if mask is None:
        return (pred - gt).abs().mean()
    return ((pred - gt).abs() * mask).sum() / (mask.sum() * pred.shape[-1]).clamp_min(1.0)


@LOSS_REGISTRY.register("l1")
class L1Term(CompiledTerm):
    """Mean |render - photo| over the pixels the batch's masks keep."""

    @dataclass
    class Config(CompiledTerm.Config):
        weight: float = 0.8  # 1 - λ of the 3DGS loss

    def __call__(self, inputs: LossInputs) -> Tensor:
        return l1_loss(inputs.image, inputs.batch.images, inputs.batch.masks, self.kernels)
