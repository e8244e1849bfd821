"""Flat Gaussians: the smallest scale of every Gaussian pulled toward zero (2DGS, PGSR, gsplat's 2DGS trainer)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gsrecon.losses.base import LossInputs, LossTerm
from gsrecon.registry import LOSS_REGISTRY


def flatten_loss(log_scales: Tensor) -> Tensor:
    """Mean over Gaussians of the smallest activated scale, from ``log_scales`` [N, 3]."""
    return torch.exp(log_scales.min(dim=-1).values).mean()


@LOSS_REGISTRY.register("flatten")
class FlattenTerm(LossTerm):
    """Mean smallest scale / scene extent: Gaussians become discs lying on the surfaces they draw (for meshes)."""

    @dataclass
    class Config(LossTerm.Config):
        weight: float = 100.0

    def __call__(self, inputs: LossInputs) -> Tensor | None:
        if inputs.params is None or len(inputs.params["scales"]) == 0:
            return None
        return flatten_loss(inputs.params["scales"]) / inputs.data.scene.extent
