"""RobustFilter: transients set aside by a running percentile of the residuals (RobustNeRF's rule as SpotLessSplats
ships it), without features or masks from files.

``views: {robust: {}}`` turns it on. Each training step:

1. a pixel's residual is the mean over channels of |render - photo|; it is an inlier under the ``threshold``, the
   ``percentile`` (0.7) of the residuals of every training pixel seen so far, read off a histogram of ``bins``
   (10,000) bins over [0, 1] whose counts decay by ``ema`` (0.95) a step (the threshold of a step is the one the steps
   before it left: the first step keeps every pixel);
2. a ``vote`` x ``vote`` (3 x 3) vote: a pixel is kept where it is an inlier or more than half of its neighbourhood
   (counted over the window, the frame's outside as outliers) are;
3. a warm-up: the kept mask is mixed with all-ones by a Bernoulli draw, each pixel kept with probability
   ``a + (1 - a) kept``, ``a = exp(-warmup_rate floor((step + 1) / 1.5))`` (3e-3: a = 0.14 at step 1000,
   0.018 at 2000); ``warmup_rate: 0`` is no warm-up (the mask from the first step);
4. a set-aside pixel of the render is replaced by the photo's value, so the L1 term is the masked L1 of the papers
   (the mean over all pixels of kept x |render - photo|) and no gradient reaches the Gaussians from it; the pixel
   still counts in the histogram (what sets it aside is how far it is).

Why a per-view module and not a loss term: the rule's state (the histogram, the step count of the warm-up) must be in
the checkpoint for an exact resume, and per-view modules' state is (loss terms hold none); it sees the render after
the modules before it (appearance, the sky of ``environment``, so the sky's residual is the composite's), and the
batch's masks from files: an ignored pixel is left out of the histogram and is never set aside (the loss ignores it
already). The papers' loss is the masked L1 alone and their opacity resets are off: a run with an SSIM term, or a
default strategy resetting opacities within the run, is refused with what to set. Renders drawn without gradients
(the ``multiview`` strategy's scoring) are masked with the present threshold, without the draw, and leave the
state as it is. Test views are scored as rendered. With it on, the strategies hold growth back
(``strategy.transient_growth_start``): RobustSplat's delayed growth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from gsrecon.component import RunFacts
from gsrecon.model.views.base import ViewModule
from gsrecon.registry import VIEW_REGISTRY

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from gsrecon.data.pipeline import Batch
    from gsrecon.model.views.base import RenderFn, ViewModules
    from gsrecon.render.base import RenderOutput

MAX_BINS = 1_000_000  # histogram bins: 1e-6 of a colour's range, finer than any 16-bit photo


def inlier_mask(residual: Tensor, threshold: Tensor, vote: int) -> Tensor:
    """[B, H, W] bool: the pixels kept of ``residual`` [B, H, W] under ``threshold`` (a scalar): inliers, and the
    pixels more than half of whose ``vote`` x ``vote`` neighbourhood are inliers (1: the inliers only)."""
    inlier = residual < threshold  # [B, H, W]
    if vote == 1:
        return inlier
    share = F.avg_pool2d(inlier.float()[:, None], vote, stride=1, padding=vote // 2, count_include_pad=True)
    return inlier | (share[:, 0] > 0.5)


def percentile_of(histogram: Tensor, percentile: float) -> Tensor:
    """The scalar residual (in [0, 1]) under which ``percentile`` of the counts of ``histogram`` [bins] over [0, 1]
    lie: the lower edge of the first bin at which the cumulative count reaches that share; 1 when it is empty."""
    total = histogram.sum()
    if total <= 0:
        return histogram.new_ones(())
    first = torch.searchsorted(histogram.cumsum(0), percentile * total)  # the first bin reaching the share
    return first.clamp_max(len(histogram) - 1).to(histogram.dtype) / len(histogram)


def warmup_share(rate: float, step: int) -> float:
    """The share ``a`` of all-ones mixed into the mask at training ``step`` (0-based):
    exp(-rate floor((step+1)/1.5))."""
    return math.exp(-rate * math.floor((step + 1) / 1.5))


@VIEW_REGISTRY.register("robust")
class RobustFilter(ViewModule):
    """Sets aside, in each training photo, the pixels whose residual is above a running percentile of all residuals,
    after a 3 x 3 vote and a warm-up (see the module docstring); the render keeps the photo's values there."""

    sets_transients_aside = True

    @dataclass
    class Config(ViewModule.Config):
        lr: float = 0.0  # no parameters to learn
        percentile: float = 0.7  # a pixel is an inlier under this percentile of the residuals, in (0, 1)
        ema: float = 0.95  # the histogram's counts are multiplied by this each step before the step's are added
        bins: int = 10_000  # histogram bins over residuals [0, 1]: the threshold's resolution
        vote: int = 3  # the side of the neighbourhood vote (odd; 1: no vote)
        warmup_rate: float = 3e-3  # the decay rate of the Bernoulli warm-up, per 1.5 steps; 0: no warm-up

        def __post_init__(self) -> None:
            super().__post_init__()
            for key in ("percentile", "ema", "warmup_rate"):
                value = getattr(self, key)
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError(f"{key} must be a number, got {value!r}")
            for key in ("bins", "vote"):
                value = getattr(self, key)
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(f"{key} must be an integer, got {value!r}")
            if not 0 < self.percentile < 1:  # NaN fails too
                raise ValueError(f"percentile must be in (0, 1), got {self.percentile!r}")
            if not 0 <= self.ema < 1:
                raise ValueError(f"ema must be in [0, 1) (the share of the counts kept each step), got {self.ema!r}")
            if not 2 <= self.bins <= MAX_BINS:
                raise ValueError(f"bins must be between 2 and {MAX_BINS}, got {self.bins}")
            if self.vote < 1 or self.vote % 2 == 0:
                raise ValueError(f"vote must be an odd number of pixels >= 1 (1: no vote), got {self.vote}")
            if not (math.isfinite(self.warmup_rate) and self.warmup_rate >= 0):
                raise ValueError(f"warmup_rate must be a finite number >= 0 (0: no warm-up), got {self.warmup_rate!r}")

    def __init__(self, cfg: Config, train_names: list[str]) -> None:
        super().__init__(cfg, train_names)
        # the decayed counts of the residuals seen (checkpointed, as the two below)
        self.register_buffer("histogram", torch.zeros(cfg.bins))
        self.register_buffer("threshold", torch.ones(()))  # the next step's inlier bound
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))  # training steps seen

    def check(self, run: RunFacts) -> None:
        """Refuse a run whose loss has an SSIM term or whose strategy resets opacities within it (the papers' mode)."""
        for key, entry in (run.config.get("loss") or {}).items():
            if entry is not None and entry.get("name", key) == "ssim" and entry.get("weight", 0) > 0:
                raise ValueError(
                    f"the rule's loss is the masked L1 alone (SpotLessSplats: SSIM weight 0), but loss.{key} weighs "
                    f"SSIM: set loss.{key}.weight=0 loss.l1.weight=1.0 (the papers' loss)"
                )
        strategy, steps = run.config.get("strategy") or {}, run.config.get("max_steps", 0)
        reset_every = strategy.get("reset_every")
        if isinstance(reset_every, int) and reset_every < min(steps, strategy.get("refine_stop", steps)):
            raise ValueError(
                f"strategy.reset_every={reset_every} resets opacities within the run's {steps} steps, which the rule "
                f"runs without (SpotLessSplats): set strategy.reset_every={steps}"
            )

    def set_aside(self, image: Tensor, batch: Batch) -> Tensor:
        """[B, H, W, 1] bool: the pixels of ``batch``'s photos set aside from the render ``image`` [B, H, W, 3] under
        the present threshold (the vote, without the warm-up draw); never one the batch's masks ignore."""
        residual = (image.detach() - batch.images).abs().mean(-1)  # [B, H, W]
        aside = ~inlier_mask(residual, self.threshold.to(residual.dtype), self.cfg.vote)
        if batch.masks is not None:
            aside &= batch.masks[..., 0] > 0
        return aside[..., None]

    def set_aside_in(
        self, views: ViewModules, batches: Callable[[], Iterable[Batch]], render: RenderFn
    ) -> Iterator[tuple[Batch, Tensor]]:
        """See :meth:`ViewModule.set_aside_in`: under the threshold the run ended with."""
        for batch, image, _ in views.seen_by(self, batches, render):
            yield batch, self.set_aside(image, batch)

    def adjust_image(self, image: Tensor, batch: Batch, out: RenderOutput) -> Tensor:
        """``image`` [B, H, W, 3] with the photo's values where the rule sets pixels aside; a render with gradients (a
        training step's) takes the warm-up draw and adds its residuals to the histogram."""
        aside = self.set_aside(image, batch)  # [B, H, W, 1]
        if torch.is_grad_enabled() and image.requires_grad:
            share = warmup_share(self.cfg.warmup_rate, int(self.steps)) if self.cfg.warmup_rate else 0.0
            if share > 0:
                kept = torch.bernoulli(share + (1 - share) * (~aside).to(image.dtype)) > 0
                aside = ~kept
            self.learn(image, batch)
        return torch.where(aside, batch.images, image)

    def learn(self, image: Tensor, batch: Batch) -> None:
        """Add the residuals of the render ``image`` [B, H, W, 3] to the decayed histogram (the pixels the batch's masks
        keep) and set the next step's threshold."""
        residual = (image.detach() - batch.images).abs().mean(-1).clamp(0, 1)  # [B, H, W]
        if batch.masks is not None:
            residual = residual[batch.masks[..., 0] > 0]
        counts = torch.histc(residual.float(), bins=self.cfg.bins, min=0.0, max=1.0)  # [bins]
        self.histogram.mul_(self.cfg.ema).add_(counts)
        self.threshold.copy_(percentile_of(self.histogram, self.cfg.percentile))
        self.steps += 1
