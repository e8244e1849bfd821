"""ExportHook: the trained Gaussians as a file (a reference-layout 3DGS ``.ply`` by default)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gsrecon.config import parse_structured
from gsrecon.engine.build import build_renderer
from gsrecon.engine.hook import Hook, Priority
from gsrecon.engine.inference import TrainedScene
from gsrecon.engine.resolve import RunConfig
from gsrecon.export import ExportContext, TrainedRun, export_gaussians
from gsrecon.model.views.base import export_notes
from gsrecon.registry import EXPORT_REGISTRY, HOOK_REGISTRY, RegistryError

if TYPE_CHECKING:
    from collections.abc import Callable

    from gsrecon.data.pipeline import Batch
    from gsrecon.engine.hook import TrainerView
    from gsrecon.render.base import RenderOutput


@HOOK_REGISTRY.register()
class ExportHook(Hook):
    """When training ends (also after Ctrl-C, not after a failure), writes the Gaussians to
    ``<exp_dir>/<path>`` in ``format`` (any name in ``EXPORT_REGISTRY``, a plugin's included; ``lod``: the run's levels
    of detail, built first, as a site whose ``path`` ends in ``lod-meta.json``), recording the renderer's antialiased
    mode where the format can. Only the main process writes."""

    priority = Priority.LOWEST

    @dataclass
    class Config:
        path: str = "point_cloud.ply"  # relative to exp_dir (or absolute)
        format: str = "ply"  # a registered export format: gsrecon export --help lists them

    def __init__(self, cfg: Config) -> None:
        if not cfg.path:
            raise ValueError("path is empty; remove the hook (hooks.ExportHook=null) to export nothing")
        try:
            EXPORT_REGISTRY.get(cfg.format).check_path(Path(cfg.path))
        except RegistryError as exc:
            raise ValueError(f"format: {exc}") from None
        self.cfg = cfg

    def outputs(self) -> list[str]:
        return [self.cfg.path]

    def after_train(self, trainer: TrainerView) -> None:
        if trainer.failed or not trainer.is_main:
            return
        path = trainer.exp_dir / self.cfg.path
        antialiased = bool(trainer.resolved_config["renderer"].get("antialiased", False))
        needs = EXPORT_REGISTRY.get(self.cfg.format).needs
        render = _surface_render(trainer) if "render" in needs else None
        run = _trained_run(trainer) if "run" in needs else None
        context = ExportContext(trainer.datapipeline.train_batches, render, run, overwrite=True)
        export_gaussians(trainer.model.params, path, self.cfg.format, antialiased=antialiased, context=context)
        trainer.logger.info(f"wrote {path} ({trainer.model.num_gaussians} Gaussians)")
        for note in export_notes(trainer.resolved_config):
            trainer.logger.info(f"{path}: {note}")


def _surface_render(trainer: TrainerView) -> Callable[[Batch], RenderOutput]:
    """The trainer's model rendered from a batch's cameras by its renderer, with the median depth, without
    gradients (what `ExportContext.render` gives)."""
    entry = {**trainer.resolved_config["renderer"], "median_depth": True}
    renderer = build_renderer(entry, trainer.logger, trainer.datapipeline)

    @torch.no_grad()
    def render(batch: Batch) -> RenderOutput:
        return renderer.render_batch(trainer.model.params, batch, trainer.model.active_sh_degree(trainer.step))

    return render


def _trained_run(trainer: TrainerView) -> TrainedRun:
    """The trainer's run folder with its scene as trained so far (what `ExportContext.run` gives), the folder's lock
    held by the trainer."""
    source = str(trainer.exp_dir)
    cfg = parse_structured(RunConfig, trainer.resolved_config, source)  # what its checkpoints store
    params = {name: value.detach().cpu().float() for name, value in trainer.model.params.items()}
    scene = TrainedScene(cfg, params, trainer.step, source, trainer.views.state_dict())
    return TrainedRun(trainer.exp_dir, scene, trainer.logger, str(trainer.device), held=True)
