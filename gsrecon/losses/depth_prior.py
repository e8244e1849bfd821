"""The depth prior from the SfM points each photo observed (gsplat's ``depth_loss``), and where those points land in
each training view (:class:`ObservedPoints`, built when the term is set up)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gsrecon.cameras.lens import project_points
from gsrecon.component import RunFacts, RunSetup
from gsrecon.data.scene import decoded
from gsrecon.losses.base import LossInputs, LossTerm
from gsrecon.registry import LOSS_REGISTRY

if TYPE_CHECKING:
    from gsrecon.data.pipeline import DataPipeline
    from gsrecon.data.scene import Frame


class ObservedPoints:
    """Per training view, ``[P_i, 3]``: pixel x, y (pixel centres at +0.5) and camera-space z of the SfM points its
    photo observed (``Scene.observed``) that land in front of the camera, inside the image and on pixels its mask
    keeps; [0, 3] for a view without observations. Seen from the given poses they are computed here, once."""

    def __init__(self, data: DataPipeline) -> None:
        self.points = data.scene.points  # [P, 3]
        self.observed = data.scene.observed
        self.device = data.device
        self.frames = {frame.name: frame for frame in data.train_frames}
        self.given = {name: self._project(frame, frame.viewmat) for name, frame in self.frames.items()}

    def __call__(self, names: list[str], viewmats: Tensor | None = None) -> list[Tensor]:
        """The points of the training views ``names``, seen from their given poses, or from their rows of
        ``viewmats`` [B, 4, 4] (world-to-camera, e.g. a training batch's cameras moved by pose refinement; a target:
        no gradient reaches them) where given."""
        depths = []
        for row, name in enumerate(names):
            frame = self.frames[name]
            viewmat = None if viewmats is None else viewmats[row].detach()
            moved = viewmat is not None and not torch.equal(viewmat, frame.viewmat.to(viewmat))
            depths.append(self._project(frame, viewmat) if moved else self.given[name])
        return depths

    def _project(self, frame: Frame, viewmat: Tensor) -> Tensor:
        """[P', 3] pixel x, y and camera z of ``frame``'s observed points as its camera sees them from the
        world-to-camera ``viewmat`` [4, 4], those outside its image or on pixels its mask leaves out (a moving person,
        the sky) left out."""
        rows = self.observed.get(frame.name, torch.zeros(0, dtype=torch.int64)).to(self.points.device)
        seen_at, seen = project_points(
            self.points[rows].to(self.device), viewmat.to(self.device), frame.K.to(self.device), frame.camera_model
        )  # [P, 3], [P]
        pixels = seen_at[:, :2]  # [P, 2]
        inside = seen & (pixels >= 0).all(-1) & (pixels[:, 0] < frame.width) & (pixels[:, 1] < frame.height)
        observed = seen_at[inside]  # [P', 3]
        if frame.mask is None:
            return observed
        kept = decoded(frame.mask).to(self.device)[observed[:, 1].long(), observed[:, 0].long()]  # [P'] on kept pixels
        return observed[kept]


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

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self.points: ObservedPoints | None = None  # built by setup

    def check(self, run: RunFacts) -> None:
        if not run.sfm_tracks:
            data = run.config["data"]
            raise ValueError(
                "the depth prior needs SfM points and the photos that observed them (a COLMAP model, or a "
                f"transforms.json capture triangulated by model.init: auto); data.path "
                f"'{data['path'] or data['dataset']}' gives none: remove the term (loss.depth_prior=null)"
            )

    def setup(self, run: RunSetup) -> None:
        self.points = ObservedPoints(run.data)

    def __call__(self, inputs: LossInputs) -> Tensor | None:
        # From the cameras the image was rendered from: those a per-view module moved carry its gradients; the
        # others are the given poses, whose targets are kept (no per-step comparison, which would wait for a GPU).
        viewmats = inputs.batch.cameras.viewmats
        observed = self.points(inputs.batch.names, viewmats if viewmats.requires_grad else None)
        error = point_depth_loss(inputs.render.depth, observed)
        return None if error is None else inputs.data.scene.extent * error
