"""The :class:`Strategy` interface: functions of explicit state, as gsplat's strategies are.

A strategy never sees the trainer. It gets the Gaussian parameters, their optimisers, its own state
dict (made by :meth:`Strategy.initialize_state`, held by the caller and saved in checkpoints), the
step and the render info. That state is not a set-up: the caller asks for a fresh one for each run and each resume;
what a strategy prepares once for a run belongs in :meth:`~gsrecon.component.RunChecked.setup`, as every
component's. It adds, removes and replaces Gaussians through :mod:`gsrecon.model.ops`, which
keeps the parameters, their optimiser states and the state entries it names in ``per_gaussian_state``
row-aligned.

Per step, in this order: ``step_pre_backward`` after rendering (to ask for the statistics it needs,
e.g. ``info["means2d"].retain_grad()``), ``regularization`` (extra loss terms), then, after the
optimiser step, ``step_post_backward`` (densify, prune or relocate).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gsrecon.component import RunChecked, RunFacts
from gsrecon.distributed import DistributedContext
from gsrecon.errors import InputError
from gsrecon.model.ops import Optimizers, Params
from gsrecon.model.views.base import view_entries
from gsrecon.registry import STRATEGY_REGISTRY, VIEW_REGISTRY

SINGLE_PROCESS = DistributedContext()


def opacity_scale_penalty(params: Params, opacity_reg: float, scale_reg: float) -> Tensor | None:
    """``opacity_reg`` × mean opacity + ``scale_reg`` × mean scale (L1 on the activated values, as 3DGS-MCMC),
    or None when both weights are 0: pushes Gaussians that no photo needs toward transparency and smallness."""
    if opacity_reg == 0 and scale_reg == 0:
        return None
    return opacity_reg * torch.sigmoid(params["opacities"]).mean() + scale_reg * torch.exp(params["scales"]).mean()


def growth_start(run: RunFacts, delayed: int) -> int:
    """The first step at which a strategy grows Gaussians in ``run``: ``delayed`` where one of its per-view modules
    sets transients aside (RobustSplat's delayed growth: the scene's structure first, so that no Gaussian is grown
    for a distractor before the mask has settled), 0 otherwise."""
    modules = [VIEW_REGISTRY.get(entry["name"]) for entry in view_entries(dict(run.config)).values()]
    return delayed if any(module.sets_transients_aside for module in modules) else 0


def check_growth_start(steps: int) -> None:
    """Refuse a ``strategy.transient_growth_start`` that is not a whole number of steps >= 0."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise InputError(f"strategy.transient_growth_start must be a whole number of steps >= 0, got {steps!r}")


class Strategy(RunChecked):
    """Base class: keeps the Gaussians as they are."""

    # The state entries (of initialize_state's dict) holding one row per Gaussian, [N, ...] or None until first
    # filled: whatever adds or removes Gaussians (gsrecon.model.ops) adds or removes their rows too.
    per_gaussian_state: tuple[str, ...] = ()
    # Whether the strategy reads the screen-space gradients of the Gaussians' centres (``info["means2d"].grad``),
    # which gsplat does not give through a fisheye lens (a rule checked before a run is built).
    screen_gradients: bool = False
    # The first step at which the strategy may grow Gaussians: check() sets it from the run (growth_start)
    growth_from: int = 0

    @dataclass
    class Config:
        pass

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def initialize_state(self, scene_extent: float) -> dict[str, Any]:
        """The strategy's running state for a new run (a dict of tensors and numbers)."""
        return {}

    def step_pre_backward(
        self, params: Params, optimizers: Optimizers, state: dict[str, Any], step: int, info: dict[str, Any]
    ) -> None:
        """After the render of ``step``, before ``loss.backward()``."""

    def regularization(self, params: Params, state: dict[str, Any], info: dict[str, Any]) -> Tensor | None:
        """Extra loss terms this strategy needs (e.g. MCMC's opacity and scale penalties), or None."""
        return None

    def step_post_backward(
        self,
        params: Params,
        optimizers: Optimizers,
        state: dict[str, Any],
        step: int,
        info: dict[str, Any],
        dist: DistributedContext = SINGLE_PROCESS,
    ) -> None:
        """After the optimiser step of ``step`` (0-based); may change the number of Gaussians.

        ``dist`` sums statistics over torchrun processes, so that every rank decides alike.
        """


@STRATEGY_REGISTRY.register("none")
class NoStrategy(Strategy):
    """No densification: the initial Gaussians are only optimised."""
