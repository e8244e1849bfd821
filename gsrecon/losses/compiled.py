"""The L1 and SSIM terms on the CPU kernels: each term's value and its gradient in one compiled call
(`gsrecon/kernels/image_loss.cpp`), instead of a graph of small tensor operations and their backward.

Used where the run chose them (:attr:`~gsrecon.component.RunSetup.compiled`: it renders with the ``cpu`` renderer,
whose set-up builds them) for float32 images on the CPU whose photo and mask need no gradient; the torch code of
`l1.py` and `ssim.py` serves every other case and is what the compiled terms are tested against.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from gsrecon.component import RunSetup
from gsrecon.kernels.build import load_kernels
from gsrecon.losses.base import LossTerm


def run_kernels(run: RunSetup) -> ModuleType | None:
    """The kernels where ``run`` takes the compiled path (:attr:`~gsrecon.component.RunSetup.compiled`), else None."""
    return load_kernels(run.log) if run.compiled else None


def compiled_kernels(pred: Tensor, gt: Tensor, mask: Tensor | None, kernels: ModuleType | None) -> ModuleType | None:
    """``kernels`` where they can compute a term of these ``[B, H, W, 3]`` images, else None."""
    if kernels is None or pred.device.type != "cpu" or pred.dtype != torch.float32 or gt.dtype != torch.float32:
        return None
    if gt.requires_grad or (mask is not None and (mask.requires_grad or mask.device.type != "cpu")):
        return None
    return kernels


class CompiledTerm(LossTerm):
    """A loss term with a compiled form: it takes the kernels where its run chose them (:func:`run_kernels`)."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.kernels: ModuleType | None = None  # the run's kernels (setup); None: the torch code

    def setup(self, run: RunSetup) -> None:
        self.kernels = run_kernels(run)


class _Term(torch.autograd.Function):
    """A loss term whose forward also computes its gradient in ``pred``; backward scales that."""

    @staticmethod
    def forward(ctx: Any, pred: Tensor, kernels: ModuleType, kernel: str, arguments: dict[str, Any]) -> Tensor:
        out = getattr(kernels, kernel)(pred=pred.contiguous(), **arguments)
        ctx.save_for_backward(out["grad"])
        return out["value"]

    @staticmethod
    def backward(ctx: Any, grad_value: Tensor) -> tuple[Tensor | None, None, None, None]:
        (grad,) = ctx.saved_tensors
        return grad * grad_value, None, None, None


def compiled_term(
    kernels: ModuleType,
    kernel: str,  # "l1_loss" or "ssim_loss"
    pred: Tensor,  # [B, H, W, 3] float32
    gt: Tensor,  # [B, H, W, 3] float32
    mask: Tensor | None,  # [B, H, W, 1], 1 where a pixel counts
    **settings: Any,  # the term's own arguments (ssim_loss: window, c1, c2)
) -> Tensor:
    """The term ``kernel`` of ``pred`` against ``gt`` over ``mask``'s pixels: a differentiable float32 scalar."""
    arguments = {
        "target": gt.contiguous(),
        "mask": None if mask is None else mask[..., 0].float().contiguous(),
        "with_grad": torch.is_grad_enabled() and pred.requires_grad,  # ctx.needs_input_grad holds under no_grad too
        **settings,
    }
    return _Term.apply(pred, kernels, kernel, arguments)
