"""Densification strategies: equivalence with gsplat, caps, optimizer state, resume, quality."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from conftest import read_scalars
from gsplat.strategy import DefaultStrategy as GsplatDefaultStrategy

from gsrecon.config import ConfigError, parse_structured
from gsrecon.engine.checkpoints import load_checkpoint_file
from gsrecon.engine.resolve import RunConfig, resolve_run_config
from gsrecon.hooks import Hook
from gsrecon.model.optim import OptimizerConfig, build_optimizers
from gsrecon.params import PARAM_NAMES
from gsrecon.strategy.default import DefaultStrategy
from gsrecon.strategy.mcmc import MCMCStrategy, binomial_table, relocation_update

COUNTS: list[int] = []


class CountGaussiansHook(Hook):
    """Records the number of Gaussians after every step (test helper)."""

    def after_train_iter(self, trainer) -> None:
        COUNTS.append(trainer.model.num_gaussians)


@pytest.fixture(autouse=True)
def _register_test_hooks(hook_registry) -> None:
    for cls in (CountGaussiansHook,):
        hook_registry.register()(cls)


def _random_params(n: int, generator: torch.Generator) -> torch.nn.ParameterDict:
    return torch.nn.ParameterDict(
        {
            "means": torch.randn(n, 3, generator=generator),
            "scales": torch.log(torch.rand(n, 3, generator=generator) * 0.05 + 0.001),
            "quats": torch.randn(n, 4, generator=generator),
            "opacities": torch.logit(torch.rand(n, generator=generator) * 0.98 + 0.01),
            "sh0": torch.randn(n, 1, 3, generator=generator),
            "shN": torch.randn(n, 3, 3, generator=generator),
        }
    )


def _fake_info(n: int, generator: torch.Generator) -> dict:
    means2d = torch.zeros(2, n, 2, requires_grad=True)
    means2d.grad = torch.randn(2, n, 2, generator=generator) * 4e-4
    radii = (torch.rand(2, n, 1, generator=generator) > 0.2).int().repeat(1, 1, 2) * 3
    return {"means2d": means2d, "radii": radii, "width": 64, "height": 48, "n_cameras": 2, "gaussian_ids": None}


# gsplat's DefaultStrategy's names for ours; its opacity reset never runs (gsplat 1.5.3's test is always False), so
# each case's steps hold no multiple of reset_every.
GSPLAT_NAMES = {
    "refine_start": "refine_start_iter",
    "refine_stop": "refine_stop_iter",
    "refine_scale2d_stop": "refine_scale2d_stop_iter",
}
EQUIVALENCE_CASES = {
    "paper": (range(10), dict(refine_start=2, refine_every=3, reset_every=10_000, refine_stop=100)),
    # Every other option on: AbsGS gradients, the revised opacity of splits, screen-size growth and pruning, the
    # pause after a reset (step 21 is 1 after the reset at 20: no refinement) and, past reset_every, 3D size pruning.
    "every_option": (
        range(21, 31),
        dict(
            refine_start=2, refine_every=3, reset_every=20, refine_stop=100, pause_refine_after_reset=2, absgrad=True,
            revised_opacity=True, refine_scale2d_stop=100, grow_grad2d=0.02, grow_scale2d=0.1, prune_scale2d=0.16,
            prune_scale3d=0.02,
        ),
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", EQUIVALENCE_CASES)
def test_default_strategy_matches_gsplat_default_strategy(case: str) -> None:
    """Same inputs and seeds: the same Gaussians, statistics and optimizer state as gsplat 1.5's
    DefaultStrategy, with its defaults and with every option set."""
    steps, kwargs = EQUIVALENCE_CASES[case]
    generator = torch.Generator().manual_seed(0)
    ours_params = _random_params(400, generator)
    theirs_params = torch.nn.ParameterDict({k: v.detach().clone() for k, v in ours_params.items()})
    ours_optimizers = build_optimizers(ours_params, OptimizerConfig(), scene_extent=1.0)
    theirs_optimizers = build_optimizers(theirs_params, OptimizerConfig(), scene_extent=1.0)
    ours = DefaultStrategy(DefaultStrategy.Config(**kwargs))
    ours_state = ours.initialize_state(scene_extent=1.0)
    theirs = GsplatDefaultStrategy(**{GSPLAT_NAMES.get(k, k): v for k, v in kwargs.items()})
    theirs_state = theirs.initialize_state(scene_scale=1.0)
    for name in PARAM_NAMES:  # one identical Adam step, so there are moments to carry along
        grad = torch.randn(ours_params[name].shape, generator=generator)
        ours_params[name].grad, theirs_params[name].grad = grad.clone(), grad.clone()
        ours_optimizers[name].step()
        theirs_optimizers[name].step()
    info_generator = torch.Generator().manual_seed(1)
    sizes = []
    for step in steps:
        n = len(ours_params["means"])
        assert n == len(theirs_params["means"])
        sizes.append(n)
        info = _fake_info(n, info_generator)
        info["radii"] *= torch.randint(1, 5, (1, n, 1), generator=info_generator, dtype=torch.int32)  # 1 to 4 x 3 px
        info["means2d"].absgrad = info["means2d"].grad.abs() * 2.0  # read only with absgrad
        torch.manual_seed(step)
        ours.step_post_backward(ours_params, ours_optimizers, ours_state, step, info)
        torch.manual_seed(step)
        theirs.step_post_backward(theirs_params, theirs_optimizers, theirs_state, step, info)
    assert len(set(sizes)) > 2, "the test must exercise growth and pruning"
    for name in PARAM_NAMES:  # bit for bit: the row surgery is gsrecon's own, its arithmetic gsplat's
        assert torch.equal(ours_params[name], theirs_params[name]), name
        ours_moments = ours_optimizers[name].state[ours_params[name]]
        theirs_moments = theirs_optimizers[name].state[theirs_params[name]]
        assert torch.equal(ours_moments["exp_avg"], theirs_moments["exp_avg"]), name
        assert torch.equal(ours_moments["exp_avg_sq"], theirs_moments["exp_avg_sq"]), name
    for key in ("grad2d", "count", "radii"):
        assert (
            torch.equal(ours_state[key], theirs_state[key])
            if ours_state[key] is not None
            else theirs_state.get(key) is None
        )


def test_packed_and_dense_render_info_give_the_same_statistics() -> None:
    """gsplat's packed mode lists only visible (camera, Gaussian) pairs; the statistics must not change."""
    cfg = DefaultStrategy.Config(refine_start=1000, refine_scale2d_stop=1000)
    states = []
    for packed in (False, True):
        params = _random_params(100, torch.Generator().manual_seed(0))
        optimizers = build_optimizers(params, OptimizerConfig(), scene_extent=1.0)
        strategy = DefaultStrategy(cfg)
        state = strategy.initialize_state(scene_extent=1.0)
        info = _fake_info(100, torch.Generator().manual_seed(1))
        if packed:
            visible = (info["radii"] > 0).all(-1)
            camera_ids, gaussian_ids = torch.where(visible)
            means2d = info["means2d"].detach()[visible].requires_grad_(True)
            means2d.grad = info["means2d"].grad[visible]
            info = {
                **info,
                "means2d": means2d,
                "radii": info["radii"][visible],
                "gaussian_ids": gaussian_ids,
                "camera_ids": camera_ids,
            }
        strategy.step_post_backward(params, optimizers, state, 0, info)
        states.append(state)
    assert states[0]["count"].sum() > 0
    for key in ("grad2d", "count", "radii"):
        torch.testing.assert_close(states[1][key], states[0][key])


