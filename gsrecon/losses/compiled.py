"""The L1 and SSIM terms on the CPU kernels: each term's value and its gradient in one compiled call
(`gsrecon/render/cpu/image_loss.cpp`), instead of a graph of small tensor operations and their backward.

Used for float32 images on the CPU in a process that has loaded the kernels (the ``cpu`` renderer's set-up loads
them; a loss never builds them), where the photo and the mask need no gradient; the torch code of `l1.py` and
`ssim.py` serves every other case and is what the compiled terms are tested against.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from gsrecon.render.cpu.kernels import loaded_kernels


def compiled_kernels(pred: Tensor, gt: Tensor, mask: Tensor | None) -> ModuleType | None:
    """The loaded kernels where they can compute a term of these ``[B, H, W, 3]`` images, else None."""
    if pred.device.type != "cpu" or pred.dtype != torch.float32 or gt.dtype != torch.float32 or gt.requires_grad:
        return None
    if mask is not None and (mask.requires_grad or mask.device.type != "cpu"):
        return None
    return loaded_kernels()


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
