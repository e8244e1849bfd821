"""Training losses."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class LossConfig:
    ssim_lambda: float = 0.2  # loss = (1 - λ)·L1 + λ·(1 - SSIM)
    # > 0: adds λ × scene extent × mean |1 / rendered depth - 1 / z| at the SfM points each photo observed (gsplat's
    # depth_loss); needs a COLMAP model or triangulated points
    depth_lambda: float = 0.0


def ssim(pred: Tensor, gt: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mean SSIM (11x11 Gaussian window, sigma 1.5, as in 3DGS) of ``[B, H, W, 3]`` images in [0, 1].

    With ``mask`` ([B, H, W, 1], 1 where a pixel counts, 0 where it is ignored): the mean of the SSIM map over
    the kept pixels, both images' ignored pixels set to 0 first, so that nothing of them enters a window.
    """
    # Imported here: torchmetrics' image package loads torchvision (0.27 GB), which exports and renders never need.
    from torchmetrics.functional.image import structural_similarity_index_measure

    if mask is not None:
        pred, gt = pred * mask, gt * mask
    value, full = structural_similarity_index_measure(
        pred.permute(0, 3, 1, 2),
        gt.permute(0, 3, 1, 2),
        gaussian_kernel=True,
        sigma=1.5,
        kernel_size=11,
        data_range=1.0,
        return_full_image=True,
    )  # full: [B, 3, H, W]
    if mask is None:
        return value
    weights = mask.permute(0, 3, 1, 2).expand_as(full)  # [B, 3, H, W]
    return (full * weights).sum() / weights.sum().clamp_min(1.0)


def l1_loss(pred: Tensor, gt: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mean absolute difference of ``[B, H, W, 3]`` images, over the pixels ``mask`` ([B, H, W, 1]) keeps."""
    if mask is None:
        return (pred - gt).abs().mean()
    return ((pred - gt).abs() * mask).sum() / (mask.sum() * pred.shape[-1]).clamp_min(1.0)


def photometric_loss(pred: Tensor, gt: Tensor, ssim_lambda: float, mask: Tensor | None = None) -> dict[str, Tensor]:
    """The 3DGS loss ``(1 - λ)·L1 + λ·(1 - SSIM)`` on ``[B, H, W, 3]`` images, over the pixels ``mask``
    ([B, H, W, 1], 1 kept, 0 ignored; None: all) keeps.

    Returns ``loss`` (differentiable) and its terms ``l1`` and ``ssim`` (the SSIM value, not 1 - SSIM).
    """
    l1 = l1_loss(pred, gt, mask)
    ssim_value = ssim(pred, gt, mask) if ssim_lambda > 0 else torch.ones((), device=pred.device)
    loss = (1.0 - ssim_lambda) * l1 + ssim_lambda * (1.0 - ssim_value)
    return {"loss": loss, "l1": l1, "ssim": ssim_value}


def point_depth_loss(depth: Tensor, observed: list[Tensor]) -> Tensor | None:
    """Mean absolute difference of disparities (1 / depth) between the rendered ``depth`` [B, H, W, 1] and the
    points each view observed, ``observed[b]`` [P_b, 3] (pixel x, y with centres at +0.5, camera z), at the pixel
    each point lands in; points where nothing is rendered (depth 0) are left out. None where no point is left.

    The pixel's value, not a bilinear sample: next to a silhouette a bilinear sample would mix in the 0 of the
    empty side and ask for a depth that nothing has."""
    differences = []
    for view, points in zip(depth, observed):
        x, y = points[:, 0].long(), points[:, 1].long()  # [P] (non-negative coordinates: truncation is floor)
        rendered = view[y, x, 0]  # [P]
        hit = rendered > 0
        differences.append((1.0 / rendered[hit] - 1.0 / points[hit, 2]).abs())
    if sum(len(d) for d in differences) == 0:
        return None
    return torch.cat(differences).mean()
