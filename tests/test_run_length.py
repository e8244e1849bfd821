"""Defaults that follow the run: schedules scale with its length, threads with the machine, init with the data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import yaml
from conftest import write_yaml

from gsrecon.data.readers.synthetic import SyntheticConfig, load_synthetic
from gsrecon.data.scene import Frame, Scene
from gsrecon.engine.resolve import load_run_config, resolve_run_config
from gsrecon.engine.runtime import set_cpu_threads
from gsrecon.model.gaussians import GaussianModel, random_start_center

REPO = Path(__file__).resolve().parents[1]


def _resolved(config: Path, *overrides: str) -> dict:
    cfg, source = load_run_config(str(config), list(overrides))
    return resolve_run_config(cfg, torch.device("cpu"), source)


def test_unset_step_counts_scale_with_max_steps_and_set_ones_stay(tmp_path: Path) -> None:
    base = REPO / "configs" / "mipnerf360.yaml"
    full = _resolved(base, "data.path=/x")
    assert {k: full["strategy"][k] for k in ("refine_start", "refine_stop", "reset_every")} == {
        "refine_start": 500,
        "refine_stop": 15_000,
        "reset_every": 3000,
    }
    assert full["model"]["sh_degree_interval"] == 1000  # the 3DGS paper's schedule at 30k steps
    short = _resolved(base, "data.path=/x", "max_steps=2000")
    assert short["strategy"]["refine_stop"] == 1000 and short["strategy"]["refine_start"] == 33
    assert short["model"]["sh_degree_interval"] == 67
    assert short["strategy"]["refine_every"] == 100  # not a run-length setting
    explicit = _resolved(base, "data.path=/x", "max_steps=2000", "strategy.refine_stop=1800")
    assert explicit["strategy"]["refine_stop"] == 1800
    mcmc = _resolved(base, "data.path=/x", "max_steps=3000", "strategy={name: mcmc}")
    assert mcmc["strategy"]["refine_stop"] == 2500 and mcmc["strategy"]["refine_start"] == 50


@pytest.mark.parametrize(("max_steps", "reset_every"), [(1000, 3000), (2000, 3000), (7000, 3000), (60_000, 6000)])
def test_opacity_resets_are_never_closer_than_3000_steps(max_steps: int, reset_every: int) -> None:
    """Issue 19: scaled to a 2000-step run, resets came every 200 steps and a random start ended with a tenth of
    the Gaussians; recovering from a reset takes a fixed number of steps, so only longer runs spread them out."""
    resolved = _resolved(REPO / "configs" / "mipnerf360.yaml", "data.path=/x", f"max_steps={max_steps}")
    assert resolved["strategy"]["reset_every"] == reset_every


def test_a_short_run_from_random_points_is_never_reset(make_trainer) -> None:
    """Opacities only ever fall to the reset value (2 x prune_opa) through a reset: a short default run has none."""
    trainer = make_trainer(
        max_steps=60,
        val_interval=60,
        model={"sh_degree": 0, "init": "random", "init_num_points": 400},
        strategy={"name": "default", "refine_every": 10},
    )
    resets = []
    trainer.strategy.step_post_backward = _spy(trainer.strategy.step_post_backward, trainer, resets)
    trainer.train()
    assert trainer.resolved_config["strategy"]["reset_every"] == 3000
    assert resets == []


def _spy(step_post_backward, trainer, resets: list[int]):
    """``step_post_backward`` that records the steps after which every opacity sits at the reset value (or, the
    worst case, no Gaussian is left)."""

    def wrapped(params, optimizers, state, step, info, *args, **kwargs):
        step_post_backward(params, optimizers, state, step, info, *args, **kwargs)
        reset_value = 2.0 * trainer.strategy.cfg.prune_opa
        opacities = torch.sigmoid(params["opacities"])  # [N]
        if len(opacities) == 0 or torch.allclose(opacities.max(), torch.tensor(reset_value)):
            resets.append(step)

    return wrapped


def test_a_config_without_step_counts_gets_them_from_max_steps(make_config, tmp_path: Path) -> None:
    config = make_config()
    config["model"] = {"sh_degree": 1}  # sh_degree_interval left to follow max_steps
    path = write_yaml(tmp_path / "c.yaml", config)
    assert _resolved(path)["model"]["sh_degree_interval"] == 1  # 1000 × 6 / 30000, at least 1
    assert _resolved(path, "max_steps=300")["model"]["sh_degree_interval"] == 10


@pytest.mark.parametrize("requested", [1, 2])
def test_thread_counts_are_used_and_said_explicit_or_auto(requested: int) -> None:
    before = torch.get_num_threads()
    try:
        assert set_cpu_threads(requested).startswith(f"{requested} CPU threads (num_threads: {requested}")
        assert torch.get_num_threads() == requested
        line = set_cpu_threads(0)
        assert line.startswith(f"{torch.get_num_threads()} CPU threads (num_threads: 0, auto: ")
        assert 1 <= torch.get_num_threads() <= len(os.sched_getaffinity(0))
    finally:
        torch.set_num_threads(before)


def test_auto_init_uses_points_when_the_data_has_them_and_random_otherwise(make_trainer) -> None:
    trainer = make_trainer(model={"sh_degree": 1, "init": "auto"})
    assert trainer.model.num_gaussians == 300  # the synthetic scene's SfM-like points
    scene = trainer.datapipeline.scene
    no_points = Scene(scene.train, scene.test, torch.zeros(0, 3), torch.zeros(0, 3))
    cfg = GaussianModel.Config(sh_degree=1, init="auto", init_num_points=123)
    assert GaussianModel.from_scene(cfg, no_points).num_gaussians == 123


@pytest.mark.parametrize(
    ("init", "strategy", "weight"), [("random", {}, 0.01), ("auto", {}, 0.0), ("random", {"opacity_reg": 0.0}, 0.0)]
)
def test_opacity_regularisation_is_on_by_default_for_random_starts_only(make_trainer, init, strategy, weight) -> None:
    """Issue 19: it clears a random start's haze (up to +4 dB in the sweep) and costs starts from points up to
    0.5 dB; a weight the config sets is kept. config.yaml records the weight the run used."""
    trainer = make_trainer(model={"sh_degree": 0, "init": init}, strategy={"name": "default", **strategy})
    assert trainer.strategy.cfg.opacity_reg == weight
    assert yaml.safe_load((trainer.exp_dir / "config.yaml").read_text())["strategy"]["opacity_reg"] == weight
    penalty = trainer.strategy.regularization(trainer.model.params, trainer.strategy_state, {})
    assert (penalty is not None) == (weight > 0)


@pytest.mark.parametrize(("init", "share"), [("random", 0.75), ("auto", 0.5)])
def test_refinement_from_random_points_runs_to_three_quarters_of_the_run(make_trainer, init, share) -> None:
    """Issue 19: half the run (the 3DGS schedule, made for SfM points) leaves a random start under-densified;
    three quarters gained 0.1-2.3 dB on every random-start row. A refine_stop the config sets is kept."""
    trainer = make_trainer(max_steps=400, model={"sh_degree": 0, "init": init}, strategy={"name": "default"})
    stop = round(400 * share)
    assert trainer.strategy.cfg.refine_stop == stop
    assert yaml.safe_load((trainer.exp_dir / "config.yaml").read_text())["strategy"]["refine_stop"] == stop
    kept = make_trainer("kept", max_steps=400, model={"init": init}, strategy={"name": "default", "refine_stop": 123})
    assert kept.strategy.cfg.refine_stop == 123


def test_init_names_are_checked_before_any_data_is_loaded(make_trainer) -> None:
    with pytest.raises(ValueError, match=r"model\.init must be one of auto, sfm, random, ply; got 'sfmm'"):
        make_trainer(model={"init": "sfmm"}, data={"dataset": "colmap", "path": "/does/not/exist"})


def test_the_fast_recipe_grows_where_the_views_agree_in_a_window_that_follows_max_steps() -> None:
    fast = _resolved(REPO / "configs" / "fast.yaml", "data.path=/x", "max_steps=2000")
    assert fast["strategy"]["name"] == "multiview" and fast["strategy"]["grow_score"] == 5
    assert fast["strategy"]["refine_stop"] == 1000 and fast["strategy"]["refine_start"] == 33


def test_random_start_size_follows_the_device_unless_set(make_trainer) -> None:
    """100 000 random points (gsplat's count) on a GPU, 10 000 on a CPU, where each costs far more."""
    base = REPO / "configs" / "mipnerf360.yaml"
    for device, expected in (("cpu", 10_000), ("cuda", 100_000)):
        cfg, source = load_run_config(str(base), ["data.path=/x"])
        assert resolve_run_config(cfg, torch.device(device), source)["model"]["init_num_points"] == expected
    assert _resolved(base, "data.path=/x", "model.init_num_points=123")["model"]["init_num_points"] == 123
    trainer = make_trainer(model={"sh_degree": 1, "init": "random"})
    assert trainer.model.num_gaussians == 10_000
    assert trainer.resolved_config["model"]["init_num_points"] == 10_000  # config.yaml records the number


@pytest.mark.parametrize("arc_deg", [360.0, 90.0])
def test_random_start_is_centred_where_the_cameras_look(arc_deg: float, synthetic_cache: Path) -> None:
    """Not on the cameras' mean position, which for a forward-facing capture lies far in front of the object."""
    config = SyntheticConfig(
        width=16, height=12, num_views=8, val_every=0, arc_deg=arc_deg, cache_dir=str(synthetic_cache)
    )
    scene = load_synthetic(config, factor=1, eval_split="none")
    target = torch.tensor(config.look_at)
    assert (scene.center - target).norm() > 2.0  # above the object on the orbit, or in front of it on the arc
    cfg = GaussianModel.Config(sh_degree=0, init="random", init_num_points=20_000, init_extent=1.0)
    means = GaussianModel.from_scene(cfg, scene).params["means"].detach()
    assert (means.mean(0) - target).norm() < 0.05 * scene.extent
    assert torch.allclose(means.amax(0) - means.amin(0), torch.full((3,), 2.0 * scene.extent), rtol=0.01)


def test_random_start_of_cameras_with_parallel_axes_is_centred_on_the_cameras(synthetic_cache: Path) -> None:
    """Parallel optical axes meet nowhere: the cloud stays around the cameras' mean position."""
    config = SyntheticConfig(width=16, height=12, num_views=4, val_every=0, cache_dir=str(synthetic_cache))
    scene = load_synthetic(config, factor=1, eval_split="none")
    viewmats = [frame.viewmat.clone() for frame in scene.train]
    for i, viewmat in enumerate(viewmats):
        viewmat[:3, :3] = viewmats[0][:3, :3]
        viewmat[:3, 3] = viewmats[0][:3, 3] + torch.tensor([float(i), 0.0, 0.0])
    frames = [Frame(f.name, v, f.K, f.image, f.source) for f, v in zip(scene.train, viewmats)]
    parallel = Scene(frames, [], torch.zeros(0, 3), torch.zeros(0, 3))
    assert torch.equal(random_start_center(parallel), parallel.center)
