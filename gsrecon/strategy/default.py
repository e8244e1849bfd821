"""The adaptive density control of 3DGS (Kerbl et al. 2023): clone, split, prune, reset opacity.

Gaussians are cloned, split, pruned and their opacities reset through :mod:`gsrecon.model.ops` as gsplat's
``gsplat.strategy.ops`` does it (the same rows, values and optimiser moments), so this runs with every renderer and
without gsplat.
It differs from gsplat 1.5's ``DefaultStrategy`` in three ways: a hard ``cap_max`` on the number of Gaussians,
statistics that are summed over ranks under torchrun, and an opacity reset that actually runs (gsplat 1.5.3's
``step % reset_every == 0 & step > 0`` is always False).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gsrecon.component import RunFacts
from gsrecon.config import per_start, run_steps
from gsrecon.distributed import DistributedContext
from gsrecon.errors import InputError
from gsrecon.geometry import quat_to_rotmat
from gsrecon.model.ops import append_rows, remove_rows, reset_opacities
from gsrecon.registry import STRATEGY_REGISTRY
from gsrecon.strategy.base import (
    SINGLE_PROCESS,
    Optimizers,
    Params,
    Strategy,
    check_growth_start,
    growth_start,
    opacity_scale_penalty,
)


@STRATEGY_REGISTRY.register("default")
class DefaultStrategy(Strategy):
    """Grows Gaussians whose view-space positional gradient is high, prunes transparent or huge ones.

    Every ``refine_every`` steps in (``refine_start``, ``refine_stop``): Gaussians whose mean
    normalised 2D gradient exceeds ``grow_grad2d`` are cloned when small (largest scale <=
    ``grow_scale3d`` × scene extent) and split into two samples scaled by 1/1.6 when large; then
    Gaussians with opacity < ``prune_opa`` (and, after the first reset, those larger than
    ``prune_scale3d`` × extent) are removed. Opacities are reset to 2 × ``prune_opa`` every
    ``reset_every`` steps. With ``cap_max`` > 0 growth stops at that many Gaussians, keeping the
    candidates with the highest gradients.
    """

    screen_gradients = True

    @dataclass
    class Config:
        prune_opa: float = 0.005
        grow_grad2d: float = 0.0002
        grow_scale3d: float = 0.01
        grow_scale2d: float = 0.05
        prune_scale3d: float = 0.1
        prune_scale2d: float = 0.15
        refine_scale2d_stop: int = 0  # > 0: also split/prune by screen size until this step
        refine_start: int = run_steps(500)
        # A random start has no structure to refine from: densifying until 75 % of the run instead of half gained
        # +0.1 to +2.3 dB on every random-start sweep row ("Floaters and haze" in BENCHMARKS.md).
        refine_stop: int = run_steps(15_000, random_start=22_500)
        refine_every: int = 100
        # Recovering from a reset takes a fixed number of steps, not a share of the run: below 3000 steps
        # there is none (measured across run lengths in BENCHMARKS.md, "Schedules at every run length").
        reset_every: int = run_steps(3000, minimum=3000)
        pause_refine_after_reset: int = 0
        absgrad: bool = False  # AbsGS gradients (renderer gsplat; the builder tells it to compute them)
        revised_opacity: bool = False  # opacity of split Gaussians as in arXiv:2404.06109
        cap_max: int = 0  # hard cap on the number of Gaussians; 0: none
        # L1 on opacities, as MCMC: clears the haze a random start leaves (-0.03 to +4 dB at 1000-7000 steps) but
        # costs starts from points up to 0.5 dB ("Floaters and haze" in BENCHMARKS.md).
        opacity_reg: float = per_start(random=0.01, points=0.0)
        scale_reg: float = 0.0  # > 0: L1 on scales
        # Where a per-view module sets transients aside (views: transients, robust), no Gaussian is cloned or split
        # before this step (pruning goes on): RobustSplat's delayed growth, a third of the run. 0: growth from
        # refine_start as without one
        transient_growth_start: int = run_steps(10_000, minimum=0)

    per_gaussian_state = ("grad2d", "count", "radii")

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        for name in ("refine_every", "reset_every"):
            if getattr(cfg, name) < 1:
                raise InputError(f"strategy.{name} must be >= 1, got {getattr(cfg, name)}")
        check_growth_start(cfg.transient_growth_start)

    def check(self, run: RunFacts) -> None:
        self.growth_from = growth_start(run, self.cfg.transient_growth_start)
        n = run.num_gaussians
        if self.cfg.cap_max and n > self.cfg.cap_max:
            raise ValueError(f"the model starts with {n} Gaussians, more than strategy.cap_max={self.cfg.cap_max}")

    def regularization(self, params: Params, state: dict[str, Any], info: dict[str, Any]) -> Tensor | None:
        return opacity_scale_penalty(params, self.cfg.opacity_reg, self.cfg.scale_reg)

    def initialize_state(self, scene_extent: float) -> dict[str, Any]:
        """Running statistics per Gaussian [N] (:mod:`gsrecon.model.ops` grows and shrinks them with the Gaussians)."""
        return {"grad2d": None, "count": None, "radii": None, "scene_scale": scene_extent}

    def step_pre_backward(
        self, params: Params, optimizers: Optimizers, state: dict[str, Any], step: int, info: dict[str, Any]
    ) -> None:
        if torch.is_grad_enabled():
            if not info["means2d"].requires_grad:
                raise InputError(
                    "strategy 'default' densifies from the screen-space gradients of the Gaussians' centres, which "
                    "this renderer does not give (gsplat's unscented transform for data.fisheye: lens): use "
                    "strategy.name=mcmc, renderer.name=torch or data.fisheye=undistort"
                )
            info["means2d"].retain_grad()

    @torch.no_grad()
    def step_post_backward(
        self,
        params: Params,
        optimizers: Optimizers,
        state: dict[str, Any],
        step: int,
        info: dict[str, Any],
        dist: DistributedContext = SINGLE_PROCESS,
    ) -> None:
        cfg = self.cfg
        if step >= cfg.refine_stop:
            return
        self._accumulate(params, state, info, dist)
        if (
            step > cfg.refine_start
            and step % cfg.refine_every == 0
            and step % cfg.reset_every >= cfg.pause_refine_after_reset
        ):
            if step >= self.growth_from:
                self._grow(params, optimizers, state, step, self.growth_gate(params, step, dist))
            self._prune(params, optimizers, state, step)
            for key in self.per_gaussian_state:
                if state[key] is not None:
                    state[key].zero_()
        if step > 0 and step % cfg.reset_every == 0:
            reset_opacities(params, optimizers, cfg.prune_opa * 2.0)

    def _accumulate(
        self, params: Params, state: dict[str, Any], info: dict[str, Any], dist: DistributedContext
    ) -> None:
        """Add this step's normalised 2D gradient norms and visibility counts (summed over ranks).

        ``info`` is dense (``means2d`` / ``radii`` [C, N, 2]) or, from gsplat with ``packed``, one row
        per visible (camera, Gaussian) pair ([nnz, 2]) with their ``gaussian_ids`` [nnz].
        """
        means2d = info["means2d"]
        grads = (means2d.absgrad if self.cfg.absgrad else means2d.grad).clone()
        grads[..., 0] *= info["width"] / 2.0 * info["n_cameras"]
        grads[..., 1] *= info["height"] / 2.0 * info["n_cameras"]
        radii = info["radii"]
        n = len(params["means"])
        # Elementwise over the last dimension of 2 rather than reductions over it (3-5x faster on the CPU, the same
        # values); grads.norm stays a reduction, as no elementwise form gives its bits.
        screen = torch.maximum(radii[..., 0], radii[..., 1]).to(grads.dtype) / float(max(info["width"], info["height"]))
        if info.get("gaussian_ids") is not None:
            ids = info["gaussian_ids"]  # [nnz]
            grad_norm = grads.new_zeros(n).index_add_(0, ids, grads.norm(dim=-1))  # [N]
            count = grads.new_zeros(n).index_add_(0, ids, torch.ones_like(ids, dtype=grads.dtype))  # [N]
            max_screen = grads.new_zeros(n).scatter_reduce_(0, ids, screen, "amax")  # [N]
        else:
            # Masked sums, not boolean indexing: indexing waits for the GPU to count the visible ones.
            visible = torch.minimum(radii[..., 0], radii[..., 1]) > 0  # [C, N]
            grad_norm = torch.where(visible, grads.norm(dim=-1), 0.0).sum(dim=0)  # [N]
            count = visible.sum(dim=0).to(grads.dtype)  # [N]
            max_screen = torch.where(visible, screen, 0.0).amax(dim=0)  # [N]
        increments = [grad_norm, count, max_screen]
        dist.all_reduce_sum(increments[:2])
        if state["grad2d"] is None:
            state["grad2d"] = torch.zeros(n, device=grads.device)
            state["count"] = torch.zeros(n, device=grads.device)
        state["grad2d"] += grad_norm
        state["count"] += count
        if self.cfg.refine_scale2d_stop > 0:
            dist.all_reduce_max(increments[2])
            if state["radii"] is None:
                state["radii"] = torch.zeros(n, device=grads.device)
            state["radii"] = torch.maximum(state["radii"], increments[2])

    def growth_gate(self, params: Params, step: int, dist: DistributedContext) -> Tensor | None:
        """Which Gaussians may grow at the refinement of ``step`` ([N] bool, alike on every rank), or None: every one
        whose screen-space gradient asks for it."""
        return None

    def _grow(
        self, params: Params, optimizers: Optimizers, state: dict[str, Any], step: int, gate: Tensor | None
    ) -> None:
        cfg = self.cfg
        grads = state["grad2d"] / state["count"].clamp_min(1)  # [N]
        high = grads > cfg.grow_grad2d
        if gate is not None:
            high &= gate
        small = torch.exp(params["scales"]).max(dim=-1).values <= cfg.grow_scale3d * state["scene_scale"]
        is_dupli = high & small
        is_split = high & ~small
        if step < cfg.refine_scale2d_stop:
            is_split |= state["radii"] > cfg.grow_scale2d
        if cfg.cap_max > 0:
            is_dupli, is_split = _limit_growth(is_dupli, is_split, grads, cfg.cap_max - len(grads))
        n_dupli = int(is_dupli.sum())
        if n_dupli > 0:
            self._duplicate(params, optimizers, state, is_dupli)
        is_split = torch.cat([is_split, torch.zeros(n_dupli, dtype=torch.bool, device=is_split.device)])
        if is_split.any():
            self._split(params, optimizers, state, is_split)

    def _duplicate(self, params: Params, optimizers: Optimizers, state: dict[str, Any], mask: Tensor) -> None:
        """Append a copy of each Gaussian where ``mask`` [N] is True, with its statistics."""
        sel = torch.where(mask)[0]
        rows = {name: p[sel] for name, p in params.items()}
        append_rows(params, optimizers, state, self.per_gaussian_state, rows, self._state_rows(state, sel, 1))

    def _split(self, params: Params, optimizers: Optimizers, state: dict[str, Any], mask: Tensor) -> None:
        """Replace each Gaussian where ``mask`` [N] is True by two samples of it, 1.6 times smaller (3DGS), each with
        its statistics; with ``revised_opacity`` each keeps the opacity that composites two to the original's."""
        sel = torch.where(mask)[0]
        scales = torch.exp(params["scales"][sel])  # [S, 3]
        noise = torch.randn(2, len(sel), 3, device=mask.device)
        samples = torch.einsum("nij,nj,bnj->bni", quat_to_rotmat(params["quats"][sel]), scales, noise)  # [2, S, 3]
        rows = {}
        for name, p in params.items():
            if name == "means":
                rows[name] = (p[sel] + samples).reshape(-1, 3)  # [2S, 3]
            elif name == "scales":
                rows[name] = torch.log(scales / 1.6).repeat(2, 1)
            elif name == "opacities" and self.cfg.revised_opacity:
                rows[name] = torch.logit(1.0 - torch.sqrt(1.0 - torch.sigmoid(p[sel]))).repeat(2)
            else:
                rows[name] = p[sel].repeat(2, *[1] * (p.dim() - 1))
        state_rows = self._state_rows(state, sel, 2)
        remove_rows(params, optimizers, state, self.per_gaussian_state, mask)
        append_rows(params, optimizers, state, self.per_gaussian_state, rows, state_rows)

    def _state_rows(self, state: dict[str, Any], sel: Tensor, copies: int) -> dict[str, Tensor]:
        """The statistics of the Gaussians ``sel`` [S], ``copies`` times over ([copies × S, ...] per entry)."""
        return {
            key: state[key][sel].repeat(copies, *[1] * (state[key].dim() - 1))
            for key in self.per_gaussian_state
            if state[key] is not None
        }

    def _prune(self, params: Params, optimizers: Optimizers, state: dict[str, Any], step: int) -> None:
        cfg = self.cfg
        is_prune = torch.sigmoid(params["opacities"]) < cfg.prune_opa
        if step > cfg.reset_every:
            is_prune |= torch.exp(params["scales"]).max(dim=-1).values > cfg.prune_scale3d * state["scene_scale"]
            if step < cfg.refine_scale2d_stop:
                is_prune |= state["radii"] > cfg.prune_scale2d
        if is_prune.any():
            remove_rows(params, optimizers, state, self.per_gaussian_state, is_prune)


def _limit_growth(is_dupli: Tensor, is_split: Tensor, grads: Tensor, budget: int) -> tuple[Tensor, Tensor]:
    """Keep at most ``budget`` of the grow candidates (each adds one Gaussian), highest gradients first."""
    candidates = is_dupli | is_split
    if int(candidates.sum()) <= budget:
        return is_dupli, is_split
    keep = torch.zeros_like(candidates)
    if budget > 0:
        scores = torch.where(candidates, grads, -torch.inf)
        keep[torch.topk(scores, budget).indices] = True
    return is_dupli & keep, is_split & keep
