"""Per-parameter-group Adam optimisers and their learning-rate schedules.

One Adam per parameter (as in gsplat): densification strategies grow and shrink each parameter
with its optimiser state independently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from gsrecon.optim import Adam, ExponentialLR, LRScheduler, Optimizer, sparse_adam_step
from gsrecon.params import PARAM_NAMES

FUSED_ADAM_DEVICES = ("cpu", "cuda")  # where torch (>= 2.4) has a fused Adam


@dataclass
class OptimizerConfig:
    """Adam learning rates of the 3DGS paper. ``means`` is multiplied by the scene extent.

    Rates are finite and >= 0 (0 freezes a group); ``eps`` is finite and > 0. ValueError names the key.
    """

    means: float = 1.6e-4
    scales: float = 5e-3
    quats: float = 1e-3
    opacities: float = 5e-2
    sh0: float = 2.5e-3
    shN: float = 2.5e-3 / 20
    eps: float = 1e-15

    def __post_init__(self) -> None:
        for name in PARAM_NAMES:
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"optimizer.{name} must be a finite number >= 0, got {value!r}")
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise ValueError(f"optimizer.eps must be a finite number > 0, got {self.eps!r}")


@dataclass
class SchedulerConfig:
    """Exponential decay per group: the learning rate reaches ``final_factor[group]`` × its start at max_steps.

    Groups not listed keep a constant rate. Factors are in (0, 1]; ValueError names the key.
    """

    final_factor: dict[str, float] = field(default_factory=lambda: {"means": 0.01})

    def __post_init__(self) -> None:
        for name, factor in self.final_factor.items():
            if name not in PARAM_NAMES:
                raise ValueError(
                    f"scheduler.final_factor names unknown group '{name}'; groups: {', '.join(PARAM_NAMES)}"
                )
            if not 0 < factor <= 1:
                raise ValueError(f"scheduler.final_factor.{name} must be in (0, 1], got {factor!r}")


Optimizers = dict[str, Optimizer]
Schedulers = dict[str, LRScheduler]


class RowSparseAdam(Optimizer):
    """Adam that moves only the Gaussians (rows) whose gradient is non-zero ("lazy" Adam, as
    ``torch.optim.SparseAdam`` computes it, with its state-dict format).

    For renderers that return sparse COO gradients (gsplat's ``sparse_grad``: means, quats and
    scales); dense gradients of the other parameters are made row-sparse before the update, so
    every parameter follows the same rule.
    """

    def __init__(
        self, params: list[dict], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "maximize": False})

    def state_layout(self, param: torch.Tensor) -> dict[str, tuple[int, ...] | None]:
        return {"step": None, "exp_avg": tuple(param.shape), "exp_avg_sq": tuple(param.shape)}

    @torch.no_grad()
    def step(self) -> None:
        """One lazy Adam update of the rows with a gradient, of every parameter that has one."""
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                if not param.grad.is_sparse:
                    param.grad = param.grad.to_sparse(sparse_dim=1)
                state = self.state[param]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                sparse_adam_step(param, param.grad, state, group["lr"], group["betas"], group["eps"])


def build_optimizers(
    params: torch.nn.ParameterDict,
    cfg: OptimizerConfig,
    scene_extent: float,
    batch_size: int = 1,
    sparse: bool = False,
) -> Optimizers:
    """One Adam per parameter (:class:`~gsrecon.optim.Adam`; `RowSparseAdam` if ``sparse``); rates scale with
    sqrt(batch_size) (and betas/eps adapt), as in gsplat. The dense Adam is ``fused`` on CPUs and GPUs: one pass
    over each tensor per step (3x faster than ``foreach`` for 35k Gaussians on one CPU thread, BENCHMARKS.md)."""
    scale = math.sqrt(batch_size)
    adam = RowSparseAdam if sparse else Adam
    optimizers: Optimizers = {}
    for name in PARAM_NAMES:
        lr = getattr(cfg, name) * (scene_extent if name == "means" else 1.0)
        fused = {} if sparse else {"fused": params[name].device.type in FUSED_ADAM_DEVICES}
        optimizers[name] = adam(
            [{"params": [params[name]], "lr": lr * scale, "name": name}],
            eps=cfg.eps / scale,
            betas=(1 - batch_size * (1 - 0.9), 1 - batch_size * (1 - 0.999)),
            **fused,
        )
    return optimizers


def build_schedulers(optimizers: Optimizers, cfg: SchedulerConfig, max_steps: int) -> Schedulers:
    """Exponential learning-rate decay for the groups named in ``cfg.final_factor`` (checked by the config)."""
    schedulers: Schedulers = {}
    for name, factor in cfg.final_factor.items():
        gamma = factor ** (1.0 / max_steps)
        schedulers[name] = ExponentialLR(optimizers[name], gamma=gamma)
    return schedulers
