"""The depth prior from the SfM points each photo observed (gsplat's ``depth_loss``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gsrecon.config import ConfigError
from gsrecon.losses.base import LossInputs, LossTerm
from gsrecon.registry import LOSS_REGISTRY

if TYPE_CHECKING:
    from gsrecon.data.pipeline import DataPipeline


def point_depth_loss(depth: Tensor, observed: list[Tensor]) -> Tensor | None:
    """Mean absolute difference of disparities (1 / depth) between the rendered ``depth`` [B, H, W, 1] and the
    points each view observed, ``observed[b]`` [P_b, 3] (pixel x, y with centres at +0.5, camera z), at the pixel
    each point lands in; points where nothing is rendered (depth 0) are left out. None where no point is left.

    The pixel's value, not a bilinear sample: next to a silhouette a bilinear sample would mix in the 0 of the
    empty side and ask for a depth that nothing has."""
    differences = []
    for view, points in zip(depth, observed):
        x, y = points[:, 0].long(), points[:, 1].long()  # [P] (non-negative coordinates: truncation is floor)
        rendered = view[y, x, 0]  # [P]
        hit = rendered > 0
        differences.append((1.0 / rendered[hit] - 1.0 / points[hit, 2]).abs())
    if sum(len(d) for d in differences) == 0:
        return None
    return torch.cat(differences).mean()


@LOSS_REGISTRY.register("depth_prior")
class DepthPriorTerm(LossTerm):
    """Scene extent × mean |1 / rendered depth - 1 / z| at the pixels where each photo's SfM points land, seen from
    the camera the photo was rendered from (moved by pose refinement, ``pose_opt``, where it is on); needs a
    COLMAP model or points triangulated from a transforms.json capture (``model.init: auto``)."""

    @dataclass
    class Config(LossTerm.Config):
        weight: float = 0.01

    def setup(self, data: DataPipeline, where: str) -> None:
        if not data.scene.observed:
            raise ConfigError(
                f"{where}: the depth prior needs SfM points and the photos that observed them (a COLMAP model, or a "
                f"transforms.json capture triangulated by model.init: auto); data.path "
                f"'{data.cfg.path or data.cfg.dataset}' gives none: remove the term (loss.depth_prior=null)"
            )

    def __call__(self, inputs: LossInputs) -> Tensor | None:
        # From the cameras the image was rendered from: those a per-view module moved carry its gradients; the
        # others are the given poses, whose targets are kept (no per-step comparison, which would wait for a GPU).
        viewmats = inputs.batch.cameras.viewmats
        observed = inputs.data.point_depths(inputs.batch.names, viewmats if viewmats.requires_grad else None)
        error = point_depth_loss(inputs.render.depth, observed)
        return None if error is None else inputs.data.scene.extent * error
