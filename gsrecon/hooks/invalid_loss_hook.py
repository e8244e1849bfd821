"""CheckInvalidLossHook: stop training on a NaN or infinite loss."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gsrecon.hooks.base import Hook, Priority
from gsrecon.registry import HOOK_REGISTRY

if TYPE_CHECKING:
    from gsrecon.engine.trainer import DefaultTrainer


class InvalidLossError(RuntimeError):
    """The training loss became NaN or infinite."""


@HOOK_REGISTRY.register()
class CheckInvalidLossHook(Hook):
    """After every ``interval``-th step, raises :class:`InvalidLossError` naming the step if the loss is
    not finite. It runs before the checkpoint hook, so the broken model is never saved and the last
    good checkpoint stays."""

    priority = Priority.VERY_HIGH

    @dataclass
    class Config:
        interval: int = 1

    def __init__(self, cfg: Config) -> None:
        if cfg.interval < 1:
            raise ValueError(f"CheckInvalidLossHook interval must be >= 1, got {cfg.interval}")
        self.cfg = cfg

    def after_train_iter(self, trainer: DefaultTrainer) -> None:
        if trainer.step % self.cfg.interval:
            return
        loss = float(trainer.outputs["loss"])
        if not math.isfinite(loss):
            raise InvalidLossError(
                f"the loss is {loss} at step {trainer.step}; training stopped (the last good checkpoint "
                f"in {trainer.checkpoint_dir} is kept). Try lower learning rates or check the input images."
            )
