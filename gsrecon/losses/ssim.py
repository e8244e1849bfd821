"""The D-SSIM photometric term, 1 - SSIM between the render and the photo (and the SSIM the metrics use)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor

from gsrecon.losses.base import LossInputs
from gsrecon.losses.compiled import CompiledTerm, compiled_kernels, compiled_term
from gsrecon.registry import LOSS_REGISTRY

WINDOW = 11  # the Gaussian window's side in pixels (3DGS's)
SIGMA = 1.5  # and its standard deviation
C1, C2 = 0.01**2, 0.03**2  # SSIM's stabilising constants for images in [0, 1]


@functools.cache
def gaussian_window(dtype: torch.dtype, device: torch.device) -> Tensor:
    """The normalised 1D Gaussian window [WINDOW] (not to be changed in place: one per dtype and device, made once
    instead of eight small operations every step); the 2D window is its outer product with itself."""
    with torch.inference_mode(False):  # a tensor autograd may save, even where the first call is in inference mode
        offsets = torch.arange(WINDOW, dtype=dtype, device=device) - WINDOW // 2
        weights = torch.exp(-0.5 * (offsets / SIGMA) ** 2)
        return weights / weights.sum()


def mirror_indices(size: int, pad: int, device: torch.device) -> Tensor:
    """The source index [size + 2 * pad] of each position of a row of ``size`` samples extended by ``pad`` on
    either side, mirrored at its ends without repeating them (``F.pad``'s ``reflect``) and, where ``pad`` is not
    below ``size``, mirrored again at the mirror's ends: the periodic extension of the reflection, which any
    ``size`` has (a single sample repeats)."""
    positions = torch.arange(-pad, size + pad, device=device)
    if size == 1:
        return torch.zeros_like(positions)
    period = 2 * (size - 1)
    positions = positions.remainder(period)
    return torch.where(positions < size, positions, period - positions)


def blur(maps: Tensor) -> Tensor:
    """``maps`` [B, C, H, W] averaged under the 2D Gaussian window, borders reflected: [B, C, H, W].

    Two 1D passes instead of one 11x11 convolution (the window is separable): 22 taps a pixel instead of 121, the
    same values up to float rounding. Images not wider or taller than half the window (``F.pad``'s reflection needs
    more) are reflected again at the reflection's ends (:func:`mirror_indices`), so that SSIM has a value at any
    size: the same values as the reflection where it exists."""
    pad = WINDOW // 2
    height, width = maps.shape[2:]
    if min(height, width) > pad:
        maps = F.pad(maps, (pad, pad, pad, pad), mode="reflect")
    else:
        rows, cols = mirror_indices(height, pad, maps.device), mirror_indices(width, pad, maps.device)
        maps = maps.index_select(2, rows).index_select(3, cols)
    channels = maps.shape[1]
    window = gaussian_window(maps.dtype, maps.device)
    maps = F.conv2d(maps, window.view(1, 1, WINDOW, 1).expand(channels, 1, WINDOW, 1), groups=channels)
    return F.conv2d(maps, window.view(1, 1, 1, WINDOW).expand(channels, 1, 1, WINDOW), groups=channels)


def ssim_map(pred: Tensor, gt: Tensor) -> Tensor:
    """The SSIM of every pixel and channel [B, 3, H, W] of ``[B, H, W, 3]`` images in [0, 1] (Wang et al. 2004,
    with the Gaussian window of 3DGS and the reflected borders of torchmetrics)."""
    x, y = pred.permute(0, 3, 1, 2), gt.permute(0, 3, 1, 2)  # [B, 3, H, W]
    # A target without gradient (the photos) is blurred without a graph: 6 of 15 channels' backward saved.
    with torch.set_grad_enabled(torch.is_grad_enabled() and gt.requires_grad):
        mu_y, yy = blur(torch.cat((y, y * y), dim=1)).chunk(2, dim=1)
    mu_x, xx, xy = blur(torch.cat((x, x * x, x * y), dim=1)).chunk(3, dim=1)
    var_x = (xx - mu_x * mu_x).clamp_min(0.0)
    var_y = (yy - mu_y * mu_y).clamp_min(0.0)
    cov = xy - mu_x * mu_y
    return ((2 * mu_x * mu_y + C1) * (2 * cov + C2)) / ((mu_x * mu_x + mu_y * mu_y + C1) * (var_x + var_y + C2))


def ssim(pred: Tensor, gt: Tensor, mask: Tensor | None = None, kernels: ModuleType | None = None) -> Tensor:
    """Mean SSIM (11x11 Gaussian window, sigma 1.5, as in 3DGS) of ``[B, H, W, 3]`` images in [0, 1].

    With ``mask`` ([B, H, W, 1], 1 where a pixel counts, 0 where it is ignored): the mean of the SSIM map over
    the kept pixels, both images' ignored pixels set to 0 first, so that nothing of them enters a window.

    On the ``kernels`` where given, `compiled_kernels` allows and the images are wider and taller than half the window.
    """
    kernels = compiled_kernels(pred, gt, mask, kernels)
    if kernels is not None and min(pred.shape[1:3]) > WINDOW // 2:
        window = gaussian_window(torch.float32, pred.device)
        return compiled_term(kernels, "ssim_loss", pred, gt, mask, window=window, c1=C1, c2=C2)
    if mask is None:
        return ssim_map(pred, gt).mean()
    full = ssim_map(pred * mask, gt * mask)  # [B, 3, H, W]
    weights = mask.permute(0, 3, 1, 2).expand_as(full)  # [B, 3, H, W]
    return (full * weights).sum() / weights.sum().clamp_min(1.0)


@LOSS_REGISTRY.register("ssim")
class SSIMTerm(CompiledTerm):
    """1 - SSIM of the render and the photo over the pixels the batch's masks keep."""

    @dataclass
    class Config(CompiledTerm.Config):
        weight: float = 0.2  # λ of the 3DGS loss

    def __call__(self, inputs: LossInputs) -> Tensor:
        return 1.0 - ssim(inputs.image, inputs.batch.images, inputs.batch.masks, self.kernels)
