"""Floater pruning: the Gaussians in front of the surface in every training view that sees them go.

A pruner a run composes with its strategy (``hooks.PruneFloatersHook`` runs it on its schedule): it renders the
training views and removes rows through the run's :class:`~gsrecon.model.ops.GaussianEditor`, so the optimiser
moments and the state entries the strategy declares per Gaussian lose the same rows, whatever the strategy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gsrecon.config import run_steps
from gsrecon.data.pipeline import Batch
from gsrecon.model.ops import GaussianEditor
from gsrecon.render.base import RenderOutput


class FloaterPruner:
    """Every ``every`` steps from ``start`` until ``stop``: removes the Gaussians whose centre, in each training view
    where it lands inside the image, lies in front of what that pixel shows (camera z below ``1 - margin`` times the
    rendered depth there, where the accumulated opacity is at least ``min_alpha``). Such a Gaussian is part of no
    surface any photo sees: haze or a floater."""

    @dataclass
    class Config:
        start: int = run_steps(6000)  # the surfaces need a few thousand steps to form first
        every: int = run_steps(3000)
        stop: int = run_steps(24_000)
        margin: float = 0.2  # how far in front of the rendered depth, as a fraction of it
        min_alpha: float = 0.5  # pixels less opaque than this show no surface to be in front of

    def __init__(self, cfg: Config) -> None:
        if cfg.every < 1:
            raise ValueError(f"every must be >= 1, got {cfg.every}")
        if not 0.0 < cfg.margin < 1.0:
            raise ValueError(f"margin must be in (0, 1), got {cfg.margin}")
        if not 0.0 <= cfg.min_alpha <= 1.0:
            raise ValueError(f"min_alpha must be in [0, 1], got {cfg.min_alpha}")
        self.cfg = cfg

    def due(self, step: int) -> bool:
        """Whether the pruner runs after ``step`` steps."""
        cfg = self.cfg
        return cfg.start <= step <= cfg.stop and step % cfg.every == 0

    def prune(self, editor: GaussianEditor, render: Callable[[Batch], RenderOutput], views: Iterable[Batch]) -> int:
        """Remove the floaters of ``views`` rendered by ``render`` through ``editor``; the number removed."""
        return editor.remove(find_floaters(render, views, editor.num_gaussians, self.cfg.margin, self.cfg.min_alpha))


@torch.no_grad()
def find_floaters(
    render: Callable[[Batch], RenderOutput], views: Iterable[Batch], n: int, margin: float, min_alpha: float
) -> Tensor:
    """[n] bool: the Gaussians whose centre lands inside at least one of ``views`` (rendered by ``render``) and lies,
    in every such view, closer than ``1 - margin`` times the rendered depth at its pixel, where that pixel's
    opacity is at least ``min_alpha``."""
    seen = in_front = None
    for batch in views:
        out = render(batch)
        if seen is None:
            seen = torch.zeros(n, dtype=torch.int32, device=out.depth.device)
            in_front = torch.zeros_like(seen)
        for view in range(len(batch.names)):
            ids, pixels, depths = _visible(out, view)  # [V], [V, 2], [V]
            x, y = pixels[:, 0].floor().long(), pixels[:, 1].floor().long()
            inside = (x >= 0) & (y >= 0) & (x < batch.cameras.width) & (y < batch.cameras.height)
            ids, x, y, depths = ids[inside], x[inside], y[inside], depths[inside]
            surface = out.depth[view, y, x, 0]  # [V']
            front = (out.alpha[view, y, x, 0] >= min_alpha) & (depths < (1.0 - margin) * surface)
            seen.index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))
            in_front.index_add_(0, ids, front.int())
    if seen is None:
        raise ValueError("find_floaters needs at least one view")
    return (seen > 0) & (in_front == seen)


def _visible(out: RenderOutput, view: int) -> tuple[Tensor, Tensor, Tensor]:
    """(ids [V], pixel centres [V, 2], camera z [V]) of the Gaussians ``view`` of ``out`` rendered."""
    info: dict[str, Any] = out.info
    if info.get("gaussian_ids") is not None:  # gsplat packed: one row per visible (camera, Gaussian) pair
        rows = info["camera_ids"] == view
        return info["gaussian_ids"][rows], info["means2d"][rows], info["depths"][rows]
    ids = (info["radii"][view] > 0).all(dim=-1).nonzero()[:, 0]
    return ids, info["means2d"][view, ids], info["depths"][view, ids]
