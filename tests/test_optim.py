"""Optimisers: fused dense Adam; row-sparse Adam for renderers that return sparse gradients (gsplat's
``sparse_grad``); learning-rate and schedule settings checked when the config is read."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import read_scalars
from torch import Tensor

from gsrecon.engine.checkpoints import load_checkpoint_file
from gsrecon.model.optim import OptimizerConfig, RowSparseAdam, SchedulerConfig, build_optimizers
from gsrecon.params import PARAM_NAMES
from gsrecon.registry import RENDERER_REGISTRY
from gsrecon.render.torch_renderer import TorchRenderer


class _RowSparseGrad(torch.autograd.Function):
    """Identity whose backward hands on the gradient as sparse COO rows, as gsplat's projection does."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        rows = grad.flatten(1).ne(0).any(dim=1).nonzero()[:, 0]
        return torch.sparse_coo_tensor(rows[None], grad[rows], grad.shape, check_invariants=False)


@RENDERER_REGISTRY.register("torch_sparse_grad")
class SparseGradRenderer(TorchRenderer):
    """The torch renderer with gsplat's sparse_grad behaviour: means, quats and scales get sparse gradients."""

    @property
    def sparse_grad(self) -> bool:
        return True

    def _render(self, params, *args, **kwargs):
        sparse = {k: _RowSparseGrad.apply(v) if k in ("means", "quats", "scales") else v for k, v in params.items()}
        return super()._render(sparse, *args, **kwargs)


def test_row_sparse_adam_moves_only_rows_with_a_gradient() -> None:
    dense = torch.nn.Parameter(torch.zeros(4, 3))
    sparse = torch.nn.Parameter(torch.zeros(4, 3))
    grad = torch.tensor([[0.0, 0.0, 0.0], [1.0, -2.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    opt_dense, opt_sparse = RowSparseAdam([dense], lr=0.1), RowSparseAdam([sparse], lr=0.1)
    for _ in range(3):
        dense.grad = grad.clone()
        sparse.grad = grad.to_sparse(sparse_dim=1)
        opt_dense.step()
        opt_sparse.step()
    assert torch.equal(dense.data, sparse.data)
    assert torch.equal(dense.data[[0, 2]], torch.zeros(2, 3))  # no gradient: not moved
    assert dense.data[1, 0] < 0 < dense.data[1, 1] and dense.data[3, 2] < 0
    assert dense.data[1, 2] == 0  # a zero entry inside a moved row gets a zero step
    # a row seen once and then no more keeps its moments (lazy Adam), unlike torch.optim.Adam
    dense.grad = torch.zeros(4, 3)
    before = dense.data.clone()
    opt_dense.step()
    assert torch.equal(dense.data, before)


def _reference_adam(optimizer: torch.optim.Adam) -> torch.optim.Adam:
    """An Adam with ``optimizer``'s parameters and settings in torch's per-tensor implementation."""
    groups = [{k: v for k, v in group.items() if k not in ("fused", "foreach")} for group in optimizer.param_groups]
    return torch.optim.Adam(groups, foreach=False, fused=False)


def test_dense_adam_is_fused_on_the_cpu_and_steps_as_the_reference_adam_through_densification() -> None:
    from gsplat.strategy.ops import duplicate, remove

    shapes = {"means": (50, 3), "scales": (50, 3), "quats": (50, 4), "opacities": (50,), "sh0": (50, 1, 3)}
    shapes["shN"] = (50, 15, 3)
    generator = torch.Generator().manual_seed(0)
    start = {k: torch.randn(shape, generator=generator) for k, shape in shapes.items()}
    runs = []
    for fused in (True, False):
        params = torch.nn.ParameterDict({k: torch.nn.Parameter(start[k].clone()) for k in PARAM_NAMES})
        optimizers = build_optimizers(params, OptimizerConfig(), scene_extent=2.0)
        if not fused:  # the same settings in torch's reference (per-tensor) implementation
            optimizers = {k: _reference_adam(o) for k, o in optimizers.items()}
        assert all(bool(o.param_groups[0]["fused"]) is fused for o in optimizers.values())
        grads = torch.Generator().manual_seed(1)
        for step in range(6):
            for p in params.values():
                p.grad = torch.randn(p.shape, generator=grads)
            for optimizer in optimizers.values():
                optimizer.step()
            if step == 2:  # densification replaces the parameters and edits the moments in place
                duplicate(params, optimizers, {}, torch.arange(len(params["means"])) % 5 == 0)
                remove(params, optimizers, {}, torch.arange(len(params["means"])) % 7 == 0)
        runs.append(params)
    for name in PARAM_NAMES:
        torch.testing.assert_close(runs[0][name], runs[1][name], rtol=1e-5, atol=1e-6)


def test_sparse_gradients_train_densify_and_resume_exactly(make_trainer) -> None:
    strategy = {"name": "default", "refine_start": 1, "refine_every": 2, "grow_grad2d": 1e-5, "reset_every": 5}
    hooks = [{"name": "LogHook", "progress": False, "log_interval": 1}, {"name": "CheckPointHook", "interval": 3}]
    common = dict(max_steps=8, strategy=strategy, hooks=hooks, renderer={"name": "torch_sparse_grad"})
    full = make_trainer("full", **common)
    assert all(isinstance(o, RowSparseAdam) for o in full.optimizers.values())
    full.train()
    assert full.model.num_gaussians != 300  # densified with row-sparse optimiser state
    for name, param in full.model.params.items():
        assert full.optimizers[name].state[param]["exp_avg"].shape == param.shape
    checkpoint = full.exp_dir / "checkpoints" / "step_000003.pt"
    assert load_checkpoint_file(checkpoint)["optimizers"]["means"]["state"]
    resumed = make_trainer("resumed", resume=str(checkpoint), **common)
    resumed.train()
    ref, res = read_scalars(full.exp_dir, "train/loss"), read_scalars(resumed.exp_dir, "train/loss")
    for step in range(4, 9):
        assert res[step] == pytest.approx(ref[step], rel=1e-5)
    assert torch.equal(resumed.model.params["means"], full.model.params["means"])


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("means", -1.0, "optimizer.means must be a finite number >= 0, got -1.0"),
        ("scales", float("nan"), "optimizer.scales must be a finite number >= 0, got nan"),
        ("shN", float("inf"), "optimizer.shN must be a finite number >= 0, got inf"),
        ("eps", 0.0, "optimizer.eps must be a finite number > 0, got 0.0"),
        ("eps", float("nan"), "optimizer.eps must be a finite number > 0, got nan"),
    ],
)
def test_negative_or_non_finite_learning_rates_are_refused_naming_the_key(key: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        OptimizerConfig(**{key: value})


def test_a_zero_learning_rate_freezes_a_group() -> None:
    assert OptimizerConfig(means=0.0).means == 0.0


@pytest.mark.parametrize(
    ("final_factor", "message"),
    [
        ({"means": 0.0}, r"scheduler.final_factor.means must be in \(0, 1\], got 0.0"),
        ({"means": float("nan")}, r"scheduler.final_factor.means must be in \(0, 1\], got nan"),
        ({"sh0": 2.0}, r"scheduler.final_factor.sh0 must be in \(0, 1\], got 2.0"),
        ({"colours": 0.5}, "scheduler.final_factor names unknown group 'colours'; groups: means, scales"),
    ],
)
def test_bad_schedules_are_refused_when_the_config_is_read(final_factor: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(final_factor=final_factor)
