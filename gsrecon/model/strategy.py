"""Densification strategies: how the set of Gaussians grows, shrinks and moves during training.

A strategy is called twice per step: ``step_pre_backward`` after rendering (to ask for the
statistics it needs, e.g. ``info["means2d"].retain_grad()``) and ``step_post_backward`` after the
optimiser step (to densify, prune or relocate). Its state goes into checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gsrecon.registry import STRATEGY_REGISTRY

if TYPE_CHECKING:
    from gsrecon.engine.trainer import DefaultTrainer


class Strategy:
    """Base class: keeps the Gaussians as they are."""

    @dataclass
    class Config:
        pass

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def initialize(self, trainer: DefaultTrainer) -> None:
        """Called once the model and optimisers exist (before any resume)."""

    def step_pre_backward(self, trainer: DefaultTrainer, info: dict[str, Any]) -> None:
        """After the render of a step, before ``loss.backward()``."""

    def regularization(self, trainer: DefaultTrainer, info: dict[str, Any]) -> torch.Tensor | None:
        """Extra loss terms this strategy needs (e.g. MCMC's opacity and scale penalties), or None."""
        return None

    def step_post_backward(self, trainer: DefaultTrainer, info: dict[str, Any]) -> None:
        """After the optimiser step of a step; may change the number of Gaussians."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


@STRATEGY_REGISTRY.register("none")
class NoStrategy(Strategy):
    """No densification: the initial Gaussians are only optimised."""
