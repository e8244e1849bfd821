"""CheckInvalidLossHook: stop training on a NaN or infinite loss or Gaussian parameters."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gsrecon.engine.checkpoints import non_finite
from gsrecon.hooks.base import Hook, Priority
from gsrecon.registry import HOOK_REGISTRY

if TYPE_CHECKING:
    from gsrecon.engine.trainer import DefaultTrainer


class InvalidLossError(RuntimeError):
    """The training loss or the Gaussian parameters became NaN or infinite."""


@HOOK_REGISTRY.register()
class CheckInvalidLossHook(Hook):
    """Raises :class:`InvalidLossError` naming the step when the loss (checked every ``interval``
    steps) or a Gaussian parameter (every ``params_interval`` steps; renderers skip NaN Gaussians,
    so the loss alone can stay finite) is NaN or infinite. It runs before the checkpoint hook, so
    the broken model is never saved and the last good checkpoint stays."""

    priority = Priority.VERY_HIGH

    @dataclass
    class Config:
        interval: int = 1
        params_interval: int = 100

    def __init__(self, cfg: Config) -> None:
        if cfg.interval < 1 or cfg.params_interval < 1:
            raise ValueError(f"CheckInvalidLossHook intervals must be >= 1, got {cfg.interval}, {cfg.params_interval}")
        self.cfg = cfg

    def after_train_iter(self, trainer: DefaultTrainer) -> None:
        step = trainer.step
        if step % self.cfg.interval == 0:
            loss = float(trainer.outputs["loss"])
            if not math.isfinite(loss):
                raise InvalidLossError(f"the loss is {loss} at step {step}; {_kept(trainer)}")
        if step % self.cfg.params_interval == 0:
            broken = non_finite(dict(trainer.model.params.items()))
            if broken:
                raise InvalidLossError(
                    f"Gaussian parameters {', '.join(broken)} are not finite at step {step}; {_kept(trainer)}"
                )


def _kept(trainer: DefaultTrainer) -> str:
    steps = sorted(trainer.run_dir.checkpoints.glob("step_*.pt"))
    last = steps[-1] if steps else trainer.run_dir.latest_checkpoint()
    kept = f"the last good checkpoint {last} is kept" if last else "no checkpoint was written before"
    return f"training stopped ({kept}). Try lower learning rates or check the input images."
