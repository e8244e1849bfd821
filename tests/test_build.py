"""Building a run: the builders every command assembles from (a training run, a trained scene's run, a resolved
config), each run checked by its components, the cpu kernels built only after the run folder is claimed, and the
rules between two components refused before anything is built (one line, exit 2, naming both keys)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import write_yaml

from gsrecon.cli import main
from gsrecon.component import RunFacts, RunSetup
from gsrecon.config import ConfigError, parse_structured
from gsrecon.distributed import DistributedContext
from gsrecon.engine.build import build_scene_run, build_training_run, resolve_run
from gsrecon.engine.hook import Hook
from gsrecon.engine.resolve import RunConfig
from gsrecon.engine.run_dir import RunDir
from gsrecon.logging.console import Logger
from gsrecon.losses.base import LossTerm
from gsrecon.model.views.base import ViewModule
from gsrecon.registry import LOSS_REGISTRY, VIEW_REGISTRY


@pytest.mark.parametrize(
    "overrides, keys",
    [
        (["renderer.packed=true", "strategy.name=mcmc"], ("renderer.packed", "data.fisheye")),
        (["renderer.median_depth=true", "strategy.name=mcmc"], ("renderer.median_depth", "data.fisheye")),
        ([], ("strategy.name", "data.fisheye", "renderer.name")),
        (["strategy.name=mcmc", "hooks.ExportHook.format=mesh"], ("hooks.ExportHook.format", "data.fisheye")),
        (["strategy.name=mcmc", "views.pose_opt.name=se3"], ("views.pose_opt", "data.fisheye")),
    ],
)
def test_gsplat_through_a_fisheye_lens_is_refused_before_the_run_is_built(
    capsys, make_config, tmp_path: Path, overrides: list[str], keys: tuple[str, ...]
) -> None:
    config = write_yaml(tmp_path / "c.yaml", make_config(strategy={"name": "default"}))
    code = main(["train", "--config", str(config), "renderer.name=gsplat", "data.fisheye=lens", *overrides])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert all(key in err for key in keys) and "c.yaml" in err
    assert not (tmp_path / "run").exists()  # refused before the run folder is taken


def test_the_rules_let_a_pinhole_or_mcmc_run_through(make_config, tmp_path: Path) -> None:
    from gsrecon.engine.resolve import resolve_run_config

    for extra in ({"strategy": {"name": "mcmc"}}, {"data": {"dataset": "synthetic", "fisheye": "undistort"}}):
        raw = {**make_config(), "renderer": {"name": "gsplat", "packed": True}, **extra}
        resolved = resolve_run_config(parse_structured(RunConfig, raw), torch.device("cpu"), "c.yaml")
        assert resolved["renderer"]["packed"] is True


def test_a_scene_run_builds_data_renderer_and_views_only(make_config) -> None:
    cfg = parse_structured(RunConfig, make_config(views={"appearance": {"name": "affine"}}))
    run = build_scene_run(cfg, "c.yaml", Logger(), num_gaussians=300, device="cpu")
    assert len(run.datapipeline.scene.train) == 7 and run.device == torch.device("cpu")
    assert run.resolved["renderer"]["name"] == "torch" and set(run.views.modules) == {"appearance"}
    assert not hasattr(run, "model") and not hasattr(run, "hooks")
    device, resolved = resolve_run(cfg, "c.yaml")  # the block runner's: the config resolved, nothing built
    assert device == torch.device("cpu") and resolved["hooks"]["ExportHook"] is not None


def test_a_scene_run_is_checked_by_its_components_as_training_is(make_config) -> None:
    raw = make_config(views={"environment": {}}, data={**make_config()["data"], "background": "random"})
    cfg = parse_structured(RunConfig, raw)
    for build in (
        lambda: build_training_run(cfg, "c.yaml", Logger(), DistributedContext()),
        lambda: build_scene_run(cfg, "c.yaml", Logger(), num_gaussians=300, device="cpu"),
    ):
        with pytest.raises(ConfigError, match=r"c.yaml: key 'views.environment': .*data.background=random"):
            build()


def test_the_training_state_is_built_with_the_run(make_config) -> None:
    cfg = parse_structured(RunConfig, make_config(strategy={"name": "default"}))
    run = build_training_run(cfg, "c.yaml", Logger(), DistributedContext())
    assert set(run.state.optimizers) == set(run.model.params) and set(run.state.schedulers) <= set(run.model.params)
    assert all(group["params"][0] is run.model.params[name] for name, o in run.state.optimizers.items() for group in
               o.param_groups)  # fmt: skip
    assert run.state.strategy_state.keys() == run.strategy.initialize_state(run.datapipeline.scene.extent).keys()


@pytest.mark.slow  # 18 s on the 2 loaded cores: CI's slow run (the default run stays under 5 min)
def test_a_locked_run_folder_is_refused_before_the_cpu_kernels_are_built(make_config, tmp_path: Path) -> None:
    """``renderer.name: auto`` on the CPU builds the kernels only once the run folder is claimed: with an empty kernel
    cache, a folder another process trains in is refused at once, and nothing was built."""
    config = write_yaml(tmp_path / "c.yaml", make_config(renderer={"name": "auto"}))
    holder = RunDir(tmp_path / "run")
    holder.prepare(overwrite=False, resume=False)  # this process holds the lock: "another process" to the command
    cache = tmp_path / "cache"
    env = {**os.environ, "GSRECON_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "gsrecon", "train", "--config", str(config), "--overwrite"]
    try:
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    finally:
        holder.release()
    assert result.returncode == 2 and "is in use by gsrecon pid" in result.stderr, result.stderr
    assert not (cache / "cpu_kernels").exists()


def _views(raw: dict, notices: list[str] | None = None) -> dict:
    from gsrecon.engine.resolve import old_views_notice, resolve_views_config

    cfg = parse_structured(RunConfig, raw)
    if notices is not None and old_views_notice(cfg, "c.yaml") is not None:
        notices.append(old_views_notice(cfg, "c.yaml"))
    return resolve_views_config(cfg, "c.yaml")["views"]


def test_per_view_modules_have_one_shape_under_views_and_the_old_keys_read_with_a_notice(make_config) -> None:
    new = _views(make_config(views={"appearance": {"name": "affine", "lr": 0.01}, "pose_opt": {"name": "se3"}}))
    notices: list[str] = []
    old = _views(make_config(appearance={"mode": "affine", "lr": 0.01}, pose_opt={"name": "se3"}), notices)
    assert old == new and new["appearance"]["name"] == "affine" and new["appearance"]["lr"] == 0.01
    assert len(notices) == 1 and "'appearance:' as views.appearance" in notices[0] and "views:" in notices[0]
    # the old keys beside the new ones add options or name the module; one set both ways to other values is refused
    # naming both keys (issue 60: the old one silently won, even where the new one was written in a later layer)
    merged = _views(make_config(views={"appearance": {"name": "affine", "lr": 0.01}}, appearance={"trust": 0.5}))
    assert merged["appearance"]["name"] == "affine" and merged["appearance"]["trust"] == 0.5
    named = _views(make_config(views={"appearance": {"lr": 0.01}}, appearance={"mode": "affine"}))
    assert named["appearance"]["name"] == "affine" and named["appearance"]["lr"] == 0.01
    same = _views(make_config(views={"appearance": {"name": "affine"}}, appearance={"mode": "affine", "lr": 0.01}))
    assert same["appearance"]["name"] == "affine" and same["appearance"]["lr"] == 0.01
    for old, message in [
        ({"lr": 0.5}, r"key 'appearance.lr' \(0.5\) and key 'views.appearance.lr' \(0.01\) set the same option"),
        ({"mode": "bilateral_grid"}, r"key 'appearance.mode' \('bilateral_grid'\) and key 'views.appearance.name'"),
    ]:
        with pytest.raises(ConfigError, match=message):
            _views(make_config(views={"appearance": {"name": "affine", "lr": 0.01}}, appearance=old))
    assert _views(make_config())["pose_opt"] == {"name": "none"}  # off unless named


def test_a_view_section_takes_a_module_of_its_kind_named_by_the_key_written(make_config) -> None:
    with pytest.raises(ConfigError, match=r"key 'views.pose_opt.name': 'affine' is an appearance module"):
        _views(make_config(views={"pose_opt": {"name": "affine"}}))
    with pytest.raises(ConfigError, match=r"key 'pose_opt.mode': 'affine' is an appearance module"):
        _views(make_config(pose_opt={"mode": "affine"}))


def test_a_checkpoint_of_the_old_views_shape_resumes_exactly(make_config, make_trainer) -> None:
    from gsrecon.engine.checkpoints import load_checkpoint_file

    full = make_trainer("full", appearance={"mode": "affine", "eval": "fit_left", "eval_steps": 2})
    full.train()
    assert "read 'appearance:' as views.appearance" in (full.exp_dir / "train.log").read_text()
    step_3 = full.exp_dir / "checkpoints" / "step_000003.pt"
    checkpoint = load_checkpoint_file(step_3)
    assert "appearance" not in checkpoint["config"] and checkpoint["config"]["views"]["appearance"]["name"] == "affine"
    config = dict(checkpoint["config"])  # as written before views: held every module
    views = dict(config.pop("views"))
    config.update(appearance=views.pop("appearance"), pose_opt=views.pop("pose_opt"), views=views)
    old = full.exp_dir / "old_shape.pt"
    torch.save({**checkpoint, "config": config}, old)
    from gsrecon.engine.inference import load_trained_scene
    from gsrecon.engine.resolve import resolve_views_config

    stored = load_trained_scene(checkpoint=str(old))
    assert resolve_views_config(stored.cfg, "c")["views"]["appearance"]["eval"] == "fit_left"
    scene = load_trained_scene(checkpoint=str(old), overrides=["views.appearance.eval=identity"])
    assert resolve_views_config(scene.cfg, "c")["views"]["appearance"]["eval"] == "identity"
    scene = load_trained_scene(checkpoint=str(old), overrides=["appearance.eval=identity"])  # the old key: refused
    with pytest.raises(ConfigError, match=r"key 'appearance.eval' \('identity'\) and key 'views.appearance.eval'"):
        resolve_views_config(scene.cfg, "c")
    same = {"name": "affine", "eval": "fit_left", "eval_steps": 2}
    resumed = make_trainer("resumed", views={"appearance": same}, resume=str(old))
    resumed.train()
    log = (resumed.exp_dir / "train.log").read_text()
    assert "old_shape.pt's config has the old top-level appearance:/pose_opt: sections: read as views:" in log
    changed = [line for line in log.splitlines() if "resuming with changed settings" in line]
    assert (
        len(changed) == 1 and "exp_dir" in changed[0] and "appearance" not in changed[0] and "views" not in changed[0]
    )
    reference, again = (load_checkpoint_file(run.exp_dir / "checkpoints" / "last.pt") for run in (full, resumed))
    for name, value in reference["params"].items():
        assert torch.equal(again["params"][name], value), name
    modules = [c["views"]["appearance"] for c in (reference, again)]
    assert modules[0].keys() == modules[1].keys()
    assert all(torch.equal(modules[0][k], modules[1][k]) for k in modules[0] if torch.is_tensor(modules[0][k]))


class _Recorded:
    """A component that records its check and its set-up in ``EVENTS`` (test helper)."""

    def check(self, run: RunFacts) -> None:
        EVENTS.append(("check", type(self).__name__, None))

    def setup(self, run: RunSetup) -> None:
        run.log(f"{type(self).__name__} set up")
        EVENTS.append(("setup", type(self).__name__, run))


class RecordedTerm(_Recorded, LossTerm):
    pass


class RecordedView(_Recorded, ViewModule):
    pass


class RecordedHook(_Recorded, Hook):
    pass


EVENTS: list[tuple[str, str, RunSetup | None]] = []


def test_every_component_is_set_up_once_with_the_run_after_every_check(make_config, hook_registry, capsys) -> None:
    """One set-up shape: ``setup(run)`` on a loss term, a per-view module and a hook, each called once after every
    component accepted the run, with the run's data and a log that reaches the run's logger."""
    LOSS_REGISTRY.register("recorded")(RecordedTerm)
    VIEW_REGISTRY.register("recorded")(RecordedView)
    hook_registry.register()(RecordedHook)
    EVENTS.clear()
    raw = make_config(loss={"recorded": {}}, views={"extra": {"name": "recorded"}}, hooks={"RecordedHook": {}})
    run = build_training_run(parse_structured(RunConfig, raw), "c.yaml", Logger(), DistributedContext())
    names = ["RecordedTerm", "RecordedView", "RecordedHook"]
    assert [(kind, name) for kind, name, _ in EVENTS] == [("check", n) for n in names] + [("setup", n) for n in names]
    assert all(setup.data is run.datapipeline for kind, _, setup in EVENTS if kind == "setup")
    err = capsys.readouterr().err  # the logger's console
    assert all(f"{name} set up" in err for name in names)