def test_default_strategy_cap_max_keeps_highest_gradients() -> None:
    generator = torch.Generator().manual_seed(0)
    params = _random_params(300, generator)
    optimizers = build_optimizers(params, OptimizerConfig(), scene_extent=1.0)
    strategy = DefaultStrategy(
        DefaultStrategy.Config(refine_start=0, refine_every=1, grow_grad2d=0.0, prune_opa=0.0, cap_max=320)
    )
    state = strategy.initialize_state(scene_extent=1.0)
    for step in range(1, 4):
        strategy.step_post_backward(params, optimizers, state, step, _fake_info(len(params["means"]), generator))
        assert len(params["means"]) <= 320
    assert len(params["means"]) == 320


def test_default_strategy_resets_opacity() -> None:
    generator = torch.Generator().manual_seed(0)
    params = _random_params(50, generator)
    optimizers = build_optimizers(params, OptimizerConfig(), scene_extent=1.0)
    strategy = DefaultStrategy(DefaultStrategy.Config(refine_start=1000, reset_every=5))
    state = strategy.initialize_state(scene_extent=1.0)
    strategy.step_post_backward(params, optimizers, state, 5, _fake_info(50, generator))
    assert torch.sigmoid(params["opacities"]).max() <= 0.01 + 1e-6


