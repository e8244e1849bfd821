"""Camera pose refinement: a learned rigid correction per training image, applied to its camera before the render.

Poses from phones (ARKit drift) and from SfM on blurred frames are slightly wrong; the Gaussians then blur to
agree with every photo at once. ``se3`` gives each training image a twist ``xi = (v, omega)`` (a translation in
world units and an axis-angle rotation in radians, both in the camera's own axes), zero at the start, and renders
it through ``exp(xi) @ viewmat``: the camera moved by that rigid motion. The twists have their own Adam, which
moves a twist only in the steps that train on its image (:class:`~gsrecon.model.views.optim.VisitedRowsAdam`), an
exponential learning-rate decay and a pull toward zero (``reg``); the renderer's gradients reach them through the
view matrices (the torch renderer is differentiable in them, gsplat gives view-matrix gradients on pinhole
cameras). Test views have no correction of their own: they are scored at their given poses (``eval: given``), or
each at a pose fitted to its photo first (``eval: fit``, the test-time pose optimisation of BARF-style
evaluations), which aligns a test view with a scene whose training cameras moved together.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gsrecon.config import run_steps
from gsrecon.model.views.base import ViewModule
from gsrecon.registry import VIEW_REGISTRY

if TYPE_CHECKING:
    from gsrecon.data.pipeline import Batch
    from gsrecon.render.base import RenderOutput

POSE_EVALS = ("given", "fit")


def se3_exp(twists: Tensor) -> Tensor:
    """The rigid transforms [B, 4, 4] of ``twists`` [B, 6] (translation part v, then axis-angle rotation omega):
    the matrix exponential of each twist's 4x4 se(3) matrix; exactly the identity for a zero twist."""
    v, w = twists[:, :3], twists[:, 3:]  # [B, 3] each
    zero = torch.zeros_like(w[:, 0])  # [B]
    rows = [
        zero, -w[:, 2], w[:, 1], v[:, 0],
        w[:, 2], zero, -w[:, 0], v[:, 1],
        -w[:, 1], w[:, 0], zero, v[:, 2],
        zero, zero, zero, zero,
    ]  # fmt: skip
    return torch.linalg.matrix_exp(torch.stack(rows, dim=-1).view(-1, 4, 4))


def corrected_viewmats(viewmats: Tensor, twists: Tensor) -> Tensor:
    """World-to-camera ``viewmats`` [B, 4, 4] with each camera moved by its twist [B, 6]: ``exp(xi) @ viewmat``."""
    return se3_exp(twists) @ viewmats


@VIEW_REGISTRY.register("se3")
class PoseCorrection(ViewModule):
    """One rigid correction per training image, looked up by image name; the camera moves, the photo stays."""

    kind = "pose"
    moves_cameras = True

    @dataclass
    class Config(ViewModule.Config):
        lr: float = 1e-3  # Adam learning rate of the twists (world units and radians per step on its image, roughly)
        lr_final_factor: float = 0.01  # the learning rate decays exponentially to this fraction of lr ...
        decay_steps: int = run_steps(30_000)  # ... at this step (left unset: the run's max_steps), then stays
        reg: float = 1e-3  # weight of the mean squared length of the twists: a pull toward the given poses
        eval: str = "given"  # test views: given (scored at their poses) | fit (each pose fitted to its photo first)
        eval_steps: int = 50  # fit: Adam steps fitting a test view's twist
        eval_lr: float = 1e-3  # fit: their learning rate

        def __post_init__(self) -> None:
            super().__post_init__()
            if self.eval not in POSE_EVALS:
                raise ValueError(f"eval must be one of {', '.join(POSE_EVALS)}, got '{self.eval}'")
            for key in ("reg", "eval_lr"):
                value = getattr(self, key)
                if not (math.isfinite(value) and value >= 0):
                    raise ValueError(f"{key} must be a finite number >= 0, got {value!r}")
            if not (math.isfinite(self.lr_final_factor) and 0 < self.lr_final_factor <= 1):
                raise ValueError(f"lr_final_factor must be in (0, 1], got {self.lr_final_factor!r}")
            if self.decay_steps < 1:
                raise ValueError(f"decay_steps must be >= 1, got {self.decay_steps}")
            if self.eval_steps < 1:
                raise ValueError(f"eval_steps must be >= 1, got {self.eval_steps}")

    def __init__(self, cfg: Config, train_names: list[str]) -> None:
        super().__init__(cfg, train_names)
        self.twists = torch.nn.Parameter(torch.zeros(len(train_names), 6))  # [N, 6]: v (world units), omega (rad)

    def build_scheduler(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
        """Exponential decay from ``lr`` to ``lr × lr_final_factor`` over ``decay_steps``, constant afterwards."""
        cfg = self.cfg
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: cfg.lr_final_factor ** (min(step, cfg.decay_steps) / cfg.decay_steps)
        )

    def camera_poses(self, viewmats: Tensor, names: list[str]) -> Tensor:
        """The training cameras ``names`` as corrected: their given ``viewmats`` [B, 4, 4] moved by their twists."""
        return corrected_viewmats(viewmats, self.twists[self.rows(names, self.twists.device)])

    def adjust_cameras(self, batch: Batch) -> Batch:
        cameras = batch.cameras
        return dataclasses.replace(
            batch, cameras=cameras.with_viewmats(self.camera_poses(cameras.viewmats, batch.names))
        )

    def regularization(self) -> Tensor:
        """``reg`` × the mean over training images of the squared length of their twists."""
        return self.cfg.reg * self.twists.square().sum(-1).mean()

    def eval_cameras(self, batch: Batch, render: Callable[[Batch], RenderOutput]) -> Batch:
        if self.cfg.eval == "given":
            return batch
        return fit_pose(batch, render, self.cfg.eval_steps, self.cfg.eval_lr)


def fit_pose(batch: Batch, render: Callable[[Batch], RenderOutput], steps: int, lr: float) -> Batch:
    """``batch`` (one view) with its camera moved to where its render matches its photo best: ``steps`` Adam steps
    on a twist from zero, minimising the L1 difference over the pixels its mask keeps. Only the twist learns: the
    scene's parameters get no gradient."""
    cameras = batch.cameras
    twist = torch.zeros(1, 6, device=cameras.viewmats.device, requires_grad=True)  # [1, 6]
    optimizer = torch.optim.Adam([twist], lr=lr)
    viewmats = cameras.viewmats.detach()
    with torch.enable_grad():
        for _ in range(steps):
            out = render(dataclasses.replace(batch, cameras=cameras.with_viewmats(corrected_viewmats(viewmats, twist))))
            error = (out.image - batch.images).abs().mean(-1, keepdim=True)  # [1, H, W, 1]
            loss = error.mean() if batch.masks is None else (error * batch.masks).sum() / batch.masks.sum().clamp_min(1)
            (twist.grad,) = torch.autograd.grad(loss, [twist])
            optimizer.step()
    return dataclasses.replace(batch, cameras=cameras.with_viewmats(corrected_viewmats(viewmats, twist.detach())))
