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
from gsrecon.model.views.optim import VisitedRowsAdam
from gsrecon.optim import Adam, ExponentialLR, LambdaLR
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


def _grads(params: list[Tensor], generator: torch.Generator) -> None:
    for param in params:
        param.grad = torch.randn(param.shape, generator=generator)


def _assert_same_state(ours, theirs) -> None:
    """Bit-equal state dicts (every tensor, every group setting)."""
    a, b = ours.state_dict(), theirs.state_dict()
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for index, state in a["state"].items():
        assert state.keys() == b["state"][index].keys()
        for key, value in state.items():
            other = b["state"][index][key]
            if isinstance(value, Tensor):
                assert value.dtype == other.dtype and value.device == other.device and torch.equal(value, other), key
            else:
                assert value == other, key


@pytest.mark.parametrize("fused", [True, False])
def test_adam_and_its_schedule_step_bit_for_bit_as_torchs_and_checkpoints_move_both_ways(fused: bool, tmp_path) -> None:
    """gsrecon's Adam (no torch._dynamo) against torch.optim.Adam with the same ``fused`` choice: the same bits after
    every step, through an exponential schedule, and a state saved by either resumes exactly in the other."""
    start = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
    runs = []
    for kind in ("ours", "torch"):
        params = [torch.nn.Parameter(start.clone()), torch.nn.Parameter(start[:7, :2].clone())]
        groups = [{"params": [params[0]], "lr": 0.03, "name": "means"}, {"params": [params[1]], "lr": 0.01}]
        if kind == "ours":
            optimizer = Adam(groups, eps=1e-15, betas=(0.8, 0.99), fused=fused)
            schedule = ExponentialLR(optimizer, gamma=0.9)
        else:
            optimizer = torch.optim.Adam(groups, eps=1e-15, betas=(0.8, 0.99), fused=fused)
            schedule = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)
        runs.append((params, optimizer, schedule))
    for step in range(5):
        for params, optimizer, schedule in runs:
            _grads(params, torch.Generator().manual_seed(step))
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            assert all(p.grad is None for p in params)
        (ours, our_opt, our_schedule), (theirs, their_opt, their_schedule) = runs
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
        _assert_same_state(our_opt, their_opt)
        assert our_schedule.get_last_lr() == their_schedule.get_last_lr()
    assert our_schedule.state_dict() == their_schedule.state_dict()
    assert our_opt.state[ours[0]]["step"].device == ours[0].device  # where torch keeps the count

    # each side's checkpoint (through a file, as a run's) loads into the other's fresh optimiser and continues exactly
    torch.save({"opt": their_opt.state_dict(), "sched": their_schedule.state_dict()}, tmp_path / "torch.pt")
    torch.save({"opt": our_opt.state_dict(), "sched": our_schedule.state_dict()}, tmp_path / "ours.pt")
    resumed = []
    for kind, saved in (("ours", "torch.pt"), ("torch", "ours.pt")):
        checkpoint = torch.load(tmp_path / saved, weights_only=True)
        params = [torch.nn.Parameter(p.detach().clone()) for p in runs[0][0]]
        groups = [{"params": [params[0]], "lr": 0.5, "name": "means"}, {"params": [params[1]], "lr": 0.5}]
        torch_kinds = (torch.optim.Adam, torch.optim.lr_scheduler.ExponentialLR)
        adam, exponential = (Adam, ExponentialLR) if kind == "ours" else torch_kinds
        optimizer = adam(groups, eps=1e-15, betas=(0.8, 0.99), fused=fused)
        schedule = exponential(optimizer, gamma=0.9)
        optimizer.load_state_dict(checkpoint["opt"])
        schedule.load_state_dict(checkpoint["sched"])
        resumed.append((params, optimizer, schedule))
    for step in range(5, 8):
        for params, optimizer, schedule in [*runs, *resumed]:
            _grads(params, torch.Generator().manual_seed(step))
            optimizer.step()
            schedule.step()
    for params, optimizer, _ in resumed:
        assert all(torch.equal(a, b) for a, b in zip(params, runs[1][0]))
        _assert_same_state(optimizer, runs[1][1])


