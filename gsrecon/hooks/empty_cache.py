"""EmptyCacheHook: release cached CUDA memory at chosen points."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from gsrecon.engine.hook import Hook, Priority
from gsrecon.registry import HOOK_REGISTRY

if TYPE_CHECKING:
    from gsrecon.engine.hook import TrainerView


@HOOK_REGISTRY.register()
class EmptyCacheHook(Hook):
    """Calls ``torch.cuda.empty_cache()`` after every ``interval``-th step (0: never) and/or after each
    validation. Does nothing when the trainer runs on the CPU."""

    priority = Priority.LOWEST

    @dataclass
    class Config:
        interval: int = 0
        after_val: bool = True

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    def after_train_iter(self, trainer: TrainerView) -> None:
        if self.cfg.interval > 0 and trainer.step % self.cfg.interval == 0:
            _empty_cache(trainer)

    def after_val(self, trainer: TrainerView) -> None:
        if self.cfg.after_val:
            _empty_cache(trainer)


def _empty_cache(trainer: TrainerView) -> None:
    if trainer.device.type == "cuda":
        torch.cuda.empty_cache()
