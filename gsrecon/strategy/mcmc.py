"""3D Gaussian Splatting as Markov Chain Monte Carlo (Kheradmand et al. 2024), on any device.

Dead Gaussians (opacity <= ``min_opacity``) are relocated onto live ones sampled by opacity, new
ones are added the same way up to ``cap_max``, the means receive opacity-gated noise shaped by each
Gaussian's covariance, and opacity and scale are L1-regularised. The relocation update (Eq. 9 of
the paper) is computed here in PyTorch: gsplat's version is a CUDA-only kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gsrecon.component import RunFacts
from gsrecon.config import run_steps
from gsrecon.distributed import DistributedContext
from gsrecon.errors import InputError
from gsrecon.geometry import quat_scale_to_factor
from gsrecon.model.ops import append_rows, replace_rows
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

N_MAX = 51  # largest number of copies one relocation step accounts for (as gsplat)


@STRATEGY_REGISTRY.register("mcmc")
class MCMCStrategy(Strategy):
    """MCMC densification: a fixed budget of Gaussians that moves to where it is needed.

    Every ``refine_every`` steps in (``refine_start``, ``refine_stop``): relocate dead Gaussians,
    then add ``min(cap, grow_rate × N) - N`` new ones. Every step: noise on the means
    (``noise_lr`` × the means' learning rate). The number of Gaussians never exceeds the cap:
    ``cap_max``, or with ``cap_ratio`` > 0 a budget of ``cap_ratio`` × the Gaussians the run starts
    with (its SfM points), whichever is smaller.
    """

    @dataclass
    class Config:
        cap_max: int = 1_000_000
        cap_ratio: float = 0.0  # > 0: also cap at this × the starting Gaussians (1.5: a budget run)
        noise_lr: float = 5e5
        refine_start: int = run_steps(500)
        refine_stop: int = run_steps(25_000)
        refine_every: int = 100
        min_opacity: float = 0.005
        grow_rate: float = 1.05
        opacity_reg: float = 0.01
        scale_reg: float = 0.01
        # Where a per-view module sets transients aside (views: transients, robust), no Gaussian is added before this
        # step (dead ones are still relocated): RobustSplat's delayed growth, a third of the run. 0: no delay
        transient_growth_start: int = run_steps(10_000, minimum=0)

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        if cfg.cap_max < 1:
            raise InputError(f"strategy.cap_max must be >= 1, got {cfg.cap_max}")
        if not (cfg.cap_ratio == 0 or 1 <= cfg.cap_ratio < math.inf):
            raise InputError(f"strategy.cap_ratio must be 0 (off) or a finite number >= 1, got {cfg.cap_ratio}")
        if cfg.refine_every < 1:
            raise InputError(f"strategy.refine_every must be >= 1, got {cfg.refine_every}")
        check_growth_start(cfg.transient_growth_start)
        self.binoms = binomial_table(N_MAX)

    def check(self, run: RunFacts) -> None:
        self.growth_from = growth_start(run, self.cfg.transient_growth_start)
        n = run.num_gaussians
        if n > self.cfg.cap_max:
            raise ValueError(
                f"the model starts with {n} Gaussians, more than strategy.cap_max={self.cfg.cap_max}; "
                f"raise cap_max or start from fewer points"
            )

    def regularization(self, params: Params, state: dict[str, Any], info: dict[str, Any]) -> Tensor | None:
        return opacity_scale_penalty(params, self.cfg.opacity_reg, self.cfg.scale_reg)

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
        state.setdefault("initial_gaussians", params["means"].shape[0])  # at step 0: the starting model
        if cfg.refine_start < step < cfg.refine_stop and step % cfg.refine_every == 0:
            self._relocate_dead(params, optimizers, state)
            if step >= self.growth_from:
                n = params["means"].shape[0]
                self._add(params, optimizers, state, max(0, min(self.cap(state), int(cfg.grow_rate * n)) - n))
        inject_position_noise(params, optimizers["means"].param_groups[0]["lr"] * cfg.noise_lr)

    def cap(self, state: dict[str, Any]) -> int:
        """The most Gaussians this run may have: ``cap_max``, or less with a ``cap_ratio`` budget."""
        if self.cfg.cap_ratio == 0:
            return self.cfg.cap_max
        return min(self.cfg.cap_max, int(self.cfg.cap_ratio * state["initial_gaussians"]))

    def _relocate_dead(self, params: Params, optimizers: Optimizers, state: dict[str, Any]) -> None:
        """Move the dead Gaussians onto live ones sampled by opacity: each sample and its copies share it out."""
        opacities = torch.sigmoid(params["opacities"])
        dead = opacities <= self.cfg.min_opacity
        alive = (~dead).nonzero(as_tuple=True)[0]
        dead = dead.nonzero(as_tuple=True)[0]
        if len(dead) == 0 or len(alive) == 0:
            return
        sources = alive[torch.multinomial(opacities[alive], len(dead), replacement=True)]
        rows = self._copy_rows(params, sources)
        replace_rows(params, optimizers, state, self.per_gaussian_state, sources, rows)
        replace_rows(params, optimizers, state, self.per_gaussian_state, dead, rows)

    def _add(self, params: Params, optimizers: Optimizers, state: dict[str, Any], n: int) -> None:
        """Add ``n`` Gaussians as copies of ones sampled by opacity, each sample and its copies sharing it out."""
        if n <= 0:
            return
        opacities = torch.sigmoid(params["opacities"])
        sources = torch.multinomial(opacities, n, replacement=True)
        rows = self._copy_rows(params, sources)
        for name in ("opacities", "scales"):  # the sources keep their moments (as gsplat's sample_add)
            params[name].data[sources] = rows[name]
        append_rows(params, optimizers, state, self.per_gaussian_state, rows)

    def _copy_rows(self, params: Params, sources: Tensor) -> dict[str, Tensor]:
        """The rows of the sampled ``sources`` [S] with the opacity and scale of one of each source's (1 + #samples)
        copies (Eq. 9 of the paper), [S, ...] per parameter."""
        ratios = torch.bincount(sources, minlength=params["means"].shape[0])[sources] + 1  # [S]
        new_opacities, new_scales = relocation_update(
            torch.sigmoid(params["opacities"][sources]),
            torch.exp(params["scales"][sources]),
            ratios,
            self.binoms.to(sources.device),
        )
        eps = torch.finfo(torch.float32).eps
        rows = {name: p.data[sources] for name, p in params.items()}
        rows["opacities"] = torch.logit(new_opacities.clamp(self.cfg.min_opacity, 1.0 - eps))
        rows["scales"] = torch.log(new_scales)
        return rows


def binomial_table(n_max: int) -> Tensor:
    """``table[n, k] = C(n, k)`` for 0 <= k <= n < n_max (float64), [n_max, n_max]."""
    table = torch.zeros(n_max, n_max, dtype=torch.float64)
    for n in range(n_max):
        for k in range(n + 1):
            table[n, k] = math.comb(n, k)
    return table


def relocation_update(opacities: Tensor, scales: Tensor, ratios: Tensor, binoms: Tensor) -> tuple[Tensor, Tensor]:
    """Opacity and scale for each of ``ratios`` copies of a Gaussian, so the copies together match it.

    ``opacities`` [S] and ``scales`` [S, 3] are activated values, ``ratios`` [S] the number of
    copies (clamped to [1, n_max]). Implements Eq. 9 of Kheradmand et al. (2024) as gsplat's
    ``compute_relocation`` kernel does, in float64: ``o' = 1 - (1 - o)^(1/n)`` and
    ``s' = s · o / Σ_{i=1..n} Σ_{k=0..i-1} C(i-1, k) (-1)^k o'^(k+1) / sqrt(k+1)``.
    """
    n_max = binoms.shape[0]
    n = ratios.clamp(1, n_max).to(torch.float64)  # [S]
    o = opacities.to(torch.float64)
    new_o = 1.0 - torch.pow(1.0 - o, 1.0 / n)  # [S]
    k = torch.arange(n_max, dtype=torch.float64, device=o.device)
    signs = torch.where(k % 2 == 0, 1.0, -1.0) / torch.sqrt(k + 1)  # [K]
    terms = binoms.to(o.device) * signs  # [I, K]: row i-1 holds C(i-1, k)(-1)^k/sqrt(k+1)
    powers = new_o[:, None] ** (k + 1)  # [S, K]
    per_i = powers @ terms.T  # [S, I]
    upto_n = torch.arange(1, n_max + 1, device=o.device)[None, :] <= n[:, None]  # [S, I]
    denom = (per_i * upto_n).sum(-1)  # [S]
    new_scales = scales.to(torch.float64) * (o / denom)[:, None]
    return new_o.to(opacities.dtype), new_scales.to(scales.dtype)


def inject_position_noise(params: Params, scale: float) -> None:
    """Add noise ~ N(0, Σ) · gate(1 - opacity) · ``scale`` to the means (Eq. 10 of the paper)."""
    opacities = torch.sigmoid(params["opacities"])
    scales = torch.exp(params["scales"])
    factors = quat_scale_to_factor(params["quats"], scales)  # [N, 3, 3]
    covars = factors @ factors.transpose(1, 2)  # [N, 3, 3]
    gate = torch.sigmoid(100.0 * ((1.0 - opacities) - 0.995))  # ~1 only for nearly transparent Gaussians
    noise = torch.randn_like(params["means"]) * gate[:, None] * scale
    params["means"].data.add_(torch.einsum("nij,nj->ni", covars, noise))
