"""An example user hook: records the number of Gaussians every few steps into a CSV file.

Used by custom_hook.yaml (``imports: [gaussian_count_hook.py]``); copy it as a starting point.
"""

from __future__ import annotations

from dataclasses import dataclass

from gsrecon.hooks import Hook, Priority
from gsrecon.registry import HOOK_REGISTRY


@HOOK_REGISTRY.register()
class GaussianCountHook(Hook):
    """Every ``every`` steps, appends ``step,num_gaussians`` to ``<exp_dir>/<filename>`` (rank 0 only).

    It keeps the rows in memory and writes the file when training ends, also after Ctrl-C.
    """

    priority = Priority.LOW

    @dataclass
    class Config:
        every: int = 100
        filename: str = "gaussian_counts.csv"

    def __init__(self, cfg: Config) -> None:
        if cfg.every < 1:
            raise ValueError(f"GaussianCountHook every must be >= 1, got {cfg.every}")
        self.cfg = cfg
        self.rows: list[tuple[int, int]] = []

    def outputs(self) -> list[str]:
        return [self.cfg.filename]

    def after_train_iter(self, trainer) -> None:
        if trainer.step % self.cfg.every == 0:
            self.rows.append((trainer.step, trainer.model.num_gaussians))

    def after_train(self, trainer) -> None:
        if trainer.is_main:
            lines = ["step,num_gaussians", *(f"{step},{count}" for step, count in self.rows)]
            (trainer.exp_dir / self.cfg.filename).write_text("\n".join(lines) + "\n")

    def state_dict(self) -> dict:
        return {"rows": self.rows}

    def load_state_dict(self, state: dict) -> None:
        self.rows = [tuple(row) for row in state.get("rows", [])]
