"""IterTimerHook: data time, step time and iterations per second."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gsrecon.engine.hook import Hook, Priority
from gsrecon.registry import HOOK_REGISTRY

if TYPE_CHECKING:
    from gsrecon.engine.hook import TrainerView


@HOOK_REGISTRY.register()
class IterTimerHook(Hook):
    """Times each step (from ``before_train_iter`` to ``after_train_iter``, CUDA work asynchronous)
    and writes window means ``time/step_s``, ``time/data_s`` and ``time/it_s`` every ``log_interval``
    steps. Total training time survives resumes (``time/total_s``)."""

    priority = Priority.VERY_HIGH

    @dataclass
    class Config:
        log_interval: int = 10

    def __init__(self, cfg: Config) -> None:
        if cfg.log_interval < 1:
            raise ValueError(f"IterTimerHook log_interval must be >= 1, got {cfg.log_interval}")
        self.cfg = cfg
        self.total_time = 0.0
        self._start = 0.0
        self._window: list[tuple[float, float]] = []

    def before_train_iter(self, trainer: TrainerView) -> None:
        self._start = time.perf_counter()

    def after_train_iter(self, trainer: TrainerView) -> None:
        step_time = time.perf_counter() - self._start
        self.total_time += step_time
        self._window.append((step_time, float(trainer.outputs.get("data_time", 0.0))))
        if trainer.step % self.cfg.log_interval == 0:
            mean_step = sum(s for s, _ in self._window) / len(self._window)
            write = trainer.writers.write_scalar
            write("time/step_s", mean_step, trainer.step)
            write("time/data_s", sum(d for _, d in self._window) / len(self._window), trainer.step)
            write("time/it_s", 1.0 / max(mean_step, 1e-9), trainer.step)
            write("time/total_s", self.total_time, trainer.step)
            self._window.clear()

    def state_dict(self) -> dict[str, Any]:
        return {"total_time": self.total_time}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.total_time = float(state.get("total_time", 0.0))
