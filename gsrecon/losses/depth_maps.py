"""Depth maps from the capture (:mod:`gsrecon.data.formats.depths`) as a loss term: ``loss.depth_maps``."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from gsrecon.component import RunFacts
from gsrecon.losses.base import LossInputs, LossTerm
from gsrecon.registry import LOSS_REGISTRY


def aligned_depths(rendered: Tensor, target: Tensor, valid: Tensor) -> Tensor:
    """``target`` [B, H, W, 1] mapped per view by the scale and shift that bring it closest to ``rendered`` (least
    squares over the ``valid`` pixels, [B, H, W, 1] bool; no gradient flows into the fit): a relative depth map
    (a monocular model's) in the scene's units."""
    weights = valid.to(rendered.dtype).flatten(1)  # [B, P]
    x, y = target.flatten(1), rendered.detach().flatten(1)  # [B, P]
    count = weights.sum(1).clamp_min(1.0)
    mean_x, mean_y = (weights * x).sum(1) / count, (weights * y).sum(1) / count  # [B]
    dx = (x - mean_x[:, None]) * weights
    scale = (dx * (y - mean_y[:, None])).sum(1) / (dx * dx).sum(1).clamp_min(1e-12)  # [B]
    shift = mean_y - scale * mean_x
    return target * scale[:, None, None, None] + shift[:, None, None, None]


def depth_map_loss(rendered: Tensor, target: Tensor, mask: Tensor | None, scale_shift: bool = False) -> Tensor | None:
    """Mean relative depth error ``|rendered - target| / target`` over the pixels that have a target depth (> 0),
    that ``mask`` keeps and where something is rendered (depth > 0); ``rendered``, ``target`` [B, H, W, 1], ``mask``
    [B, H, W, 1] (1 kept) or None.

    With ``scale_shift`` the target is first aligned to the render per view (:func:`aligned_depths`), and pixels it
    maps to a depth <= 0 are left out. None where no pixel is left."""
    valid = (target > 0) & (rendered.detach() > 0)
    if mask is not None:
        valid = valid & (mask > 0)
    if scale_shift:
        target = aligned_depths(rendered, target, valid)
        valid = valid & (target > 0)
    if not valid.any():
        return None
    return ((rendered[valid] - target[valid]).abs() / target[valid]).mean()


@LOSS_REGISTRY.register("depth_maps")
class DepthMapsTerm(LossTerm):
    """Mean ``|rendered depth - depth map| / depth map`` over the pixels of each photo's depth map that hold a depth
    (0 is none) and its mask keeps; needs depth maps (a transforms.json frame's ``depth_file_path``, ``depths/``
    beside the images, or ``data.synthetic.depth``). Views without one give it nothing.

    ``scale_shift: true`` is for relative depth maps (made offline with a monocular model, or in units other than
    the poses'): each map is scaled and shifted per view to fit the render (least squares) before it is compared."""

    @dataclass
    class Config(LossTerm.Config):
        weight: float = 0.1
        scale_shift: bool = False  # fit a scale and shift per view (relative depth maps) before comparing

    def check(self, run: RunFacts) -> None:
        if not run.depth_maps:
            data = run.config["data"]
            raise ValueError(
                "the depth maps term needs depth maps (a transforms.json frame's 'depth_file_path', a depths/ folder "
                f"beside images/); data.path '{data['path'] or data['dataset']}' gives none to its training images: "
                "remove the term (loss.depth_maps=null)"
            )

    def __call__(self, inputs: LossInputs) -> Tensor | None:
        batch = inputs.batch
        if batch.depths is None:
            return None
        return depth_map_loss(inputs.render.depth, batch.depths, batch.masks, self.cfg.scale_shift)
