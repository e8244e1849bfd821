"""An example per-view module: one exposure gain per training photo, applied to the render before the loss.

Used by custom_view.yaml (``imports: [exposure_view.py]``); copy it as a starting point. A module that corrects
the cameras instead overrides ``adjust_cameras(batch)``; one that scores test views differently, ``eval_adjust()``;
one that reads the run's data before training, ``setup(run)`` (``run.data``: the data pipeline; ``run.log``: lines
for the run's log).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gsrecon.model.views.base import ViewModule
from gsrecon.registry import VIEW_REGISTRY

if TYPE_CHECKING:
    from gsrecon.data.pipeline import Batch
    from gsrecon.render.base import RenderOutput


@VIEW_REGISTRY.register("exposure_gain")
class ExposureGain(ViewModule):
    """``image × exp(g_i)`` for training photo ``i``; ``reg`` × mean g² pulls the gains toward 1. Test views are
    scored as rendered (the base's ``eval_adjust``)."""

    @dataclass
    class Config(ViewModule.Config):
        lr: float = 1e-2
        reg: float = 1e-2

    def __init__(self, cfg: Config, train_names: list[str]) -> None:
        super().__init__(cfg, train_names)
        self.log_gains = torch.nn.Parameter(torch.zeros(len(train_names)))  # [N]

    def adjust_image(self, image: Tensor, batch: Batch, out: RenderOutput) -> Tensor:
        gains = self.log_gains[self.rows(batch.names, image.device)].exp()  # [B]
        return image * gains[:, None, None, None]

    def regularization(self, out: RenderOutput, batch: Batch) -> Tensor:
        return self.cfg.reg * self.log_gains.square().mean()
