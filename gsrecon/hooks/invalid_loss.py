"""CheckInvalidLossHook: stop training on a NaN or infinite loss or Gaussian parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from gsrecon.engine.checkpoints import non_finite
from gsrecon.engine.hook import Hook, Priority
from gsrecon.errors import InputError
from gsrecon.registry import HOOK_REGISTRY

if TYPE_CHECKING:
    from gsrecon.engine.hook import TrainerView


class InvalidLossError(InputError):
    """The training loss or the Gaussian parameters became NaN or infinite (settings to change, e.g. learning rates)."""


@HOOK_REGISTRY.register()
class CheckInvalidLossHook(Hook):
    """Raises :class:`InvalidLossError` naming the step when the loss or a Gaussian parameter is NaN or
    infinite (renderers skip NaN Gaussians, so the loss alone can stay finite).

    Every step records, on the device, the first step whose loss was not finite; that record is read
    back every ``interval`` steps (a read waits for the GPU), the parameters are checked every
    ``params_interval`` steps, and both before every checkpoint and at the end. It runs before the
    checkpoint hook, so a broken model is never saved and the last good checkpoint stays."""

    priority = Priority.VERY_HIGH

    @dataclass
    class Config:
        interval: int = 50
        params_interval: int = 100

    def __init__(self, cfg: Config) -> None:
        if cfg.interval < 1 or cfg.params_interval < 1:
            raise ValueError(f"CheckInvalidLossHook intervals must be >= 1, got {cfg.interval}, {cfg.params_interval}")
        self.cfg = cfg
        self._first_invalid: Tensor | None = None  # float64 [2]: step and loss of the first non-finite one (-1: none)

    def after_train_iter(self, trainer: TrainerView) -> None:
        step, loss = trainer.step, trainer.outputs["loss"].detach().double()
        if self._first_invalid is None:
            self._first_invalid = torch.tensor([-1.0, 0.0], dtype=torch.float64, device=loss.device)
        first = self._first_invalid[0] < 0
        # full_like fills on the device; a tensor made from the host's step would be a pageable copy, which waits.
        self._first_invalid = torch.where(
            first & ~torch.isfinite(loss), torch.stack([torch.full_like(loss, step), loss]), self._first_invalid
        )
        if step % self.cfg.interval == 0:
            self._check_loss(trainer)
        if step % self.cfg.params_interval == 0:
            self._check_params(trainer)

    def before_save_checkpoint(self, trainer: TrainerView, checkpoint: dict[str, Any]) -> None:
        self._check_loss(trainer)
        self._check_params(trainer)

    def after_train(self, trainer: TrainerView) -> None:
        self._check_loss(trainer)

    def _check_loss(self, trainer: TrainerView) -> None:
        if self._first_invalid is None:
            return
        step, loss = self._first_invalid.tolist()
        if step >= 0:
            raise InvalidLossError(f"the loss is {loss} at step {int(step)}; {_kept(trainer)}")

    def _check_params(self, trainer: TrainerView) -> None:
        broken = non_finite(dict(trainer.model.params.items()))
        if broken:
            raise InvalidLossError(
                f"Gaussian parameters {', '.join(broken)} are not finite at step {trainer.step}; {_kept(trainer)}"
            )


def _kept(trainer: TrainerView) -> str:
    steps = sorted(trainer.run_dir.checkpoints.glob("step_*.pt"))
    last = steps[-1] if steps else trainer.run_dir.latest_checkpoint()
    kept = f"the last good checkpoint {last} is kept" if last else "no checkpoint was written before"
    return f"training stopped ({kept}). Try lower learning rates or check the input images."
