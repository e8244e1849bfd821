"""Transients without masks: what changes between photos (a passer-by, a car) set aside from the loss, per photo.

``views: {transients: {name: transients}}`` turns it on. Each step, it compares the render (after the per-view
modules before it, e.g. appearance) with each training photo and sets aside the pixels where they disagree in a
patch, as RobustNeRF's trimmed loss with its spatial rule does, from the residuals alone (no pretrained network):

1. a pixel is a candidate where its residual (the mean over channels of |render - photo|) exceeds both
   ``min_residual`` and ``factor`` x the photo's median residual (early in training, when every pixel is far off,
   the median is high and nothing is set aside);
2. with ``check_views`` (default 4), it stays a candidate only where the other photos contradict this one: the
   point of the render's surface (its expected depth) is looked up in the ``check_views`` training photos nearest
   to the camera (as the module last saw them); at least two see it, each within ``agree`` of their median colour,
   and that median is more than ``min_residual`` from this photo's. A region the scene has not learnt yet disagrees
   with the render in every photo, so the others agree with this photo there and it stays in the loss (the
   single-photo rule, ``check_views: 0``, set aside 18.7 % of the statuette's pixels, mostly such regions); a
   distractor is in this photo only;
3. holes are filled: a pixel at least half of whose 3x3 neighbourhood are candidates is one;
4. a ``patch`` x ``patch`` patch in which at least ``patch_fraction`` of the pixels are candidates is set aside whole,
   and so are the candidates in the patches next to it (the object's edge); candidates far from any such patch
   (thin edges the scene has not learnt yet, fine texture) stay in the loss.

A set-aside pixel of the render is replaced by the photo's own value, so every loss term (L1, SSIM, and any other
comparing the image with the photo) sees no difference there and no gradient reaches the Gaussians from it. The
module sets nothing aside in its first ``start`` training steps, while the scene takes shape: from the first step, a
hard part of the scene (a dark, detailed object on white paper) disagrees in patches before it is learnt and was set
aside for good (the statuette with distractors lost 0.8 dB, BENCHMARKS.md, issue 52). It has no parameters; its
checkpoint state is the count of steps it has seen (the photos it keeps for the check, a uint8 copy of each training
photo on the training device, as much memory as ``data.cache: device``, are not checkpointed: a resumed run sees each
again within an epoch, and sets nothing aside in a photo until two others are seen). Test views are
scored as rendered. ``hooks.TransientImages`` writes what it sets aside in each training photo after training
(:mod:`gsrecon.hooks.transients`).

Measured (BENCHMARKS.md, issue 52, item 1): with the check it recovers 26 % of what pasted distractors cost the
statuette at 2000 steps and nothing at 1000, and is not shown harmless on the clean statuette at 2000 steps (without
the check it cost PSNR everywhere, setting aside what the young scene had not learnt): off by default.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from gsrecon.cameras.lens import project_points
from gsrecon.cameras.rays import camera_rays
from gsrecon.geometry import camera_centers
from gsrecon.model.views.base import RenderFn, ViewModule, ViewModules
from gsrecon.registry import VIEW_REGISTRY

if TYPE_CHECKING:
    from gsrecon.cameras import Cameras
    from gsrecon.data.pipeline import Batch
    from gsrecon.render.base import RenderOutput

# The largest patch side, pixels at the resolution trained on: a distractor's part, not a photo's (a larger patch than
# a photo is the whole photo, one patch)
MAX_PATCH = 1024


class Seen(NamedTuple):
    """A training photo as the module last saw it, for the other views' check."""

    photo: Tensor  # [H, W, 3] uint8
    cameras: Cameras  # its one camera


