"""An example loss term: the mean squared error between the render and the photo.

Used by custom_loss.yaml (``imports: [mse_loss.py]``); copy it as a starting point for a term of your own. A term
that needs something from the data before training prepares it in ``setup(run)`` (``run.data``: the data pipeline).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from gsrecon.losses.base import LossInputs, LossTerm
from gsrecon.registry import LOSS_REGISTRY


@LOSS_REGISTRY.register("mse")
class MSETerm(LossTerm):
    """Mean (render - photo)² over the pixels the batch's masks keep."""

    @dataclass
    class Config(LossTerm.Config):
        weight: float = 0.5

    def __call__(self, inputs: LossInputs) -> Tensor:
        squared = (inputs.image - inputs.batch.images).square()  # [B, H, W, 3]
        mask = inputs.batch.masks  # [B, H, W, 1] or None
        if mask is None:
            return squared.mean()
        return (squared * mask).sum() / (mask.sum() * squared.shape[-1]).clamp_min(1.0)