def test_default_strategy_regularises_opacity_and_scale_only_when_asked() -> None:
    params = _random_params(40, torch.Generator().manual_seed(0))
    assert DefaultStrategy(DefaultStrategy.Config()).regularization(params, {}, {}) is None
    penalty = DefaultStrategy(DefaultStrategy.Config(opacity_reg=0.5, scale_reg=0.25)).regularization(params, {}, {})
    expected = 0.5 * torch.sigmoid(params["opacities"]).mean() + 0.25 * torch.exp(params["scales"]).mean()
    assert torch.allclose(penalty, expected)
    penalty.backward()
    assert (params["opacities"].grad > 0).all() and (params["scales"].grad > 0).all()  # toward transparent, small


def test_relocation_update_preserves_the_gaussian() -> None:
    binoms = binomial_table(51)
    opacities = torch.tensor([0.3, 0.3, 0.9, 0.05])
    scales = torch.rand(4, 3) + 0.1
    ratios = torch.tensor([1, 3, 5, 2])
    new_o, new_s = relocation_update(opacities, scales, ratios, binoms)
    torch.testing.assert_close(new_o[0], opacities[0])  # one copy: unchanged
    torch.testing.assert_close(new_s[0], scales[0])
    # n copies at the same place composite to the original peak opacity: 1 - (1 - o')^n = o.
    torch.testing.assert_close(1 - (1 - new_o) ** ratios, opacities)
    # Copies are more transparent and no larger than the original.
    assert (new_o[1:] < opacities[1:]).all() and (new_s[1:] <= scales[1:]).all()
    # Eq. 9 for n = 2 by hand: denom = o' + (o' - o'^2 / sqrt 2).
    o2 = new_o[3].double()
    expected = 0.05 / (o2 + (o2 - o2**2 / math.sqrt(2)))
    torch.testing.assert_close(new_s[3].double(), scales[3].double() * expected, rtol=1e-6, atol=0)


def test_mcmc_respects_cap_max_exactly(make_trainer) -> None:
    COUNTS.clear()
    strategy = {"name": "mcmc", "cap_max": 340, "refine_start": 0, "refine_every": 2, "grow_rate": 1.05}
    trainer = make_trainer(
        max_steps=14, strategy=strategy, hooks=[{"name": "CountGaussiansHook"}, {"name": "LogHook", "progress": False}]
    )
    trainer.train()
    assert max(COUNTS) == 340 and COUNTS[-1] == 340
    assert COUNTS[0] == 300
    assert all(b >= a for a, b in itertools.pairwise(COUNTS))
    for name, param in trainer.model.params.items():
        assert trainer.optimizers[name].state[param]["exp_avg"].shape == param.shape


def test_mcmc_cap_ratio_budgets_from_the_starting_gaussians_across_a_resume(make_trainer) -> None:
    """cap_ratio 1.2 on 300 starting Gaussians caps at 360, also after resuming at 330 Gaussians."""
    strategy = {"name": "mcmc", "cap_ratio": 1.2, "refine_start": 0, "refine_stop": 100, "refine_every": 2}
    hooks = [{"name": "LogHook", "progress": False}, {"name": "CheckPointHook", "interval": 5}]
    first = make_trainer("first", max_steps=5, strategy=strategy, hooks=hooks)
    first.train()
    assert first.model.num_gaussians == 330  # 300 -> 315 (after step 2) -> 330 (after step 4)
    resumed = make_trainer("first", max_steps=14, strategy=strategy, hooks=hooks, resume=True)
    resumed.train()
    assert resumed.strategy_state["initial_gaussians"] == 300
    assert resumed.model.num_gaussians == 360
    with pytest.raises(ValueError, match="strategy.cap_ratio must be 0 .* got 0.5"):
        make_trainer("bad", strategy={"name": "mcmc", "cap_ratio": 0.5})


def test_mcmc_relocates_dead_gaussians(make_trainer) -> None:
    trainer = make_trainer(
        max_steps=3,
        strategy={
            "name": "mcmc",
            "cap_max": 300,
            "refine_start": 0,
            "refine_stop": 100,
            "refine_every": 2,
            "noise_lr": 0.0,
        },
    )
    with torch.no_grad():
        trainer.model.params["opacities"][:100] = -20.0  # dead
    trainer.train()
    opacities = torch.sigmoid(trainer.model.params["opacities"])
    assert trainer.model.num_gaussians == 300
    assert (opacities > 0.005).all(), "dead Gaussians were moved onto live ones"


