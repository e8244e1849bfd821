"""An example densification strategy: every few steps, remove the Gaussians that have become nearly transparent.

Used by custom_strategy.yaml (``imports: [prune_transparent.py]``); copy it as a starting point. A strategy is a
function of explicit state, as in gsplat: it gets the parameters, their optimisers, its own state dict and the
step, never the trainer, and changes the set of Gaussians only through :mod:`gsrecon.model.ops`, which keeps the
parameters, their Adam moments and the per-Gaussian state it declares aligned. Its state comes from
``initialize_state(scene_extent)``, asked for fresh for each run and each resume; what it prepares once for a run
belongs in ``setup(run)``, as every component's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gsrecon.distributed import DistributedContext
from gsrecon.model.ops import remove_rows
from gsrecon.registry import STRATEGY_REGISTRY
from gsrecon.strategy.base import SINGLE_PROCESS, Optimizers, Params, Strategy


@STRATEGY_REGISTRY.register("prune_transparent")
class PruneTransparentStrategy(Strategy):
    """Every ``every`` steps, removes the Gaussians whose opacity is below ``min_opacity``; ``state["pruned"]``
    counts them (saved in checkpoints, so a resume goes on counting)."""

    @dataclass
    class Config:
        every: int = 100
        min_opacity: float = 0.005

    def initialize_state(self, scene_extent: float) -> dict[str, Any]:
        return {"pruned": 0}

    def step_post_backward(
        self,
        params: Params,
        optimizers: Optimizers,
        state: dict[str, Any],
        step: int,
        info: dict[str, Any],
        dist: DistributedContext = SINGLE_PROCESS,
    ) -> None:
        if (step + 1) % self.cfg.every != 0:
            return
        transparent = torch.sigmoid(params["opacities"].detach()) < self.cfg.min_opacity  # [N]
        if transparent.any():
            remove_rows(params, optimizers, state, self.per_gaussian_state, transparent)
            state["pruned"] += int(transparent.sum())
