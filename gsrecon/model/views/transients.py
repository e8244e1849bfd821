"""Transients without masks: what changes between photos (a passer-by, a car) set aside from the loss, per photo.

``views: {transients: {name: transients}}`` turns it on. Each step, it compares the render (after the per-view
modules before it, e.g. appearance) with each training photo and sets aside the pixels where they disagree in a
patch, as RobustNeRF's trimmed loss with its spatial rule does, from the residuals alone (no pretrained network):

1. a pixel is a candidate where its residual (the mean over channels of |render - photo|) exceeds both
   ``min_residual`` and ``factor`` x the photo's median residual (early in training, when every pixel is far off,
   the median is high and nothing is set aside);
2. holes are filled: a pixel at least half of whose 3x3 neighbourhood are candidates is one;
3. a ``patch`` x ``patch`` patch in which at least ``patch_fraction`` of the pixels are candidates is set aside whole,
   and so are the candidates in the patches next to it (the object's edge); candidates far from any such patch
   (thin edges the scene has not learnt yet, fine texture) stay in the loss.

A set-aside pixel of the render is replaced by the photo's own value, so every loss term (L1, SSIM, and any other
comparing the image with the photo) sees no difference there and no gradient reaches the Gaussians from it. The
module sets nothing aside in its first ``start`` training steps, while the scene takes shape: from the first step, a
hard part of the scene (a dark, detailed object on white paper) disagrees in patches before it is learnt and was set
aside for good (the statuette with distractors lost 0.8 dB, BENCHMARKS.md, issue 52). It has no parameters; its
checkpoint state is the count of steps it has seen. Test views are scored as rendered. ``hooks.TransientImages``
writes what it sets aside in each training photo after training (:mod:`gsrecon.hooks.transients`).

Measured at 1000 steps it cost PSNR on every capture tried, with and without distractors (it also sets aside what
the young scene has not learnt yet): off by default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from gsrecon.model.views.base import ViewModule
from gsrecon.registry import VIEW_REGISTRY

if TYPE_CHECKING:
    from gsrecon.data.pipeline import Batch


def set_aside(
    image: Tensor,
    photo: Tensor,
    factor: float,
    min_residual: float,
    patch: int,
    patch_fraction: float,
    mask: Tensor | None = None,
) -> Tensor:
    """[B, H, W, 1] bool: the pixels of ``photo`` [B, H, W, 3] that the render ``image`` [B, H, W, 3] disagrees with in
    a patch (the module's rule, see the module docstring); ``mask`` [B, H, W, 1] (1 kept) leaves its ignored pixels
    out of the statistics and never sets them aside."""
    residual = (image.detach() - photo).abs().mean(-1)  # [B, H, W]
    kept = torch.ones_like(residual, dtype=torch.bool) if mask is None else mask[..., 0] > 0  # [B, H, W]
    medians = torch.stack([r[k].median() if k.any() else r.new_tensor(math.inf) for r, k in zip(residual, kept)])
    threshold = torch.clamp(factor * medians, min=min_residual)  # [B]
    candidate = ((residual > threshold[:, None, None]) & kept).float()[:, None]  # [B, 1, H, W]
    filled_in = F.avg_pool2d(candidate, 3, stride=1, padding=1, count_include_pad=False) >= 0.5  # holes filled
    candidate = ((candidate > 0) | filled_in).float()
    height, width = candidate.shape[-2:]
    filled = F.avg_pool2d(candidate, patch, stride=patch, ceil_mode=True)  # [B, 1, h, w]: candidate fraction
    core = (filled >= patch_fraction).float()
    near = F.max_pool2d(core, 3, stride=1, padding=1)  # [B, 1, h, w]: a core patch or next to one

    def to_pixels(cells: Tensor) -> Tensor:
        return cells.repeat_interleave(patch, -2).repeat_interleave(patch, -1)[..., :height, :width] > 0

    aside = to_pixels(core) | (to_pixels(near) & (candidate > 0))  # [B, 1, H, W]
    return aside.permute(0, 2, 3, 1) & kept[..., None]


@VIEW_REGISTRY.register("transients")
class TransientWeights(ViewModule):
    """Sets aside, in each training photo, the patches where the render and the photo disagree (see the module
    docstring); the render keeps the photo's values there, so the loss ignores them."""

    @dataclass
    class Config(ViewModule.Config):
        lr: float = 0.0  # no parameters to learn
        factor: float = 3.0  # a candidate's residual exceeds this times the photo's median residual ...
        min_residual: float = 0.1  # ... and this (colour in [0, 1], the mean over channels)
        patch: int = 8  # patch side in pixels (at the resolution trained on)
        patch_fraction: float = 0.5  # a patch this full of candidates is set aside with the candidates next to it
        start: int = 500  # training steps with the module on before it sets anything aside (the scene takes shape)

        def __post_init__(self) -> None:
            super().__post_init__()
            for key in ("factor", "min_residual"):
                value = getattr(self, key)
                if not (math.isfinite(value) and value >= 0):
                    raise ValueError(f"{key} must be a finite number >= 0, got {value!r}")
            if self.min_residual > 1:
                raise ValueError(f"min_residual must be at most 1 (colours are in [0, 1]), got {self.min_residual}")
            if not (math.isfinite(self.patch_fraction) and 0 < self.patch_fraction <= 1):
                raise ValueError(f"patch_fraction must be in (0, 1], got {self.patch_fraction!r}")
            if self.patch < 1:
                raise ValueError(f"patch must be >= 1 pixel, got {self.patch}")
            if self.start < 0:
                raise ValueError(f"start must be >= 0 steps, got {self.start}")

    def __init__(self, cfg: Config, train_names: list[str]) -> None:
        super().__init__(cfg, train_names)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))  # training steps seen (checkpointed)

    def set_aside(self, image: Tensor, batch: Batch) -> Tensor:
        """[B, H, W, 1] bool: the pixels of ``batch``'s photos set aside from the render ``image`` [B, H, W, 3]."""
        cfg = self.cfg
        return set_aside(image, batch.images, cfg.factor, cfg.min_residual, cfg.patch, cfg.patch_fraction, batch.masks)

    def adjust_image(self, image: Tensor, batch: Batch) -> Tensor:
        """``image`` [B, H, W, 3] with the photo's values where :meth:`set_aside` sets pixels aside, once the module
        has seen ``start`` training steps (this is called once a step)."""
        self.steps += 1
        if self.steps <= self.cfg.start:
            return image
        return torch.where(self.set_aside(image, batch), batch.images, image)
