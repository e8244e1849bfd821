"""SkipLearntViewsHook: no backward pass for a view whose loss has stopped falling (SkipGS, Li et al. 2026, arXiv
2603.08997, built from the paper's description)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gsrecon.component import RunFacts
from gsrecon.config import run_steps
from gsrecon.engine.hook import Hook, Priority
from gsrecon.errors import InputError
from gsrecon.registry import HOOK_REGISTRY

if TYPE_CHECKING:
    from gsrecon.data.pipeline import Batch
    from gsrecon.engine.hook import TrainerView

# Strategies that read each step's screen-space gradients until their refine_stop.
_GRADIENT_STRATEGIES = ("default", "multiview")


@HOOK_REGISTRY.register()
class SkipLearntViewsHook(Hook):
    """Every step renders its view and keeps an exponential moving average of that view's loss (decay ``decay``).
    From step ``start`` (the default strategy's end of growth) and after ``warmup`` more steps, a step whose loss is
    within ``tolerance`` (relative) of its view's average, the view having learnt what it can for now, leaves out
    its backward pass and optimiser step, unless that would bring the share of steps since ``start`` that did update
    under ``min_updates``. The skipped share goes to the log and TensorBoard (``train/skipped_share``) every
    ``log_interval`` steps. Needs one view a step (``data.batch_size: 1``) and, from ``start`` on, a strategy that
    does not read every step's gradients."""

    priority = Priority.HIGH

    @dataclass
    class Config:
        start: int = run_steps(15_000)  # first step that may skip (the default strategy's refine_stop)
        warmup: int = run_steps(500, minimum=0)  # steps after start that only gather the averages (SkipGS: 500)
        decay: float = 0.95  # of each view's loss average (SkipGS: 0.95)
        tolerance: float = 0.02  # a loss within this relative distance of its view's average skips the update
        min_updates: float = 0.5  # the least share of the steps since start that update
        log_interval: int = 100

    def __init__(self, cfg: Config) -> None:
        for name in ("start", "warmup"):
            if getattr(cfg, name) < 0:
                raise InputError(f"SkipLearntViewsHook {name} must be >= 0, got {getattr(cfg, name)}")
        for name in ("decay", "min_updates"):
            if not 0.0 <= getattr(cfg, name) <= 1.0:  # NaN fails too
                raise InputError(f"SkipLearntViewsHook {name} must be in [0, 1], got {getattr(cfg, name)}")
        if not (cfg.tolerance >= 0.0 and math.isfinite(cfg.tolerance)):
            raise InputError(f"SkipLearntViewsHook tolerance must be a finite number >= 0, got {cfg.tolerance}")
        if cfg.log_interval < 1:
            raise InputError(f"SkipLearntViewsHook log_interval must be >= 1, got {cfg.log_interval}")
        self.cfg = cfg
        self.averages: dict[str, float] = {}  # view name -> its loss average
        self.counted = 0  # steps since start
        self.updated = 0  # of which updated

    def check(self, run: RunFacts) -> None:
        if run.config["data"].get("batch_size", 1) != 1:
            raise ValueError("it decides per view: data.batch_size must be 1")
        strategy = run.config["strategy"]
        if strategy["name"] in _GRADIENT_STRATEGIES and strategy["refine_stop"] > self.cfg.start:
            raise ValueError(
                f"start={self.cfg.start} is before strategy.refine_stop={strategy['refine_stop']}: strategy "
                f"'{strategy['name']}' reads every step's screen-space gradients until then (set "
                f"hooks.SkipLearntViewsHook.start={strategy['refine_stop']} or later)"
            )

    def after_loss(self, trainer: TrainerView, batch: Batch, losses: dict[str, torch.Tensor]) -> None:
        step, name, cfg = trainer.step, batch.names[0], self.cfg
        loss = float(sum(value.detach() for value in losses.values()))
        average = self.averages.get(name)
        self.averages[name] = loss if average is None else cfg.decay * average + (1.0 - cfg.decay) * loss
        if step < cfg.start:
            return
        self.counted += 1
        learnt = (
            step >= cfg.start + cfg.warmup
            and average is not None
            and abs(loss - average) <= cfg.tolerance * average
            and self.updated >= cfg.min_updates * self.counted
        )
        needed = torch.tensor([0.0 if learnt else 1.0], device=trainer.device)
        trainer.dist.all_reduce_max(needed)  # every process skips alike, or none does
        if needed.item() == 0.0:
            trainer.skip_update()
        else:
            self.updated += 1

    def after_train_iter(self, trainer: TrainerView) -> None:
        if self.counted and trainer.step % self.cfg.log_interval == 0:
            trainer.writers.write_scalar("train/skipped_share", self.skipped_share, trainer.step)

    def after_train(self, trainer: TrainerView) -> None:
        if self.counted:
            trainer.logger.info(
                f"SkipLearntViewsHook: {self.counted - self.updated} of the {self.counted} steps from step "
                f"{self.cfg.start} on left out their update ({100 * self.skipped_share:.1f} %)"
            )

    @property
    def skipped_share(self) -> float:
        """The share of the steps since ``start`` that left out their update."""
        return (self.counted - self.updated) / max(self.counted, 1)

    def state_dict(self) -> dict[str, Any]:
        return {"averages": dict(self.averages), "counted": self.counted, "updated": self.updated}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.averages = {str(k): float(v) for k, v in state.get("averages", {}).items()}
        self.counted, self.updated = int(state.get("counted", 0)), int(state.get("updated", 0))
