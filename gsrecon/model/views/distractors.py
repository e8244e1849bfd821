"""Per-view distractor Gaussians (DeSplat, Wang et al., CVPR 2025): what only one photo shows (a passer-by, a car
that leaves) drawn by Gaussians of that photo alone, not by the scene's (``views: {distractors: {name:
distractors}}``).

Each training view owns ``count`` Gaussians (DeSplat: 1,000) that live in its camera's own frame: they start on a
plane ``distance`` in front of the camera (DeSplat: 0.02, in world units), spread uniformly over the image, each as
wide as the mean distance to its 3 nearest neighbours, opacity 0.1, a random colour and a random rotation. In a
training step the run's renderer draws the view's set from its camera (in the camera's frame, so that a pose module
moving the camera carries them along), over black, into a colour ``c_d`` and an opacity ``α_d``, and the image the loss
sees is ``c_d + (1 - α_d) c_s`` over the static render ``c_s`` (after the modules listed before this one: its
environment, its appearance). The loss's gradient then fits a distractor with the view's own Gaussians where the
scene's would need a floater in front of one photo. Two regularisers (DeSplat's, both 0.01): ``alpha_reg`` × the mean
``α_d`` (the distractors draw only what they must) and ``static_alpha_reg`` × the mean ``1 - α_s`` of the static
render in training views (the scene leaves no holes for the distractors to fill).

Their colours are RGB (SH degree 0: one colour from every direction, as DeSplat's), trained with the views' optimiser
(:class:`~gsrecon.model.views.optim.VisitedRowsAdam`: a view's set steps when its view is trained on) at DeSplat's
learning rates: means 1.6e-4 decaying exponentially to 1/100 of it over the run, colours 0.025, opacities 0.05,
scales 0.05, rotations 0.01. Their count is fixed (DeSplat also splits, duplicates and culls them every 10 epochs;
not done here). They are checkpointed with the module; never drawn in a test view, in evaluation or in the viewer
(those render through :meth:`~gsrecon.model.views.base.ViewModules.composite`, which this module leaves as it is),
and never exported: an export holds only the scene's Gaussians.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gsrecon.component import RunFacts, RunSetup
from gsrecon.config import run_steps
from gsrecon.model.gaussians import nearest_neighbor_distance
from gsrecon.model.views.base import ViewModule
from gsrecon.model.views.optim import VisitedRowsAdam
from gsrecon.optim import LambdaLR, Optimizer
from gsrecon.registry import VIEW_REGISTRY
from gsrecon.sh import rgb_to_sh

if TYPE_CHECKING:
    from gsrecon.data.pipeline import Batch
    from gsrecon.data.scene import Frame
    from gsrecon.render.base import RenderOutput

MAX_COUNT = 100_000  # distractor Gaussians per view: DeSplat starts with 1,000 and grows a few times that
START_OPACITY = 0.1  # DeSplat's (and 3DGS's) starting opacity


@VIEW_REGISTRY.register("distractors")
class DistractorGaussians(ViewModule):
    """Per training view, a small set of Gaussians in front of its camera drawn over the scene in that view only (see
    the module docstring)."""

    kind = ""  # a views: entry (views: {distractors: {name: distractors}})
    export_note = "the per-view distractor Gaussians are not in it: each belongs to one training photo, not the scene"

    @dataclass
    class Config(ViewModule.Config):
        lr: float = 0.025  # Adam learning rate of the colours (RGB)
        means_lr: float = 1.6e-4  # ... of the positions (world units), decaying exponentially to ...
        means_lr_final_factor: float = 0.01  # ... this fraction of means_lr ...
        decay_steps: int = run_steps(30_000)  # ... at this step (left unset: the run's max_steps), then constant
        opacity_lr: float = 0.05  # ... of the opacities (pre-sigmoid)
        scale_lr: float = 0.05  # ... of the scales (log)
        quat_lr: float = 0.01  # ... of the rotations (unnormalised quaternions)
        count: int = 1000  # Gaussians per training view
        distance: float = 0.02  # how far in front of its camera a view's Gaussians start (world units)
        alpha_reg: float = 0.01  # weight of the mean opacity the distractors draw in training views
        static_alpha_reg: float = 0.01  # weight of the mean transparency (1 - alpha) of the scene in training views

        def __post_init__(self) -> None:
            super().__post_init__()
            for key in ("means_lr", "opacity_lr", "scale_lr", "quat_lr"):
                _check_number(key, getattr(self, key), 0.0, 1.0)
            for key in ("alpha_reg", "static_alpha_reg"):
                _check_number(key, getattr(self, key), 0.0, math.inf)
            if isinstance(self.count, bool) or not isinstance(self.count, int) or not 1 <= self.count <= MAX_COUNT:
                raise ValueError(
                    f"count must be an integer in [1, {MAX_COUNT}] (Gaussians per view), got {self.count!r}"
                )
            _check_number("distance", self.distance, 0.0, math.inf)
            if self.distance == 0:
                raise ValueError("distance must be > 0 (world units in front of the camera), got 0")
            _check_number("means_lr_final_factor", self.means_lr_final_factor, 0.0, 1.0)
            if self.means_lr_final_factor == 0:
                raise ValueError("means_lr_final_factor must be in (0, 1], got 0")
            if isinstance(self.decay_steps, bool) or not isinstance(self.decay_steps, int) or self.decay_steps < 1:
                raise ValueError(f"decay_steps must be an integer >= 1, got {self.decay_steps!r}")

    def __init__(self, cfg: Config, train_names: list[str]) -> None:
        super().__init__(cfg, train_names)
        views, count = len(train_names), cfg.count
        # Each view's Gaussians in its camera's frame (OpenCV: z forward), pre-activation; placed in setup
        self.means = torch.nn.Parameter(torch.zeros(views, count, 3))  # [V, K, 3]
        self.scales = torch.nn.Parameter(torch.zeros(views, count, 3))  # [V, K, 3] log
        self.quats = torch.nn.Parameter(torch.zeros(views, count, 4))  # [V, K, 4]
        self.opacities = torch.nn.Parameter(torch.zeros(views, count))  # [V, K] logit
        self.colors = torch.nn.Parameter(torch.zeros(views, count, 3))  # [V, K, 3] RGB
        self.render: Callable[..., RenderOutput] | None = None  # the run's renderer's render (setup)

    def check(self, run: RunFacts) -> None:
        renderer = run.config["renderer"]
        if renderer.get("sparse_grad", False):
            raise ValueError(
                "the distractor Gaussians are drawn with dense gradients, which renderer.sparse_grad=true does not "
                "give; use renderer.sparse_grad=false"
            )
        near, far = renderer.get("near_plane", 0.01), renderer.get("far_plane", 1e10)
        if not near < self.cfg.distance < far:
            raise ValueError(
                f"distance={self.cfg.distance} puts the distractor Gaussians outside the renderer's planes "
                f"(near_plane={near}, far_plane={far}): they would not be drawn; give a distance between them"
            )

    def setup(self, run: RunSetup) -> None:
        self.render = run.render
        if run.data is not None:
            self.place(self.frames_by_row(run.data))

    @torch.no_grad()
    def place(self, frames: list[Frame]) -> None:
        """Start each view's Gaussians (one row per frame of ``frames``, in row order) on a plane ``distance`` in front
        of its camera, spread uniformly over its image (see the module docstring)."""
        count, depth = self.cfg.count, self.cfg.distance
        for row, frame in enumerate(frames):
            K = frame.K.double()  # [3, 3]
            pixels = torch.rand(count, 2, dtype=torch.float64) * torch.tensor([frame.width, frame.height])  # [K, 2]
            xy = (pixels - K[:2, 2]) / K[[0, 1], [0, 1]] * depth  # [K, 2]
            means = torch.cat([xy, torch.full((count, 1), depth, dtype=torch.float64)], dim=-1).float()  # [K, 3]
            self.means[row] = means.to(self.means)
            self.scales[row] = nearest_neighbor_distance(means).log()[:, None].expand(count, 3).to(self.scales)
        self.quats.copy_(torch.nn.functional.normalize(torch.randn(self.quats.shape), dim=-1))
        self.opacities.fill_(math.log(START_OPACITY / (1.0 - START_OPACITY)))
        self.colors.copy_(torch.rand(self.colors.shape))

    def build_optimizer(self) -> Optimizer:
        cfg = self.cfg
        groups = [
            ("means", self.means, cfg.means_lr),
            ("scales", self.scales, cfg.scale_lr),
            ("quats", self.quats, cfg.quat_lr),
            ("opacities", self.opacities, cfg.opacity_lr),
            ("colors", self.colors, cfg.lr),
        ]
        return VisitedRowsAdam([{"params": [p], "lr": lr, "name": name} for name, p, lr in groups], lr=cfg.lr)

    def build_scheduler(self, optimizer: Optimizer) -> LambdaLR:
        """The positions' rate decays exponentially to ``means_lr_final_factor`` of it over ``decay_steps``; the
        others stay constant."""
        cfg = self.cfg

        def decay(step: int) -> float:
            return cfg.means_lr_final_factor ** (min(step, cfg.decay_steps) / cfg.decay_steps)

        return LambdaLR(optimizer, [decay] + [lambda step: 1.0] * (len(optimizer.param_groups) - 1))

    def gaussians(self, row: int) -> dict[str, Tensor]:
        """The Gaussians of the view at ``row`` as a renderer takes them (camera frame, SH degree 0)."""
        colors = self.colors[row].clamp(0.0, 1.0)  # [K, 3]
        return {
            "means": self.means[row],
            "scales": self.scales[row],
            "quats": self.quats[row],
            "opacities": self.opacities[row],
            "sh0": rgb_to_sh(colors)[:, None, :],  # [K, 1, 3]
            "shN": colors.new_zeros(colors.shape[0], 0, 3),
        }

    def draw(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """The training ``batch``'s views' distractors, each drawn by its own Gaussians from its camera: colour
        [B, H, W, 3] (over black) and opacity [B, H, W, 1]."""
        if self.render is None:
            raise RuntimeError("the distractor Gaussians are drawn with the run's renderer, given in setup")
        cameras = batch.cameras
        own_frame = torch.eye(4, device=cameras.viewmats.device)[None]  # [1, 4, 4]: they live in the camera's frame
        black = cameras.viewmats.new_zeros(1, 3)
        images, alphas = [], []
        for index, name in enumerate(batch.names):
            params = {key: value.to(cameras.viewmats.device) for key, value in self.gaussians(self.index[name]).items()}
            out = self.render(params, cameras[index].with_viewmats(own_frame), 0, black)
            images.append(out.image)
            alphas.append(out.alpha)
        return torch.cat(images), torch.cat(alphas)

    def render_term(self, out: RenderOutput) -> Tensor | None:
        if self.cfg.static_alpha_reg == 0.0:
            return None
        return self.cfg.static_alpha_reg * (1.0 - out.alpha).mean()  # the scene's mean transparency

    def adjust_image(self, image: Tensor, batch: Batch, out: RenderOutput) -> Tensor:
        color, alpha = self.draw(batch)  # [B, H, W, 3], [B, H, W, 1]
        return color.to(image) + (1.0 - alpha.to(image)) * image

    def regularization(self, out: RenderOutput, batch: Batch) -> Tensor | None:
        if self.cfg.alpha_reg == 0.0:
            return None
        # Drawn again rather than kept from adjust_image: a step's values are passed, not stashed (one more render of
        # the batch's distractors, a few hundred Gaussians each).
        return self.cfg.alpha_reg * self.draw(batch)[1].mean()


def _check_number(key: str, value: object, low: float, high: float) -> None:
    """Refuse an option ``key`` whose ``value`` is not a finite number in [``low``, ``high``]."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and low <= value <= high):
        bound = f"in [{low:g}, {high:g}]" if math.isfinite(high) else f">= {low:g}"
        raise ValueError(f"{key} must be a finite number {bound}, got {value!r}")
