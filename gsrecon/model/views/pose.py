"""Camera pose refinement: a learned rigid correction per training image, applied to its camera before the render.

Poses from phones (ARKit drift) and from SfM on blurred frames are slightly wrong; the Gaussians then blur to
agree with every photo at once. ``se3`` gives each training image a twist ``xi = (v, omega)`` (a translation in
world units and an axis-angle rotation in radians, both in the camera's own axes), zero at the start, and renders
it through ``exp(xi) @ viewmat``: the camera moved by that rigid motion. The twists have their own Adam, which
moves a twist only in the steps that train on its image (:class:`~gsrecon.model.views.optim.VisitedRowsAdam`), an
exponential learning-rate decay and a pull toward zero (``reg``); the renderer's gradients reach them through the
view matrices (the torch renderer is differentiable in them, gsplat gives view-matrix gradients on pinhole
cameras).

Only views whose poses the capture's own features contradict are refined. At the first step each training view's
SfM points (``Scene.observed``; those seen by fewer than three photos left out) are seen from its given pose and
compared with where its photo saw them (``Scene.keypoints``, from the COLMAP model or gsrecon's triangulation). A
view within ``trust_px`` of them (the median, in pixels of the images the keypoints were found in) keeps its given
pose. A view beyond it is resected (``resect``): its pose is fitted to its keypoints and points, and where the fitted
pose brings them at least twice as near, the view starts from it. A view within ``trust_px`` at the pose it starts
from keeps that pose and its twist never moves; the others are refined photometrically from there. A capture whose
every view agrees with its keypoints trains exactly as without the module: on exact poses the photometric gradient
alone cannot tell a real pose error from the young scene's errors, and the twists moved every camera by 0.3-0.7
degrees (BENCHMARKS.md, issue 38). A transforms.json capture whose points come from a file (a PLY, without
keypoints) has them triangulated from its poses for this. Views without keypoints (a random start, triangulation
without pycolmap or too few points, fisheye frames of a triangulated capture, fewer than eight points seen by three
photos) are refined, or keep their given poses with ``without_keypoints: keep``.

Test views have no correction of their own: they are scored at their given poses (``eval: given``), or each at a
pose fitted to its photo first (``eval: fit``, the test-time pose optimisation of BARF-style evaluations), which
aligns a test view with a scene whose training cameras moved together.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gsrecon.cameras.lens import project_points
from gsrecon.component import RunSetup
from gsrecon.config import run_steps
from gsrecon.data.scene import Frame
from gsrecon.errors import InputError
from gsrecon.model.views.base import ViewModule
from gsrecon.optim import Adam, LambdaLR, Optimizer
from gsrecon.registry import VIEW_REGISTRY

if TYPE_CHECKING:
    from gsrecon.data.pipeline import Batch
    from gsrecon.render.base import RenderOutput

POSE_EVALS = ("given", "fit")
WITHOUT_KEYPOINTS = ("refine", "keep")


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
        # A training view whose given pose puts its SfM points within this many pixels (the median, in pixels of the
        # image its keypoints were found in) of where its photo saw them keeps that pose; views beyond it are resected
        # (resect) and refined where that does not bring them within it. 0 refines every view.
        trust_px: float = 1.0
        # A view beyond trust_px starts from its resection (its pose fitted to its SfM points and keypoints) where that
        # brings them at least twice as near; then trust_px decides whether it keeps that pose. false: given poses.
        resect: bool = True
        # Views without keypoints to measure their poses against: refine (as every view without the check) | keep
        # (their given poses; se3 then changes only what keypoints show to be wrong)
        without_keypoints: str = "refine"

        def __post_init__(self) -> None:
            super().__post_init__()
            if self.eval not in POSE_EVALS:
                raise ValueError(f"eval must be one of {', '.join(POSE_EVALS)}, got '{self.eval}'")
            if self.without_keypoints not in WITHOUT_KEYPOINTS:
                raise ValueError(
                    f"without_keypoints must be one of {', '.join(WITHOUT_KEYPOINTS)}, got '{self.without_keypoints}'"
                )
            for key in ("reg", "eval_lr", "trust_px"):
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
        # [N] each view's median distance in pixels between its keypoints and its SfM points seen from its given pose;
        # inf: no keypoints to measure it; NaN: not measured (at a run's first step, from the poses it trains from).
        # Kept on the CPU, where the steps read it without waiting for an accelerator.
        self.reprojection_px = torch.full((len(train_names),), math.nan)
        self.frames: list[Frame] = []  # the training frames, row for row (setup)
        self.tracks: dict[str, tuple[Tensor, Tensor, float]] = {}  # name -> points, keypoints, scale (setup)
        self.log: Callable[[str], None] = lambda line: None

    def setup(self, run: RunSetup) -> None:
        """Keep the training frames and, for each, the SfM points it observed that at least :data:`MIN_TRACK`
        photos observed (with its keypoints of them, and their scale), to measure how well its pose fits them. A
        scene without keypoints whose reader can triangulate them from the known poses (a capture with a point cloud
        file) is asked to."""
        self.frames = self.frames_by_row(run.data)
        self.log = run.log
        scene = run.data.scene
        sfm = scene.read_tracks
        if self.cfg.trust_px > 0:
            try:
                sfm = scene.sfm_tracks(run.log)
            except InputError as exc:
                run.log(f"pose_opt: no SfM keypoints to measure the poses against ({exc})")
        counts = torch.zeros(len(sfm.points), dtype=torch.int64)  # [P] photos that observed each point
        for rows in sfm.observed.values():
            counts[rows] += 1
        self.tracks = {}
        for name, keypoints in sfm.keypoints.items():
            long = counts[sfm.observed[name]] >= MIN_TRACK  # [P_i]
            points = sfm.points[sfm.observed[name][long]]  # [P_i', 3]
            self.tracks[name] = (points, keypoints[long], sfm.keypoint_scale[name])

    def trained_rows(self, names: list[str], device: torch.device) -> Tensor:
        """The rows of ``names`` whose views are refined: every one with ``trust_px`` 0, else those whose keypoints
        lie beyond ``trust_px`` of where their poses put their points, and those that have none as
        ``without_keypoints`` says."""
        refined = self.refined()
        rows = [self.index[name] for name in names if refined[self.index[name]]]
        return torch.tensor(rows, dtype=torch.int64, device=device)

    def refined(self) -> Tensor:
        """[N] bool: whether each training view's pose is refined (not measured yet: refined)."""
        if self.cfg.trust_px == 0:
            return torch.ones_like(self.reprojection_px, dtype=torch.bool)
        refined = ~(self.reprojection_px <= self.cfg.trust_px)
        untracked = torch.isinf(self.reprojection_px)
        return refined & ~untracked if self.cfg.without_keypoints == "keep" else refined

    def measure_poses(self) -> None:
        """Measure how far each training view's SfM points fall from its keypoints at its given pose, resect the views
        beyond ``trust_px`` (``resect``), set ``reprojection_px`` from the poses training starts from, and log which
        views are refined and which keep their poses."""
        given = torch.tensor(
            [reprojection_px(frame, *self.tracks.get(frame.name, (None, None, 1.0))) for frame in self.frames]
        )  # [N] pixels at the given poses; inf without keypoints
        self.reprojection_px = given.clone()
        if self.cfg.resect:
            self.resect_views(~(given <= self.cfg.trust_px) & torch.isfinite(given))
        start, refined = self.reprojection_px, self.refined()
        resected, untracked = start < given, torch.isinf(start)
        median = lambda px, rows: f"{px[rows].median().item():.2f} px"  # noqa: E731
        tracked, kept = refined & ~untracked, ~refined
        why = [f"{int((refined & untracked).sum())} without SfM keypoints"] if (refined & untracked).any() else []
        if tracked.any():
            why.append(
                f"{int(tracked.sum())} whose SfM keypoints lie a median {median(start, tracked)} from their points"
            )
        if (refined & resected).any():
            why.append(f"{int((refined & resected).sum())} of them from their resections")
        as_given, as_resected = kept & ~resected & ~untracked, kept & resected
        keep = []
        if as_given.any():
            keep.append(f"{int(as_given.sum())} keep their given poses (a median {median(given, as_given)})")
        if as_resected.any():
            moved = f"{median(given, as_resected)} -> {median(start, as_resected)}"
            keep.append(f"{int(as_resected.sum())} keep the poses their keypoints give (resected: a median {moved})")
        unmeasured = (
            f"; {int((kept & untracked).sum())} without SfM keypoints keep their given poses "
            f"(without_keypoints: {self.cfg.without_keypoints})"
        )
        self.log(
            f"pose_opt: refining {int(refined.sum())} of {len(start)} training views"
            + (f" ({', '.join(why)})" if why else "")
            + f"; within trust_px {self.cfg.trust_px:g}: {', '.join(keep) or 'none'}"
            + (unmeasured if (kept & untracked).any() else "")
        )

    def resect_views(self, rows: Tensor) -> None:
        """Resect the views ``rows`` ([N] bool): where a resection brings a view's points :data:`RESECTION_GAIN` times
        nearer its keypoints or more (and :data:`RESECTION_MIN_PX` or more), its ``reprojection_px`` becomes the
        resected pose's and its twist starts there.
        A twist that is not zero (a resumed run) keeps its value: the same resection placed it at the first step."""
        fresh = (self.twists.detach().cpu() == 0).all(-1)  # [N]
        for row in rows.nonzero().flatten().tolist():
            frame = self.frames[row]
            points, keypoints, scale = self.tracks[frame.name]
            twist, median_px = resected_twist(frame, points, keypoints)
            before, after = self.reprojection_px[row].item(), scale * median_px
            if after < RESECTION_GAIN * before and after < before - RESECTION_MIN_PX:
                self.reprojection_px[row] = after
                if fresh[row]:
                    with torch.no_grad():
                        self.twists[row] = twist.to(self.twists)

    def build_scheduler(self, optimizer: Optimizer) -> LambdaLR:
        """Exponential decay from ``lr`` to ``lr × lr_final_factor`` over ``decay_steps``, constant afterwards."""
        cfg = self.cfg
        return LambdaLR(optimizer, lambda step: cfg.lr_final_factor ** (min(step, cfg.decay_steps) / cfg.decay_steps))

    def camera_poses(self, viewmats: Tensor, names: list[str]) -> Tensor:
        """The training cameras ``names`` as corrected: their given ``viewmats`` [B, 4, 4] moved by their twists."""
        return corrected_viewmats(viewmats, self.twists[self.rows(names, self.twists.device)])

    def adjust_cameras(self, batch: Batch) -> Batch:
        if self.frames and torch.isnan(self.reprojection_px).any():
            self.measure_poses()
        cameras = batch.cameras
        poses = self.camera_poses(cameras.viewmats, batch.names)
        if not self.refined()[[self.index[name] for name in batch.names]].any():
            poses = poses.detach()  # no twist here learns: the renderer skips the cameras' gradients
        return dataclasses.replace(batch, cameras=cameras.with_viewmats(poses))

    def regularization(self, out: RenderOutput, batch: Batch) -> Tensor:
        """``reg`` × the mean over training images of the squared length of their twists."""
        return self.cfg.reg * self.twists.square().sum(-1).mean()

    def eval_cameras(self, batch: Batch, render: Callable[[Batch], RenderOutput]) -> Batch:
        if self.cfg.eval == "given":
            return batch
        return fit_pose(batch, render, self.cfg.eval_steps, self.cfg.eval_lr)


