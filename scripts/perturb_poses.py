"""Benchmark plugin: training poses made wrong by a known amount, as phone and SfM captures come.

Imported by a run (``imports=[scripts/perturb_poses.py]``), it registers the hook ``PerturbTrainingPoses``: before
the run, each training camera is turned by ``rotation_deg`` about a random axis through its centre and its centre
moved by ``translation`` × the scene's extent (the radius of the cameras' sphere) in a random direction, drawn from
``seed`` in the order of the training views. Test views keep their given poses, on which they are scored. After
training it logs how far the training cameras are from their true poses, as given and as the run placed them
(moved by pose refinement, ``pose_opt``): the mean rotation angle and the mean centre distance in % of the extent.

    python scripts/bench_sweep.py ... --variant "perturbed=imports=[scripts/perturb_poses.py] \\
        hooks.PerturbTrainingPoses.rotation_deg=1 hooks.PerturbTrainingPoses.translation=0.01"

A capture whose training poses are wrong in its file (``scripts/make_posed_capture.py``) is measured against the
true poses of another capture of the same frames (matched by name), without moving anything:
``hooks.PerturbTrainingPoses.rotation_deg=0 hooks.PerturbTrainingPoses.translation=0
hooks.PerturbTrainingPoses.truth=/tmp/capture_at_exact_poses``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gsrecon.data.readers.transforms import load_transforms
from gsrecon.engine.hook import Hook
from gsrecon.registry import HOOK_REGISTRY

if TYPE_CHECKING:
    from gsrecon.engine.hook import TrainerView


def rotation_about(axes: Tensor, angle: float) -> Tensor:
    """Rotations [N, 3, 3] by ``angle`` radians about the unit ``axes`` [N, 3] (Rodrigues)."""
    x, y, z = axes.unbind(-1)
    zero = torch.zeros_like(x)
    k = torch.stack([zero, -z, y, z, zero, -x, -y, x, zero], dim=-1).view(-1, 3, 3)
    eye = torch.eye(3, dtype=axes.dtype).expand_as(k)
    return eye + math.sin(angle) * k + (1.0 - math.cos(angle)) * (k @ k)


def pose_errors(viewmats: Tensor, truth: Tensor) -> tuple[float, float]:
    """The mean rotation angle (degrees) and the mean distance between the camera centres of world-to-camera
    ``viewmats`` and ``truth`` [N, 4, 4]."""
    relative = viewmats[:, :3, :3].double() @ truth[:, :3, :3].double().transpose(1, 2)  # [N, 3, 3]
    cosine = ((relative.diagonal(dim1=1, dim2=2).sum(-1) - 1.0) / 2.0).clamp(-1.0, 1.0)
    centres = [-(v[:, :3, :3].double().transpose(1, 2) @ v[:, :3, 3:].double())[..., 0] for v in (viewmats, truth)]
    return math.degrees(torch.acos(cosine).mean().item()), (centres[0] - centres[1]).norm(dim=-1).mean().item()


def perturbed_viewmats(viewmats: Tensor, rotation_deg: float, translation: float, seed: int) -> Tensor:
    """World-to-camera ``viewmats`` [N, 4, 4], each camera turned by ``rotation_deg`` about a random axis through
    its centre and its centre moved by ``translation`` (world units) in a random direction."""
    generator = torch.Generator().manual_seed(seed)
    count = viewmats.shape[0]
    axes = torch.nn.functional.normalize(torch.randn(count, 3, generator=generator, dtype=torch.float64), dim=-1)
    shifts = torch.nn.functional.normalize(torch.randn(count, 3, generator=generator, dtype=torch.float64), dim=-1)
    w2c = viewmats.double()
    rot_c2w, centres = w2c[:, :3, :3].transpose(1, 2), -(w2c[:, :3, :3].transpose(1, 2) @ w2c[:, :3, 3:])[..., 0]
    rot_c2w = rotation_about(axes, math.radians(rotation_deg)) @ rot_c2w  # [N, 3, 3]
    centres = centres + translation * shifts  # [N, 3]
    out = torch.eye(4, dtype=torch.float64).repeat(count, 1, 1)
    out[:, :3, :3] = rot_c2w.transpose(1, 2)
    out[:, :3, 3] = -(rot_c2w.transpose(1, 2) @ centres[..., None])[..., 0]
    return out.to(viewmats.dtype)


def true_viewmats(names: list[str], capture: str) -> Tensor:
    """The world-to-camera matrices [N, 4, 4] of the frames ``names`` in the transforms.json ``capture`` (a folder)."""
    poses = {frame.name: frame.viewmat for frame in load_transforms(capture, eval_split="none", lazy=True).train}
    return torch.stack([poses[name] for name in names])


@HOOK_REGISTRY.register()
class PerturbTrainingPoses(Hook):
    """Moves the training cameras the data pipeline holds by a known, seeded error before the run."""

    @dataclass
    class Config:
        rotation_deg: float = 1.0  # each training camera turned by this angle
        translation: float = 0.01  # and moved by this fraction of the scene's extent
        seed: int = 0  # draws the axes and directions
        truth: str = ""  # a transforms.json capture holding the training frames' true poses ("": the poses as loaded)

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.truth: Tensor | None = None  # [N, 4, 4] the training cameras' true poses

    def before_run(self, trainer: TrainerView) -> None:
        frames = trainer.datapipeline._train  # the training frames batches are made of
        self.truth = torch.stack([frame.viewmat.cpu() for frame in frames])  # [N, 4, 4]
        if self.cfg.truth:
            self.truth = true_viewmats([frame.name for frame in frames], self.cfg.truth)
        if self.cfg.rotation_deg == 0 and self.cfg.translation == 0:
            return  # measured only: the poses stay as loaded, bit for bit
        shift = self.cfg.translation * trainer.scene_extent
        moved = perturbed_viewmats(self.truth, self.cfg.rotation_deg, shift, self.cfg.seed)
        for frame, viewmat in zip(frames, moved):
            frame.viewmat.copy_(viewmat)

    def after_train(self, trainer: TrainerView) -> None:
        frames = trainer.datapipeline._train
        given = torch.stack([frame.viewmat for frame in frames])  # [N, 4, 4]
        with torch.no_grad():
            placed = trainer.views.camera_poses(given, [frame.name for frame in frames]).cpu()
        extent = trainer.scene_extent
        (given_deg, given_dist), (placed_deg, placed_dist) = (pose_errors(v, self.truth) for v in (given.cpu(), placed))
        trainer.logger.info(
            f"training cameras from their true poses: given {given_deg:.3f} deg, {100 * given_dist / extent:.3f} % "
            f"of the extent; placed {placed_deg:.3f} deg, {100 * placed_dist / extent:.3f} %"
        )
