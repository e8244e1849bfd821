"""CheckPointHook: periodic, best, final and on-interrupt checkpoints, written atomically."""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gsrecon.atomic import atomic_path
from gsrecon.engine.checkpoints import load_checkpoint_file, non_finite, save_checkpoint
from gsrecon.engine.hook import Hook, Priority
from gsrecon.errors import InputError
from gsrecon.metrics import LOWER_IS_BETTER, METRIC_NAMES
from gsrecon.registry import HOOK_REGISTRY

if TYPE_CHECKING:
    from gsrecon.engine.hook import TrainerView


@HOOK_REGISTRY.register()
class CheckPointHook(Hook):
    """Saves ``<exp_dir>/checkpoints/step_<NNNNNN>.pt`` every ``interval`` steps and keeps ``last.pt``
    pointing at the newest.

    When to save: after a training step whose count is a multiple of ``interval``; after a validation
    that improves ``save_best`` (``best.pt``); at the end of training and after Ctrl-C (final
    checkpoint). After a failure (e.g. a non-finite loss) nothing is written, so the last good
    checkpoint stays. Only the main process writes.
    """

    priority = Priority.VERY_LOW

    @dataclass
    class Config:
        interval: int = 1000  # steps between checkpoints; <= 0 saves only the final one
        max_keep: int = 3  # step_*.pt files kept (oldest deleted first); <= 0 keeps all
        save_best: str = ""  # "" (off) | auto (the first validation metric) | a metric name
        rule: str = ""  # "" (by the metric: less for lpips, greater for psnr and ssim) | greater | less
        save_last: bool = True  # save after the last step and after Ctrl-C

    def __init__(self, cfg: Config) -> None:
        if cfg.rule not in ("", "greater", "less"):
            raise ValueError(f"rule must be '' (by the metric), 'greater' or 'less', got '{cfg.rule}'")
        if cfg.save_best not in ("", "auto", *METRIC_NAMES):
            raise ValueError(f"save_best must be '', auto or one of {', '.join(METRIC_NAMES)}; got '{cfg.save_best}'")
        self.cfg = cfg
        self.best_value: float | None = None
        self.best_step: int | None = None

    def after_train_iter(self, trainer: TrainerView) -> None:
        if self.cfg.interval > 0 and trainer.step % self.cfg.interval == 0:
            self.save(trainer)

    def after_val(self, trainer: TrainerView) -> None:
        if not self.cfg.save_best or not trainer.val_metrics:
            return
        metric = next(iter(trainer.val_metrics)) if self.cfg.save_best == "auto" else self.cfg.save_best
        if metric not in trainer.val_metrics:
            raise InputError(
                f"save_best metric '{metric}' is not a validation metric ({', '.join(trainer.val_metrics)})"
            )
        value = trainer.val_metrics[metric]
        if value is None or not math.isfinite(value) or not self._better(metric, value):
            return
        self.best_value, self.best_step = float(value), trainer.step
        if trainer.is_main:
            self._refuse_non_finite(trainer)
            checkpoint = trainer.checkpoint()
            checkpoint["best"] = {"metric": metric, "value": float(value), "step": trainer.step}
            save_checkpoint(checkpoint, trainer.run_dir.checkpoints / "best.pt")
        trainer.logger.info(f"new best {metric} {value:.4f} at step {trainer.step}")

    def after_load_checkpoint(self, trainer: TrainerView, checkpoint: dict[str, Any]) -> None:
        """A checkpoint saved before a validation in its step holds the best score from before it:
        take the one ``best.pt`` records when it is better, so a worse model never replaces it."""
        path = trainer.run_dir.checkpoints / "best.pt"
        if not self.cfg.save_best or not path.is_file():
            return
        with contextlib.suppress(ValueError):
            record = load_checkpoint_file(path).get("best")
            if record and self._better(record["metric"], record["value"]):
                self.best_value, self.best_step = float(record["value"]), int(record["step"])

    def _better(self, metric: str, value: float) -> bool:
        """Whether ``value`` of ``metric`` beats the best so far, by ``rule`` or else by the metric."""
        if self.best_value is None:
            return True
        rule = self.cfg.rule or ("less" if metric in LOWER_IS_BETTER else "greater")
        return value > self.best_value if rule == "greater" else value < self.best_value

    def after_train(self, trainer: TrainerView) -> None:
        if trainer.failed or not self.cfg.save_last:
            return
        if not (trainer.run_dir.checkpoints / f"step_{trainer.step:06d}.pt").exists():
            self.save(trainer)

    def save(self, trainer: TrainerView) -> Path:
        """Write ``step_<NNNNNN>.pt`` and ``last.pt`` for the current step, then rotate old ones."""
        directory = trainer.run_dir.checkpoints
        path = directory / f"step_{trainer.step:06d}.pt"
        if not trainer.is_main:
            return path
        checkpoint = trainer.checkpoint()  # its before_save_checkpoint hooks may refuse first, saying why
        self._refuse_non_finite(trainer)
        save_checkpoint(checkpoint, path)
        try:
            with atomic_path(directory / "last.pt") as tmp:
                os.link(path, tmp)
        except OSError:  # no hard links on this file system
            save_checkpoint(checkpoint, directory / "last.pt")
        self._rotate(directory)
        trainer.logger.info(f"saved checkpoint {path}")
        return path

    def _refuse_non_finite(self, trainer: TrainerView) -> None:
        broken = non_finite(dict(trainer.model.params.items()))
        if broken:
            raise InputError(f"not saving step {trainer.step}: Gaussian parameters {', '.join(broken)} are not finite")

    def _rotate(self, directory: Path) -> None:
        if self.cfg.max_keep <= 0:
            return
        for old in sorted(directory.glob("step_*.pt"))[: -self.cfg.max_keep]:
            old.unlink()

    def state_dict(self) -> dict[str, Any]:
        return {"best_value": self.best_value, "best_step": self.best_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best_value = state.get("best_value")
        self.best_step = state.get("best_step")