MIN_KEYPOINTS = 8  # a view with fewer keypoints seen has no measured pose fit (it is refined)
# Points observed by fewer photos say little of a pose: a point triangulated from two wrong poses fits both nearly.
MIN_TRACK = 3


def reprojection_px(frame: Frame, points: Tensor | None, keypoints: Tensor | None, scale: float) -> float:
    """The median distance between ``frame``'s ``keypoints`` [P, 2] and its SfM ``points`` [P, 3] as its camera sees
    them from its pose, in pixels of the image the keypoints were found in (``scale`` of them per pixel of the
    frame); inf where fewer than :data:`MIN_KEYPOINTS` are seen (or none are given)."""
    if points is None or keypoints is None:
        return math.inf
    device = frame.viewmat.device
    seen_at, seen = project_points(points.to(device), frame.viewmat, frame.K.to(device), frame.camera_model)  # [P, 3]
    if int(seen.sum()) < MIN_KEYPOINTS:
        return math.inf
    return scale * (seen_at[seen, :2] - keypoints.to(device)[seen]).norm(dim=-1).median().item()


# A resection is kept where it brings the points at least this much nearer (not noise fitted) ...
RESECTION_GAIN = 0.5
RESECTION_MIN_PX = 0.1  # ... and by this many pixels (keypoints without noise halve 1e-4 px by a refit)
RESECTION_STEPS = 30  # Levenberg-Marquardt iterations at most (a pose off by degrees converges in under ten)
RESECTION_DIFF_STEP = 1e-6  # the twist step of the Jacobian's central differences (world units, radians)
RESECTION_POINTS = 512  # points a resection fits at most: six unknowns, and the time stays under 0.1 s a view
RESECTION_HUBER_PX = 2.0  # residuals beyond this (frame pixels) count linearly: mismatched keypoints pull less


