"""Training losses."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torchmetrics.functional.image import structural_similarity_index_measure


@dataclass
class LossConfig:
    ssim_lambda: float = 0.2  # loss = (1 - λ)·L1 + λ·(1 - SSIM)


def ssim(pred: Tensor, gt: Tensor) -> Tensor:
    """Mean SSIM (11x11 Gaussian window, sigma 1.5, as in 3DGS) of ``[B, H, W, 3]`` images in [0, 1]."""
    return structural_similarity_index_measure(
        pred.permute(0, 3, 1, 2),
        gt.permute(0, 3, 1, 2),
        gaussian_kernel=True,
        sigma=1.5,
        kernel_size=11,
        data_range=1.0,
    )


def photometric_loss(pred: Tensor, gt: Tensor, ssim_lambda: float) -> dict[str, Tensor]:
    """The 3DGS loss ``(1 - λ)·L1 + λ·(1 - SSIM)`` on ``[B, H, W, 3]`` images.

    Returns ``loss`` (differentiable) and its terms ``l1`` and ``ssim`` (the SSIM value, not 1 - SSIM).
    """
    l1 = (pred - gt).abs().mean()
    ssim_value = ssim(pred, gt) if ssim_lambda > 0 else torch.ones((), device=pred.device)
    loss = (1.0 - ssim_lambda) * l1 + ssim_lambda * (1.0 - ssim_value)
    return {"loss": loss, "l1": l1, "ssim": ssim_value}
