"""Growth and pruning where several training views agree: the multi-view consistent densification and pruning of
FastGS (Ren et al. 2025, arXiv 2511.04283), built from the paper's description on top of the default strategy.

At a scoring step, ``score_views`` training views drawn at random are rendered as the loss sees them. In each, the
high-error pixels are those whose error (the L1 over channels, min-max normalised over the view) exceeds
``error_threshold``; a Gaussian's score in that view is its blending weight summed over them: how much of the
view's error it draws. FastGS counts the high-error pixels inside each Gaussian's footprint in its own rasteriser;
the weight is what every renderer gives (the gradient of the masked image with respect to the Gaussian's base
colour), so one rule serves ``cpu``, ``torch`` and ``gsplat``.

- Growth: at each refinement of the default schedule, a Gaussian whose screen-space gradient asks for a clone or a
  split grows only where its mean score over the views exceeds ``grow_score``.
- Pruning: the default's, but none by world size (``prune_scale3d``: a large Gaussian that fits the background well is
  not regrown where the views agree it needs nothing). After refinement stops, every ``late_prune_every`` steps before
  ``late_prune_stop``, the Gaussians whose opacity is under ``late_prune_opa`` are removed, and so are those whose
  loss-weighted score (the sum over the views of the view's L1 loss times the score, min-max normalised over the
  Gaussians) exceeds ``prune_score``: those that the views agree draw their worst errors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from gsrecon.component import RunSetup
from gsrecon.config import run_steps
from gsrecon.distributed import DistributedContext
from gsrecon.errors import InputError
from gsrecon.model.ops import remove_rows
from gsrecon.registry import STRATEGY_REGISTRY
from gsrecon.sh import SH_C0
from gsrecon.strategy.base import SINGLE_PROCESS, Optimizers, Params
from gsrecon.strategy.default import DefaultStrategy

if TYPE_CHECKING:
    from gsrecon.data.pipeline import Batch, DataPipeline

Draw = Callable[[Mapping[str, Tensor], "Batch", int], Tensor]


@STRATEGY_REGISTRY.register("multiview")
class MultiViewStrategy(DefaultStrategy):
    """The default strategy's growth gated by the views' agreement, and a late pruning by it (see the module)."""

    @dataclass
    class Config(DefaultStrategy.Config):
        score_views: int = 10  # training views rendered at each scoring step (FastGS: 10)
        error_threshold: float = 0.1  # a pixel is high-error above this normalised L1 error (FastGS: 0.1)
        # Mean blending weight in the views' high-error pixels needed to grow. FastGS's 5 counts pixels; a weight is
        # smaller than the pixel it is in: 5 cost horns 2.6 dB at 2000 steps, 0.5 cost 0.85 (BENCHMARKS.md).
        grow_score: float = 0.5
        prune_score: float = 0.9  # normalised loss-weighted score above which a Gaussian is pruned late (FastGS: 0.9)
        late_prune_opa: float = 0.1  # opacity under which a Gaussian is pruned late (FastGS: 0.1)
        late_prune_every: int = run_steps(3000)  # steps between late prunings, after refine_stop (FastGS: 3000)
        late_prune_stop: int = run_steps(30_000)  # no late pruning from this step on (FastGS: 30000 of 30000)
        # No pruning by world size (the default's 0.1 x the scene's extent after the first opacity reset): the gate
        # does not regrow the large background Gaussians it removes, which cost horns 5.4 dB at 7000 steps.
        prune_scale3d: float = math.inf

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        for name in ("score_views", "late_prune_every"):
            if getattr(cfg, name) < 1:
                raise InputError(f"strategy.{name} must be >= 1, got {getattr(cfg, name)}")
        for name in ("error_threshold", "prune_score", "late_prune_opa"):
            value = getattr(cfg, name)
            if not 0.0 <= value <= 1.0:  # NaN fails too
                raise InputError(f"strategy.{name} must be in [0, 1], got {value}")
        if not (cfg.grow_score >= 0.0 and math.isfinite(cfg.grow_score)):
            raise InputError(f"strategy.grow_score must be a finite number >= 0, got {cfg.grow_score}")
        if cfg.late_prune_stop < 0:
            raise InputError(f"strategy.late_prune_stop must be >= 0, got {cfg.late_prune_stop}")
        self._draw: Draw | None = None
        self._data: DataPipeline | None = None

    def setup(self, run: RunSetup) -> None:
        if run.draw is None or run.data is None:
            raise ValueError("strategy 'multiview' scores training views: it needs a training run")
        self._draw, self._data = run.draw, run.data

    def growth_gate(self, params: Params, step: int, dist: DistributedContext) -> Tensor:
        mean_score, _ = self._view_scores(params, step, dist)
        return mean_score > self.cfg.grow_score

    @torch.no_grad()
    def step_post_backward(
        self,
        params: Params,
        optimizers: Optimizers,
        state: dict[str, Any],
        step: int,
        info: dict[str, Any],
        dist: DistributedContext = SINGLE_PROCESS,
    ) -> None:
        super().step_post_backward(params, optimizers, state, step, info, dist)
        cfg = self.cfg
        if cfg.refine_stop < step < cfg.late_prune_stop and step % cfg.late_prune_every == 0:
            _, loss_score = self._view_scores(params, step, dist)
            low, high = loss_score.min(), loss_score.max()
            normalised = (loss_score - low) / (high - low).clamp_min(1e-12)  # [N]
            is_prune = (torch.sigmoid(params["opacities"]) < cfg.late_prune_opa) | (normalised > cfg.prune_score)
            if is_prune.any():
                remove_rows(params, optimizers, state, self.per_gaussian_state, is_prune)

    def _view_scores(self, params: Params, step: int, dist: DistributedContext) -> tuple[Tensor, Tensor]:
        """(the mean over the scored views of each Gaussian's weight in their high-error pixels [N], the sum over
        them of that weight times the view's L1 loss [N]), the views split between the ranks and summed."""
        if self._draw is None or self._data is None:
            raise RuntimeError("strategy 'multiview' was not set up for its run")
        views = self._scored_views(step)
        n = len(params["means"])
        mean_score = params["means"].new_zeros(n)
        loss_score = params["means"].new_zeros(n)
        for index in views[dist.rank :: dist.world_size]:
            batch = self._data.train_view(index)
            weights, loss = high_error_weights(self._draw, params, batch, step, self.cfg.error_threshold)
            mean_score += weights / len(views)
            loss_score += weights * loss
        dist.all_reduce_sum([mean_score, loss_score])
        return mean_score, loss_score

    def _scored_views(self, step: int) -> list[int]:
        """The training views scored at ``step``: ``score_views`` of them (all where there are fewer), drawn without
        replacement from a generator of the run's seed and the step (a resume draws the same)."""
        data = self._data
        generator = torch.Generator().manual_seed(data.seed * 1_000_003 + 104_729 * step + 1)
        return torch.randperm(data.num_train, generator=generator)[: self.cfg.score_views].tolist()


def high_error_weights(draw: Draw, params: Params, batch: Batch, step: int, threshold: float) -> tuple[Tensor, Tensor]:
    """(each Gaussian's blending weight summed over the high-error pixels of ``batch``'s one view [N], the view's L1
    loss []): the pixels whose channel-mean L1 error, min-max normalised over the view, exceeds ``threshold``;
    pixels a mask leaves out count in neither."""
    base = params["sh0"].detach().clone().requires_grad_(True)  # [N, 1, 3]
    drawn = {name: base if name == "sh0" else value.detach() for name, value in params.items()}
    with torch.enable_grad():
        image = draw(drawn, batch, step)  # [1, H, W, 3]
        error = (image.detach() - batch.images).abs().mean(dim=-1)  # [1, H, W]
        keep = torch.ones_like(error, dtype=torch.bool) if batch.masks is None else batch.masks[..., 0] > 0
        low = torch.where(keep, error, torch.inf).amin()
        high = torch.where(keep, error, -torch.inf).amax()
        flagged = keep & ((error - low) / (high - low).clamp_min(1e-12) > threshold)  # [1, H, W]
        (grad,) = torch.autograd.grad((image * flagged[..., None]).sum(), base)
    # A base colour enters every channel's colour as SH_C0 x sh0 + 0.5, so the gradient is SH_C0 x the weight per
    # channel (0 where the colour is clamped at 0).
    weights = grad.sum(dim=(1, 2)) / (3.0 * SH_C0)  # [N]
    loss = (error * keep).sum() / keep.sum().clamp_min(1)
    return weights, loss