def set_aside(
    image: Tensor,
    photo: Tensor,
    factor: float,
    min_residual: float,
    patch: int,
    patch_fraction: float,
    mask: Tensor | None = None,
    contradicted: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """[B, H, W, 1] bool: the pixels of ``photo`` [B, H, W, 3] that the render ``image`` [B, H, W, 3] disagrees with in
    a patch (the module's rule, see the module docstring); ``mask`` [B, H, W, 1] (1 kept) leaves its ignored pixels
    out of the statistics and never sets them aside; ``contradicted``, when given, keeps a candidate only where it
    says other photos contradict this one (candidates [B, H, W, 1] bool -> the contradicted ones, [B, H, W, 1])."""
    residual = (image.detach() - photo).abs().mean(-1)  # [B, H, W]
    kept = torch.ones_like(residual, dtype=torch.bool) if mask is None else mask[..., 0] > 0  # [B, H, W]
    medians = torch.stack([r[k].median() if k.any() else r.new_tensor(math.inf) for r, k in zip(residual, kept)])
    threshold = torch.clamp(factor * medians, min=min_residual)  # [B]
    candidate = (residual > threshold[:, None, None]) & kept  # [B, H, W]
    if contradicted is not None and candidate.any():
        candidate &= contradicted(candidate[..., None])[..., 0]
    candidate = candidate.float()[:, None]  # [B, 1, H, W]
    filled_in = F.avg_pool2d(candidate, 3, stride=1, padding=1, count_include_pad=False) >= 0.5  # holes filled
    candidate = ((candidate > 0) | filled_in).float()
    height, width = candidate.shape[-2:]
    filled = F.avg_pool2d(candidate, patch, stride=patch, ceil_mode=True)  # [B, 1, h, w]: candidate fraction
    core = (filled >= patch_fraction).float()
    near = F.max_pool2d(core, 3, stride=1, padding=1)  # [B, 1, h, w]: a core patch or next to one

    def to_pixels(cells: Tensor) -> Tensor:  # [B, 1, h, w] -> [B, 1, H, W]: each pixel takes its patch's cell
        rows = torch.arange(height, device=cells.device) // patch
        cols = torch.arange(width, device=cells.device) // patch
        return cells.index_select(-2, rows).index_select(-1, cols) > 0

    aside = to_pixels(core) | (to_pixels(near) & (candidate > 0))  # [B, 1, H, W]
    return aside.permute(0, 2, 3, 1) & kept[..., None]


def other_views_contradict(
    photo: Tensor,
    depth: Tensor,
    cameras: Cameras,
    others: list[list[Seen]],
    agree: float,
    differ: float,
    where: Tensor | None = None,
) -> Tensor:
    """[B, H, W, 1] bool: where the photos of ``others`` (per view of the batch, other training views), looked up
    where each sees the point of the render's expected ``depth`` [B, H, W, 1] (camera z) through ``cameras``,
    contradict ``photo`` [B, H, W, 3]: at least two of them see the point, each one's colour there is within
    ``agree`` of their median colour, and that median is more than ``differ`` from the photo's (the mean absolute
    difference over channels). A point without depth is never contradicted; only the pixels ``where`` [B, H, W, 1]
    bool holds are looked at (None: all; the others are False)."""
    rays = camera_rays(cameras)  # [B, H, W, 3] unit, world
    along = torch.einsum("bhwi,bi->bhw", rays, cameras.viewmats[:, 2, :3])  # [B, H, W]: camera z per unit of ray
    points = camera_centers(cameras.viewmats)[:, None, None] + rays * (depth[..., 0] / along.clamp_min(1e-6))[..., None]
    looked_at = (depth > 0) if where is None else where & (depth > 0)  # [B, H, W, 1]
    contradicted = torch.zeros_like(looked_at)  # [B, H, W, 1]
    for b, seen_by in enumerate(others):
        at = looked_at[b, ..., 0].flatten().nonzero()[:, 0]  # [P]: only these pixels (most steps have few candidates)
        colours = []
        for other in seen_by:
            pixels, in_front = project_points(
                points[b].reshape(-1, 3)[at], other.cameras.viewmats[0], other.cameras.Ks[0], other.cameras.model
            )  # [P, 3], [P]
            size = pixels.new_tensor([other.cameras.width, other.cameras.height])
            grid = 2 * pixels[:, :2] / size - 1  # [P, 2] in [-1, 1] inside the frame (pixel centres at +0.5)
            inside = in_front & (grid.abs() <= 1).all(-1)  # [P]
            image = other.photo.permute(2, 0, 1)[None].to(photo.dtype) / 255  # [1, 3, H', W']
            colour = F.grid_sample(image, grid[None, None], align_corners=False)[0, :, 0].T  # [P, 3]
            colours.append(torch.where(inside[:, None], colour, torch.nan))
        if len(colours) < 2:
            continue
        colours = torch.stack(colours)  # [K, P, 3], NaN where a view does not see the point
        consensus = colours.nanmedian(0).values  # [P, 3]
        seen = (~colours[..., 0].isnan()).sum(0)  # [P]
        agreeing = ((colours - consensus).abs().mean(-1) < agree).sum(0)  # [P]
        differs = (consensus - photo[b].reshape(-1, 3)[at]).abs().mean(-1) > differ  # [P] (False where unseen)
        contradicted[b, ..., 0].view(-1)[at] = (agreeing == seen) & (seen >= 2) & differs
    return contradicted


@VIEW_REGISTRY.register("transients")
class TransientWeights(ViewModule):
    """Sets aside, in each training photo, the patches where the render and the photo disagree (see the module
    docstring); the render keeps the photo's values there, so the loss ignores them."""

    sets_transients_aside = True

    @dataclass
    class Config(ViewModule.Config):
        lr: float = 0.0  # no parameters to learn
        factor: float = 3.0  # a candidate's residual exceeds this times the photo's median residual ...
        min_residual: float = 0.1  # ... and this (colour in [0, 1], the mean over channels)
        patch: int = 8  # patch side in pixels (at the resolution trained on)
        patch_fraction: float = 0.5  # a patch this full of candidates is set aside with the candidates next to it
        start: int = 500  # training steps with the module on before it sets anything aside (the scene takes shape)
        check_views: int = 4  # other photos (the nearest; 0 or >= 2) that must contradict a photo where it is set aside
        agree: float = (
            0.1  # ... agreeing with each other, at the rendered surface, within this; check_views 0: no check
        )

        def __post_init__(self) -> None:
            super().__post_init__()
            for key in ("factor", "min_residual"):
                value = getattr(self, key)
                if not (math.isfinite(value) and value >= 0):
                    raise ValueError(f"{key} must be a finite number >= 0, got {value!r}")
            if self.min_residual > 1:
                raise ValueError(f"min_residual must be at most 1 (colours are in [0, 1]), got {self.min_residual}")
            if not (math.isfinite(self.patch_fraction) and 0 < self.patch_fraction <= 1):
                raise ValueError(f"patch_fraction must be in (0, 1], got {self.patch_fraction!r}")
            if not 1 <= self.patch <= MAX_PATCH:
                raise ValueError(f"patch must be between 1 and {MAX_PATCH} pixels, got {self.patch}")
            if self.start < 0:
                raise ValueError(f"start must be >= 0 steps, got {self.start}")
            if self.check_views < 0 or self.check_views == 1:  # the rule needs two other photos that agree
                raise ValueError(f"check_views must be 0 (no check) or >= 2, got {self.check_views}")
            if not (math.isfinite(self.agree) and 0 < self.agree <= 1):
                raise ValueError(f"agree must be in (0, 1] (colours are in [0, 1]), got {self.agree!r}")

    def __init__(self, cfg: Config, train_names: list[str]) -> None:
        super().__init__(cfg, train_names)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))  # training steps seen (checkpointed)
        # each training photo as last seen (not checkpointed: a resumed run sees them again within an epoch)
        self.seen: dict[str, Seen] = {}

    def others(self, names: list[str], cameras: Cameras) -> list[list[Seen]]:
        """Per view of ``names``, the ``check_views`` other training photos seen so far nearest to its camera."""
        if not self.seen:
            return [[] for _ in names]
        kept = list(self.seen.items())
        centres = camera_centers(torch.cat([seen.cameras.viewmats for _, seen in kept]))  # [S, 3]
        distances = torch.cdist(camera_centers(cameras.viewmats), centres.to(cameras.viewmats))  # [B, S]
        chosen = []
        for name, row in zip(names, distances):
            order = [kept[i][1] for i in row.argsort().tolist() if kept[i][0] != name]
            chosen.append(order[: self.cfg.check_views])
        return chosen

    def set_aside(self, image: Tensor, batch: Batch, depth: Tensor) -> Tensor:
        """[B, H, W, 1] bool: the pixels of ``batch``'s photos set aside from the render ``image`` [B, H, W, 3] whose
        expected depth is ``depth`` [B, H, W, 1] (with ``check_views``: the surface looked up in the other photos)."""
        cfg = self.cfg
        contradicted = None
        if cfg.check_views:

            def contradicted(candidates: Tensor) -> Tensor:
                others = self.others(batch.names, batch.cameras)
                return other_views_contradict(
                    batch.images, depth, batch.cameras, others, cfg.agree, cfg.min_residual, candidates
                )

        return set_aside(
            image, batch.images, cfg.factor, cfg.min_residual, cfg.patch, cfg.patch_fraction, batch.masks, contradicted
        )

    def adjust_image(self, image: Tensor, batch: Batch, out: RenderOutput) -> Tensor:
        """``image`` [B, H, W, 3] with the photo's values where :meth:`set_aside` sets pixels aside (from the depth of
        ``out``), once the module has seen ``start`` training steps (this is called once a step)."""
        self.steps += 1
        aside = None if self.steps <= self.cfg.start else self.set_aside(image, batch, out.depth.detach())
        self.remember(batch)
        return image if aside is None else torch.where(aside, batch.images, image)

    def remember(self, batch: Batch) -> None:
        """Keep ``batch``'s photos and cameras for the check of the other views (with ``check_views``)."""
        if self.cfg.check_views:
            for index, name in enumerate(batch.names):
                photo = (batch.images[index].detach() * 255).round().to(torch.uint8)  # [H, W, 3]
                self.seen[name] = Seen(photo, batch.cameras[index])

    def set_aside_in(
        self, views: ViewModules, batches: Callable[[], Iterable[Batch]], render: RenderFn
    ) -> Iterator[tuple[Batch, Tensor]]:
        """See :meth:`ViewModule.set_aside_in`; every photo is seen first, for the check of the others."""
        for batch in batches():
            self.remember(views.adjust_cameras(batch))
        for batch, image, out in views.seen_by(self, batches, render):
            yield batch, self.set_aside(image, batch, out.depth.detach())