@pytest.mark.parametrize("min_opacity", [0.005, 0.3])
def test_mcmc_min_opacity_decides_which_gaussians_are_dead(min_opacity: float) -> None:
    params = _random_params(200, torch.Generator().manual_seed(0))  # opacities 0.01 to 0.99
    optimizers = build_optimizers(params, OptimizerConfig(), scene_extent=1.0)
    cfg = MCMCStrategy.Config(cap_max=200, refine_start=0, refine_every=1, noise_lr=0.0, min_opacity=min_opacity)
    strategy, before = MCMCStrategy(cfg), torch.sigmoid(params["opacities"]).clone()
    strategy.step_post_backward(params, optimizers, strategy.initialize_state(1.0), 1, {})
    after = torch.sigmoid(params["opacities"])
    assert len(after) == 200 and after.min() >= min_opacity - 1e-6  # none left at or below: all moved
    assert (before < 0.25).any() and bool((after < 0.25).any()) == (min_opacity < 0.25)  # kept only when alive


def test_strategy_start_above_cap_is_an_error(make_trainer) -> None:
    with pytest.raises(ValueError, match="cap_max=100"):
        make_trainer(strategy={"name": "mcmc", "cap_max": 100})


def test_resume_restores_strategy_state(make_trainer) -> None:
    strategy = {"name": "default", "refine_start": 1, "refine_every": 2, "grow_grad2d": 1e-5, "reset_every": 5}
    hooks = [{"name": "LogHook", "progress": False, "log_interval": 1}, {"name": "CheckPointHook", "interval": 3}]
    full = make_trainer("full", max_steps=8, strategy=strategy, hooks=hooks)
    full.train()
    checkpoint = load_checkpoint_file(full.exp_dir / "checkpoints" / "step_000003.pt")
    assert checkpoint["strategy"]["grad2d"].shape[0] == checkpoint["params"]["means"].shape[0]
    resumed = make_trainer(
        "resumed",
        max_steps=8,
        strategy=strategy,
        hooks=hooks,
        resume=str(full.exp_dir / "checkpoints" / "step_000003.pt"),
    )
    resumed.train()
    assert resumed.model.num_gaussians == full.model.num_gaussians != 300
    ref, res = read_scalars(full.exp_dir, "train/loss"), read_scalars(resumed.exp_dir, "train/loss")
    for step in range(4, 9):
        assert res[step] == pytest.approx(ref[step], rel=1e-5)


def test_absgrad_needs_a_renderer_that_provides_it(make_trainer) -> None:
    with pytest.raises(ConfigError, match="key 'strategy.absgrad'.*renderer 'torch'.*renderer.name=gsplat"):
        make_trainer(strategy={"name": "default", "absgrad": True})


def _resolved_renderer(make_config, renderer: dict, strategy: dict) -> dict:
    cfg = parse_structured(RunConfig, make_config(renderer=renderer, strategy=strategy))
    return resolve_run_config(cfg, torch.device("cpu"), "c.yaml")["renderer"]


def test_absgrad_is_set_once_on_the_strategy_and_the_renderer_follows(make_config) -> None:
    """The strategy, which reads the gradients, decides; gsplat is told to compute them (and the resolved config
    that says so runs again)."""
    gsplat = {"name": "gsplat"}
    assert _resolved_renderer(make_config, gsplat, {"name": "default", "absgrad": True})["absgrad"] is True
    assert _resolved_renderer(make_config, gsplat, {"name": "default"})["absgrad"] is False
    assert _resolved_renderer(make_config, gsplat, {"name": "mcmc"})["absgrad"] is False
    again = {"name": "gsplat", "absgrad": True}
    assert _resolved_renderer(make_config, again, {"name": "default", "absgrad": True})["absgrad"] is True
    with pytest.raises(ConfigError, match="key 'renderer.absgrad': follows strategy.absgrad .*false here.*remove it"):
        _resolved_renderer(make_config, again, {"name": "mcmc"})


@pytest.mark.slow
def test_default_strategy_beats_no_densification_by_2db(make_trainer) -> None:
    """From a sparse point cloud, adaptive density control must clearly help at equal steps (CPU)."""
    steps = 1500
    data = {"dataset": "synthetic", "synthetic": {"width": 64, "height": 48, "num_views": 17, "num_points": 200}}
    common = dict(
        max_steps=steps,
        val_interval=steps,
        data=data,
        model={"sh_degree": 1, "sh_degree_interval": 200},
        hooks=[{"name": "LogHook", "progress": False, "log_interval": 100}],
    )
    plain = make_trainer("none", strategy={"name": "none"}, **common)
    plain.train()
    densified = make_trainer(
        "default",
        strategy={"name": "default", "refine_start": 100, "refine_every": 100, "refine_stop": steps - 100},
        **common,
    )
    densified.train()
    assert densified.model.num_gaussians > 2 * plain.model.num_gaussians
    assert densified.val_metrics["psnr"] >= plain.val_metrics["psnr"] + 2.0, (
        plain.val_metrics["psnr"],
        densified.val_metrics["psnr"],
    )
