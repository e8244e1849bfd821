"""The D-SSIM photometric term, 1 - SSIM between the render and the photo (and the SSIM the metrics use)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from gsrecon.losses.base import LossInputs, LossTerm
from gsrecon.registry import LOSS_REGISTRY


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


@LOSS_REGISTRY.register("ssim")
class SSIMTerm(LossTerm):
    """1 - SSIM of the render and the photo over the pixels the batch's masks keep."""

    @dataclass
    class Config(LossTerm.Config):
        weight: float = 0.2  # λ of the 3DGS loss

    def __call__(self, inputs: LossInputs) -> Tensor:
        return 1.0 - ssim(inputs.image, inputs.batch.images, inputs.batch.masks)
