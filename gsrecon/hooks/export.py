"""ExportHook: the trained Gaussians as a file (a reference-layout 3DGS ``.ply`` by default)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gsrecon.hooks.base import Hook, Priority
from gsrecon.model.ply import save_ply
from gsrecon.registry import HOOK_REGISTRY

if TYPE_CHECKING:
    from gsrecon.engine.trainer import DefaultTrainer


@HOOK_REGISTRY.register()
class ExportHook(Hook):
    """When training ends (also after Ctrl-C, not after a failure), writes the Gaussians to
    ``<exp_dir>/<path>``. Only the main process writes."""

    priority = Priority.LOWEST

    @dataclass
    class Config:
        path: str = "point_cloud.ply"  # relative to exp_dir (or absolute)

    def __init__(self, cfg: Config) -> None:
        if not cfg.path:
            raise ValueError("ExportHook path is empty; remove the hook (hooks.ExportHook=null) to export nothing")
        self.cfg = cfg

    def after_train(self, trainer: DefaultTrainer) -> None:
        if trainer.failed or not trainer.is_main:
            return
        path = trainer.exp_dir / self.cfg.path
        save_ply(path, trainer.model.params)
        trainer.logger.info(f"wrote {path} ({trainer.model.num_gaussians} Gaussians)")
