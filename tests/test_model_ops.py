"""model/ops: adding, removing and replacing Gaussians keeps parameters, optimiser moments and the declared
per-Gaussian state row-aligned, with the dense (fused) Adam and the row-sparse Adam alike."""

from __future__ import annotations

import pytest
import torch

from gsrecon.model.gaussians import init_params
from gsrecon.model.ops import append_rows, remove_rows, replace_rows, reset_opacities
from gsrecon.model.optim import OptimizerConfig, build_optimizers
from gsrecon.params import PARAM_NAMES

N = 6
PER_GAUSSIAN = ("grad2d", "radii")


def _trained(sparse: bool) -> tuple[torch.nn.ParameterDict, dict, dict]:
    """Six Gaussians after one optimiser step (so every row has moments), and a strategy state whose ``grad2d`` is
    per Gaussian, whose ``radii`` is not filled yet, and whose ``per_camera`` has, by chance, one row per Gaussian
    too but is not per Gaussian."""
    generator = torch.Generator().manual_seed(0)
    points, colors = torch.rand(N, 3, generator=generator), torch.rand(N, 3, generator=generator)
    params = torch.nn.ParameterDict(
        {k: torch.nn.Parameter(v) for k, v in init_params(points, colors, 1, 0.5, 1.0).items()}
    )
    optimizers = build_optimizers(params, OptimizerConfig(), scene_extent=1.0, sparse=sparse)
    _step(params, optimizers, generator)
    state = {"grad2d": torch.arange(float(N)), "radii": None, "per_camera": torch.arange(float(N)), "scale": 2.0}
    return params, optimizers, state


def _step(params: torch.nn.ParameterDict, optimizers: dict, generator: torch.Generator) -> None:
    for name in PARAM_NAMES:
        params[name].grad = torch.randn(params[name].shape, generator=generator)
        optimizers[name].step()
        optimizers[name].zero_grad(set_to_none=True)


def _moments(params: torch.nn.ParameterDict, optimizers: dict, name: str) -> dict:
    return optimizers[name].state[params[name]]


def _copy(moments: dict) -> dict:
    return {k: v.clone() if torch.is_tensor(v) else v for k, v in moments.items()}


@pytest.mark.parametrize("sparse", [False, True], ids=["adam", "row_sparse_adam"])
def test_remove_append_and_replace_keep_every_row_aligned(sparse: bool) -> None:
    params, optimizers, state = _trained(sparse)
    before = {k: v.detach().clone() for k, v in params.items()}
    moments = {k: _copy(_moments(params, optimizers, k)) for k in PARAM_NAMES}

    remove_rows(params, optimizers, state, PER_GAUSSIAN, torch.tensor([False, True, False, False, True, False]))
    kept = torch.tensor([0, 2, 3, 5])
    for name in PARAM_NAMES:
        assert torch.equal(params[name], before[name][kept]), name
        assert optimizers[name].param_groups[0]["params"] == [params[name]]
        after = _moments(params, optimizers, name)
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(after[key], moments[name][key][kept]), (name, key)
        assert after["step"] == moments[name]["step"]  # one count for all rows: kept as it was
    assert torch.equal(state["grad2d"], kept.float())
    assert state["radii"] is None and torch.equal(state["per_camera"], torch.arange(float(N))) and state["scale"] == 2.0

    new = {name: params[name].detach()[:2] + 10.0 for name in PARAM_NAMES}
    append_rows(params, optimizers, state, PER_GAUSSIAN, new, {"grad2d": torch.tensor([7.0, 8.0])})
    for name in PARAM_NAMES:
        assert torch.equal(params[name][4:], new[name]), name
        assert all(not v[4:].any() for k, v in _moments(params, optimizers, name).items() if k != "step"), name
    assert torch.equal(state["grad2d"], torch.tensor([0.0, 2.0, 3.0, 5.0, 7.0, 8.0]))

    grown = {k: _copy(_moments(params, optimizers, k)) for k in PARAM_NAMES}
    replace_rows(params, optimizers, state, PER_GAUSSIAN, torch.tensor([1, 3]), {k: v[:2] for k, v in new.items()})
    for name in PARAM_NAMES:
        assert torch.equal(params[name][[1, 3]], new[name][:2]), name
        for key, value in _moments(params, optimizers, name).items():
            if key != "step":
                assert not value[[1, 3]].any() and torch.equal(value[[0, 2]], grown[name][key][[0, 2]]), (name, key)
    assert torch.equal(state["grad2d"], torch.tensor([0.0, 0.0, 3.0, 0.0, 7.0, 8.0]))

    _step(params, optimizers, torch.Generator().manual_seed(1))  # the optimisers go on with the new rows
    assert all(len(params[name]) == 6 for name in PARAM_NAMES)


def test_append_fills_undeclared_rows_with_zeros_and_works_without_optimisers() -> None:
    """As when merging trained blocks: no optimiser state to carry, a per-Gaussian entry the new rows lack."""
    params, _, state = _trained(sparse=False)
    new = {name: params[name].detach()[:3].clone() for name in PARAM_NAMES}
    append_rows(params, {}, state, PER_GAUSSIAN, new)
    assert len(params["means"]) == N + 3
    assert torch.equal(state["grad2d"], torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 0.0, 0.0, 0.0]))


def test_bad_rows_and_misaligned_state_are_errors() -> None:
    params, optimizers, state = _trained(sparse=False)
    with pytest.raises(ValueError, match=r"missing \['shN'\]"):
        append_rows(params, optimizers, state, PER_GAUSSIAN, {k: params[k][:1] for k in PARAM_NAMES[:-1]})
    state["grad2d"] = torch.zeros(N + 1)
    with pytest.raises(ValueError, match="strategy state 'grad2d' has 7 rows for 6 Gaussians"):
        remove_rows(params, optimizers, state, PER_GAUSSIAN, torch.zeros(N, dtype=torch.bool))
    assert len(params["means"]) == N  # refused before anything changed


@pytest.mark.parametrize("sparse", [False, True], ids=["adam", "row_sparse_adam"])
def test_reset_opacities_lowers_them_restarts_their_moments_and_matches_gsplat(sparse: bool) -> None:
    params, optimizers, _ = _trained(sparse)
    params["opacities"].data[:3] = -5.0  # already below the reset value: kept as they are
    before = {k: v.detach().clone() for k, v in params.items()}
    step = _copy(_moments(params, optimizers, "opacities")).get("step")
    reset_opacities(params, optimizers, 0.01)
    opacities = params["opacities"]
    assert torch.equal(opacities[:3], before["opacities"][:3])
    assert torch.allclose(torch.sigmoid(opacities[3:]), torch.full((N - 3,), 0.01))
    assert optimizers["opacities"].param_groups[0]["params"] == [opacities]
    moments = _moments(params, optimizers, "opacities")
    assert all(not v.any() for k, v in moments.items() if k != "step") and moments.get("step") == step
    for name in PARAM_NAMES[:3]:  # the other parameters are untouched
        assert torch.equal(params[name], before[name])

    ops = pytest.importorskip("gsplat.strategy.ops")
    theirs, their_optimizers, _ = _trained(sparse)
    theirs["opacities"].data[:3] = -5.0
    ops.reset_opa(params=theirs, optimizers=their_optimizers, state={}, value=0.01)
    assert torch.equal(theirs["opacities"], opacities)