def resected_twist(frame: Frame, points: Tensor, keypoints: Tensor) -> tuple[Tensor, float]:
    """The twist [6] that moves ``frame``'s camera from its given pose to where its SfM ``points`` [P, 3] fall
    nearest its ``keypoints`` [P, 2] (frame pixels): a robust (Huber) Levenberg-Marquardt fit from zero over (at most
    :data:`RESECTION_POINTS` evenly spaced of) the points seen at the given pose, in float64 on the CPU
    (deterministic); with the median distance in frame pixels it leaves over all of them."""
    viewmat = frame.viewmat.detach().cpu().double()
    K, model = frame.K.detach().cpu().double(), frame.camera_model
    points, keypoints = points.cpu().double(), keypoints.cpu().double()
    seen = project_points(points, viewmat, K, model)[1]
    points, keypoints = points[seen], keypoints[seen]
    fitted = torch.linspace(0, len(points) - 1, min(len(points), RESECTION_POINTS)).round().long()  # [F]

    def residuals(twist: Tensor, rows: Tensor | slice = fitted) -> Tensor:  # [P, 2] keypoint to projection, pixels
        moved = se3_exp(twist[None])[0] @ viewmat
        return project_points(points[rows], moved, K, model)[0][:, :2] - keypoints[rows]

    def cost(error: Tensor) -> Tensor:  # the Huber cost of residuals [P, 2]
        length = error.norm(dim=-1)
        huber = RESECTION_HUBER_PX
        return torch.where(length <= huber, 0.5 * length.square(), huber * (length - 0.5 * huber)).sum()

    twist, damping = torch.zeros(6, dtype=torch.float64), 1e-3
    error = residuals(twist)
    for _ in range(RESECTION_STEPS):
        # Central differences: twelve projections of F points, where forward-mode autodiff costs seconds to set up
        steps = torch.eye(6, dtype=torch.float64) * RESECTION_DIFF_STEP  # [6, 6]
        jacobian = torch.stack(
            [(residuals(twist + d) - residuals(twist - d)).flatten() / (2 * RESECTION_DIFF_STEP) for d in steps], -1
        )  # [2F, 6]
        weights = (RESECTION_HUBER_PX / error.norm(dim=-1).clamp_min(1e-12)).clamp_max(1.0).repeat_interleave(2)
        normal = jacobian.T @ (weights[:, None] * jacobian)  # [6, 6]
        gradient = jacobian.T @ (weights * error.flatten())  # [6]
        step, singular = torch.linalg.solve_ex(normal + damping * torch.diag(normal.diagonal()), -gradient)
        if singular:  # points that cannot fix all six degrees of freedom (all on one ray, say): keep what it has
            break
        candidate = residuals(twist + step)
        before, after = cost(error), cost(candidate)
        if after < before:
            twist, error, damping = twist + step, candidate, damping / 3.0
            if before - after < 1e-6 * before:  # converged
                break
        else:
            damping *= 4.0
    return twist.float(), residuals(twist, slice(None)).norm(dim=-1).median().item()


def fit_pose(batch: Batch, render: Callable[[Batch], RenderOutput], steps: int, lr: float) -> Batch:
    """``batch`` (one view) with its camera moved to where its render matches its photo best: ``steps`` Adam steps
    on a twist from zero, minimising the L1 difference over the pixels its mask keeps. Only the twist learns: the
    scene's parameters get no gradient."""
    cameras = batch.cameras
    twist = torch.zeros(1, 6, device=cameras.viewmats.device, requires_grad=True)  # [1, 6]
    optimizer = Adam([twist], lr=lr)
    viewmats = cameras.viewmats.detach()
    with torch.enable_grad():
        for _ in range(steps):
            out = render(dataclasses.replace(batch, cameras=cameras.with_viewmats(corrected_viewmats(viewmats, twist))))
            error = (out.image - batch.images).abs().mean(-1, keepdim=True)  # [1, H, W, 1]
            loss = error.mean() if batch.masks is None else (error * batch.masks).sum() / batch.masks.sum().clamp_min(1)
            (twist.grad,) = torch.autograd.grad(loss, [twist])
            optimizer.step()
    return dataclasses.replace(batch, cameras=cameras.with_viewmats(corrected_viewmats(viewmats, twist.detach())))
