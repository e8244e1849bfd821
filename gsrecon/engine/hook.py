"""The :class:`Hook` base class and hook priorities.

A hook is everything that happens *around* the optimisation step. The trainer calls each hook
point on every hook that defines it, in priority order (lower runs first; equal priorities keep
the order of the YAML ``hooks:`` entries). Hook points receive the trainer first and may read
anything on it; a hook writes only its own outputs and state.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING, Any

from gsrecon.registry import RunChecked

if TYPE_CHECKING:
    from gsrecon.engine.trainer import DefaultTrainer


HOOK_POINTS = (
    "before_run",
    "after_load_checkpoint",
    "before_train",
    "before_train_iter",
    "after_train_iter",
    "before_val",
    "before_val_iter",
    "after_val_iter",
    "after_val",
    "before_save_checkpoint",
    "after_train",
    "after_run",
)


class Priority(IntEnum):
    """Named hook priorities (MMEngine's names); any int in [0, 100] is accepted too."""

    HIGHEST = 0
    VERY_HIGH = 10
    HIGH = 30
    ABOVE_NORMAL = 40
    NORMAL = 50
    BELOW_NORMAL = 60
    LOW = 70
    VERY_LOW = 90
    LOWEST = 100


def get_priority(priority: int | str | Priority) -> int:
    """Convert a priority name or int to an int in [0, 100]; raise ValueError otherwise."""
    if isinstance(priority, str):
        try:
            return int(Priority[priority.upper()])
        except KeyError:
            names = ", ".join(p.name for p in Priority)
            raise ValueError(f"unknown priority '{priority}'; use one of {names} or an int from 0 to 100") from None
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 100:
        raise ValueError(f"priority must be a name or an int from 0 to 100, got {priority!r}")
    return int(priority)


class Hook(RunChecked):
    """Base class of trainer hooks. Override the points you need; the defaults do nothing.

    Order of calls in a run::

        before_run
        [after_load_checkpoint]                  when resuming
        before_train
          per step: before_train_iter -> (step) -> after_train_iter
          every val_interval and at the end:
            before_val -> per view: before_val_iter -> after_val_iter -> after_val
          [before_save_checkpoint]               whenever a checkpoint is written
        after_train                              also after Ctrl-C or an error, with trainer.stop_reason set
        after_run
    """

    priority: int | str = Priority.NORMAL

    def before_run(self, trainer: DefaultTrainer) -> None:
        """Once, after everything is built and before any resume."""

    def after_run(self, trainer: DefaultTrainer) -> None:
        """Once, last (also after training stopped early)."""

    def before_train(self, trainer: DefaultTrainer) -> None:
        """Once, before the first training step (after a resume, ``trainer.step`` is the resumed step)."""

    def after_train(self, trainer: DefaultTrainer) -> None:
        """Once, after the last training step or when training stopped (``trainer.stop_reason``)."""

    def before_train_iter(self, trainer: DefaultTrainer) -> None:
        """Before each training step; ``trainer.step`` is the step about to run (0-based)."""

    def after_train_iter(self, trainer: DefaultTrainer) -> None:
        """After each optimiser step; ``trainer.outputs`` holds the step's loss terms and timings,
        ``trainer.step`` is the number of completed steps."""

    def before_val(self, trainer: DefaultTrainer) -> None:
        """Before a validation pass."""

    def after_val(self, trainer: DefaultTrainer) -> None:
        """After a validation pass; ``trainer.val_metrics`` holds the mean metrics."""

    def before_val_iter(self, trainer: DefaultTrainer, index: int) -> None:
        """Before rendering validation view ``index``."""

    def after_val_iter(self, trainer: DefaultTrainer, index: int, outputs: dict[str, Any]) -> None:
        """After validation view ``index``; ``outputs`` has ``name``, ``render``, ``gt``, ``depth``, ``metrics``."""

    def before_save_checkpoint(self, trainer: DefaultTrainer, checkpoint: dict[str, Any]) -> None:
        """Before a checkpoint dict is written; hooks may add entries to it."""

    def after_load_checkpoint(self, trainer: DefaultTrainer, checkpoint: dict[str, Any]) -> None:
        """After a checkpoint was loaded into the trainer, before training continues."""

    def outputs(self) -> list[str]:
        """Paths (relative to ``exp_dir``) this hook writes: they belong to the run, and ``--overwrite``
        replaces them with it (anything not listed is left alone)."""
        return []

    def state_dict(self) -> dict[str, Any]:
        """State that must survive a resume (stored in checkpoints)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


def hook_points(cls: type) -> list[str]:
    """The standard hook points ``cls`` implements (overrides of :class:`Hook`'s empty methods), in call order."""
    return [point for point in HOOK_POINTS if getattr(cls, point, None) not in (None, getattr(Hook, point))]
