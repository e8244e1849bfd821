"""TransientImages: what the per-view module that sets transients aside (``transients``, ``robust``) sets aside in
each training photo, as images."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from gsrecon.component import RunFacts
from gsrecon.data.formats.images import write_png
from gsrecon.engine.hook import Hook
from gsrecon.model.views.base import view_entries
from gsrecon.registry import HOOK_REGISTRY, VIEW_REGISTRY

if TYPE_CHECKING:
    from gsrecon.engine.hook import TrainerView

TINT = (1.0, 0.0, 1.0)  # magenta: what marks a set-aside pixel


@HOOK_REGISTRY.register()
class TransientImages(Hook):
    """After training, renders each training view and writes ``<folder>/<name>.png``: the photo, and beside it the
    photo with the pixels the run's module that sets transients aside (``transients`` or ``robust``) sets aside from
    the trained scene tinted magenta; logs the share of pixels set aside. A run without such a module is refused when
    it is built."""

    @dataclass
    class Config:
        folder: str = "transients"  # under exp_dir

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    def outputs(self) -> list[str]:
        return [self.cfg.folder]

    def check(self, run: RunFacts) -> None:
        """Refuse a run without a per-view module that sets transients aside: there is nothing to show."""
        names = [entry["name"] for entry in view_entries(dict(run.config)).values()]
        if not any(VIEW_REGISTRY.get(name).sets_transients_aside for name in names):
            raise ValueError(
                "it shows the pixels a per-view module sets aside as transients, and this run has none: add "
                "views.transients={} or views.robust={}"
            )

    def after_train(self, trainer: TrainerView) -> None:
        if not trainer.is_main or trainer.failed:
            return
        module = next(m for m in trainer.views.modules.values() if m.sets_transients_aside)
        aside_total = pixels = 0
        tint = torch.tensor(TINT, device=trainer.device)
        with torch.no_grad():
            for batch, aside in module.set_aside_in(trainer.views, trainer.datapipeline.train_batches, trainer.render):
                aside_total += int(aside.sum())  # aside: [B, H, W, 1]
                pixels += aside.numel()
                for name, photo, marked in zip(batch.names, batch.images, aside):
                    shown = torch.where(marked, 0.5 * photo + 0.5 * tint, photo)  # [H, W, 3]
                    write_png(trainer.exp_dir / self.cfg.folder / f"{name}.png", torch.cat([photo, shown], dim=1))
        trainer.logger.info(
            f"transients: {100 * aside_total / max(pixels, 1):.1f} % of the training pixels set aside from the trained "
            f"scene; wrote {trainer.exp_dir / self.cfg.folder}/"
        )
