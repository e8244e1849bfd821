"""MetricsHook: ``metrics.json``, the latest validation's metrics per view and their means."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gsrecon.atomic import write_json
from gsrecon.engine.hook import Hook, Priority
from gsrecon.registry import HOOK_REGISTRY

if TYPE_CHECKING:
    from gsrecon.engine.hook import TrainerView


@HOOK_REGISTRY.register()
class MetricsHook(Hook):
    """After each validation, (re)writes ``<exp_dir>/<filename>`` atomically: the step, the number of
    Gaussians, the mean metrics, the metrics of each view and the LPIPS network used. Only the main
    process writes."""

    priority = Priority.BELOW_NORMAL

    @dataclass
    class Config:
        filename: str = "metrics.json"

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    def outputs(self) -> list[str]:
        return [self.cfg.filename]

    def after_val(self, trainer: TrainerView) -> None:
        if not trainer.is_main:
            return
        write_json(
            trainer.exp_dir / self.cfg.filename,
            {
                "step": trainer.step,
                "num_gaussians": trainer.model.num_gaussians,
                "mean": trainer.val_metrics,
                "images": trainer.val_results,
                "lpips": trainer.metrics.lpips_info,
            },
        )