def test_adam_without_the_fused_op_or_with_settings_it_lacks_says_so(monkeypatch) -> None:
    param = torch.nn.Parameter(torch.zeros(3))
    saved = torch.optim.Adam([param], amsgrad=True).state_dict()
    adam = Adam([param])
    adam.load_state_dict(saved)
    param.grad = torch.ones(3)
    with pytest.raises(ValueError, match="supports none of {'amsgrad': True}"):
        adam.step()
    monkeypatch.delattr(torch, "_fused_adam_")  # torch < 2.4
    with pytest.raises(RuntimeError, match=r"has no fused Adam \(torch._fused_adam_\): install torch >= 2.4"):
        Adam([param], fused=True)


@pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")  # torch warns: stepped without optimiser steps
def test_the_pose_schedule_gives_torchs_lambda_rates() -> None:
    rates = []
    for adam, lambda_lr in ((Adam, LambdaLR), (torch.optim.Adam, torch.optim.lr_scheduler.LambdaLR)):
        optimizer = adam([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
        schedule = lambda_lr(optimizer, lambda step: 0.01 ** (min(step, 7) / 7))
        rates.append([schedule.get_last_lr()[0]])
        for _ in range(9):
            schedule.step()
            rates[-1].append(optimizer.param_groups[0]["lr"])
        assert schedule.state_dict()["lr_lambdas"] == [None]
    assert rates[0] == rates[1]


def test_row_sparse_adam_is_torchs_sparse_adam_and_loads_its_state() -> None:
    grad = torch.tensor([[0.0, 0.0, 0.0], [1.0, -2.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    ours, theirs = torch.nn.Parameter(torch.ones(4, 3)), torch.nn.Parameter(torch.ones(4, 3))
    opt_ours, opt_theirs = RowSparseAdam([{"params": [ours]}], lr=0.1), torch.optim.SparseAdam([theirs], lr=0.1)
    for step in range(4):
        ours.grad, theirs.grad = grad * (step + 1), (grad * (step + 1)).to_sparse(sparse_dim=1)
        opt_ours.step()
        opt_theirs.step()
        assert torch.equal(ours, theirs)
    _assert_same_state(opt_ours, opt_theirs)
    fresh = RowSparseAdam([{"params": [torch.nn.Parameter(theirs.detach().clone())]}], lr=0.1)
    fresh.load_state_dict(opt_theirs.state_dict())
    _assert_same_state(fresh, opt_theirs)


def test_visited_rows_adam_loads_the_state_torchs_optimizer_base_wrote() -> None:
    """A checkpoint of the per-view modules written when VisitedRowsAdam was a torch.optim.Optimizer."""

    class TorchVisitedRowsAdam(torch.optim.Optimizer):
        def __init__(self, params, lr):
            super().__init__(params, {"lr": lr, "betas": (0.9, 0.999), "eps": 1e-15})

    param = torch.nn.Parameter(torch.zeros(5, 6))
    old = TorchVisitedRowsAdam([{"params": [param], "lr": 0.1, "name": "PoseModule"}], lr=0.1)
    old.state[param] = {"exp_avg": torch.ones(5, 6), "exp_avg_sq": torch.ones(5, 6), "updates": torch.arange(5.0)}
    new = VisitedRowsAdam([{"params": [param], "lr": 0.1, "name": "PoseModule"}], lr=0.1)
    new.load_state_dict(old.state_dict())
    _assert_same_state(new, old)
    param.grad = torch.ones(5, 6)
    new.step(torch.tensor([1, 3]))
    assert new.state[param]["updates"].tolist() == [0.0, 2.0, 2.0, 4.0, 4.0]


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
