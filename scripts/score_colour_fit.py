"""Benchmark plugin: the test views scored as rendered and after the best colour gain and bias per channel.

Imported by a run (``imports=[scripts/score_colour_fit.py]``), it registers the hook ``ScoreColourFit``: after
training it renders each test view, fits a gain and a bias per colour channel mapping the render to the photo by
least squares over the whole view, and logs the mean PSNR as rendered and after that fit. The difference is what
the test views' own exposure and white balance cost, which no model of the training photos can know; the PSNR after
the fit measures the rest (geometry, texture). It reads the run's test views only; nothing it does trains.

    python scripts/bench_sweep.py ... --scene "statuette=configs/mipnerf360.yaml data.path=... \\
        imports=[scripts/score_colour_fit.py] hooks.ScoreColourFit={}" --variant ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from gsrecon.engine.hook import Hook
from gsrecon.metrics import fit_colours, psnr
from gsrecon.registry import HOOK_REGISTRY

if TYPE_CHECKING:
    from gsrecon.engine.hook import TrainerView


@HOOK_REGISTRY.register()
class ScoreColourFit(Hook):
    """Logs the test views' mean PSNR as rendered and after a colour gain and bias per channel fitted to each."""

    def after_train(self, trainer: TrainerView) -> None:
        rendered, fitted = [], []
        with torch.no_grad():
            for batch in trainer.datapipeline.val_batches():
                image, photo = trainer.render(batch).image[0].clamp(0.0, 1.0), batch.images[0]  # [H, W, 3]
                rendered.append(psnr(image, photo))
                fitted.append(psnr(fit_colours(image, photo), photo))
        if rendered:
            trainer.logger.info(
                f"test views: psnr {sum(rendered) / len(rendered):.4f} as rendered, "
                f"{sum(fitted) / len(fitted):.4f} after a colour gain and bias fitted to each"
            )
