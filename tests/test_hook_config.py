"""Editing hooks from YAML and the command line: adding keeps the base's hooks, names address them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import write_yaml

from gsrecon.cli import main
from gsrecon.config import ConfigError
from gsrecon.engine.resolve import DEFAULT_HOOKS, load_run_config, resolve_hooks

REPO = Path(__file__).resolve().parents[1]


def _tiny_overrides(tmp_path: Path, synthetic_cache: Path, exp_dir: Path) -> list[str]:
    return [
        f"exp_dir={exp_dir}",
        "device=cpu",
        "num_threads=1",
        "max_steps=6",
        "val_interval=3",
        "model.sh_degree=1",
        "renderer.name=torch",
        "metrics.lpips_net=none",
        "writers=[]",
        "strategy.refine_start=2",
        "strategy.refine_every=2",
        "data.synthetic={width: 32, height: 24, num_views: 9, num_points: 300, supersample: 2}",
        f"data.synthetic.cache_dir={synthetic_cache}",
        "hooks.LogHook.progress=false",
    ]


def _hook_keys(config: Path, overrides: list[str] = ()) -> list[str]:
    cfg, source = load_run_config(str(config), overrides)
    return [key for key, entry in resolve_hooks(cfg.hooks, source).items() if entry is not None]


def test_a_child_yaml_adding_a_hook_keeps_every_hook_of_its_base(tmp_path: Path) -> None:
    base = write_yaml(tmp_path / "base.yaml", {"hooks": {"LogHook": {"log_interval": 7}, "EmptyCacheHook": {}}})
    mapping_child = write_yaml(tmp_path / "a.yaml", {"_base_": "base.yaml", "hooks": {"EmptyCacheHook": None}})
    list_child = write_yaml(
        tmp_path / "b.yaml", {"_base_": "base.yaml", "hooks": [{"name": "LogHook", "ema_factor": 1}]}
    )
    assert set(_hook_keys(base)) == {*DEFAULT_HOOKS, "EmptyCacheHook"}
    assert set(_hook_keys(mapping_child)) == set(DEFAULT_HOOKS)
    cfg, source = load_run_config(str(list_child))
    log = resolve_hooks(cfg.hooks, source)["LogHook"]
    assert set(resolve_hooks(cfg.hooks, source)) == {*DEFAULT_HOOKS, "EmptyCacheHook"}
    assert log["log_interval"] == 7 and log["ema_factor"] == 1  # merged by name, not replaced


def test_command_line_adds_reconfigures_and_removes_hooks_by_name(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "c.yaml", {})
    cfg, source = load_run_config(
        str(config),
        ["hooks.CheckPointHook.interval=500", "hooks.EmptyCacheHook={}", "hooks.ExportHook=null"],
    )
    hooks = resolve_hooks(cfg.hooks, source)
    assert hooks["CheckPointHook"]["interval"] == 500
    assert "EmptyCacheHook" in hooks and hooks["ExportHook"] is None  # removed (and listed as such)
    with pytest.raises(ConfigError, match=r"'hooks\.Nope'.*null removes.*present: IterTimerHook"):
        load_run_config(str(config), ["hooks.Nope=null"])
    with pytest.raises(ConfigError, match=r"addressed by name, not position.*hooks\.LogHook\.log_interval"):
        load_run_config(str(config), ["hooks.2.log_interval=10"])
    cfg, source = load_run_config(str(config), ["hooks.CheckPoinHook.interval=5"])
    with pytest.raises(ConfigError, match=r"hooks\.CheckPoinHook.*did you mean 'CheckPointHook'.*other hooks: Iter"):
        resolve_hooks(cfg.hooks, source)


def test_two_hooks_of_one_class_and_run_order(tmp_path: Path) -> None:
    config = write_yaml(
        tmp_path / "c.yaml",
        {"hooks": {"SecondExport": {"name": "ExportHook", "path": "copy.ply"}, "LogHook": {"priority": "HIGHEST"}}},
    )
    cfg, source = load_run_config(str(config))
    hooks = resolve_hooks(cfg.hooks, source)
    assert hooks["SecondExport"] == {"name": "ExportHook", "priority": 100, "path": "copy.ply", "format": "ply"}
    assert hooks["ExportHook"]["path"] == "point_cloud.ply"
    keys = list(hooks)
    assert keys[0] == "LogHook"  # priority 0 first
    assert keys.index("ExportHook") < keys.index("SecondExport")  # equal priorities keep listing order


@pytest.mark.parametrize(
    "content, message",
    [
        ("hooks: [LogHook]\n", r"'hooks\.0': 'LogHook' is a bare name; write `- name: LogHook`"),
        ("hooks: {LogHook: 5}\n", r"'hooks\.LogHook': an entry is a mapping of its arguments"),
        ("imports: my_hooks.py\n", r"'imports': must be a list, e\.g\. imports: \[my_hooks\.py\]"),
    ],
)
def test_malformed_hook_entries_get_one_line_naming_the_key(tmp_path: Path, capsys, content: str, message) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(content)
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "bad.yaml" in err
    assert re.search(message, err), err


def test_gsrecon_hooks_prints_order_priority_arguments_and_points(capsys) -> None:
    assert main(["hooks", "--config", str(REPO / "configs" / "synthetic.yaml"), "hooks.EmptyCacheHook={}"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "Hook" in line and "│" in line]
    assert [row.split("│")[1].strip() for row in rows if row.split("│")[1].strip()] == [
        "IterTimerHook",
        "CheckInvalidLossHook",
        "LogHook",
        "MetricsHook",
        "CheckPointHook",
        "ExportHook",
        "EmptyCacheHook",
    ]
    assert "VERY_LOW (90)" in out and "interval=1000" in out and "after_train_iter" in out


def test_resolved_config_yaml_reproduces_the_hooks_including_removed_defaults(make_config, tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "c.yaml", make_config(hooks={"LogHook": {"progress": False}}))
    overrides = ["hooks.ExportHook=null", "hooks.EmptyCacheHook={}", "max_steps=1"]
    assert main(["train", "--config", str(config), *overrides]) == 0
    written = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["hooks"]
    assert written["ExportHook"] is None and "EmptyCacheHook" in written
    again, source = load_run_config(str(tmp_path / "run" / "config.yaml"))
    assert resolve_hooks(again.hooks, source) == written


def test_resolved_config_lists_hooks_in_run_order(make_trainer) -> None:
    trainer = make_trainer(hooks={"ExportHook": {}, "LogHook": {"progress": False}, "IterTimerHook": {}})
    written = yaml.safe_load((trainer.exp_dir / "config.yaml").read_text())
    running = [key for key, entry in written["hooks"].items() if entry is not None]
    assert running == ["IterTimerHook", "LogHook", "ExportHook"]
    assert written["hooks"]["LogHook"]["priority"] == 60 and written["hooks"]["LogHook"]["ema_factor"] == 0.4
    assert list(trainer.hooks) == running
    assert written["hooks"]["MetricsHook"] is None  # a default this config does not run


def test_example_custom_hook_config_trains_with_all_builtin_outputs(tmp_path: Path, synthetic_cache, capsys) -> None:
    examples = tmp_path / "configs"
    shutil.copytree(REPO / "configs", examples)
    exp_dir = tmp_path / "run"
    config = examples / "examples" / "custom_hook.yaml"
    overrides = [*_tiny_overrides(tmp_path, synthetic_cache, exp_dir), "hooks.GaussianCountHook.every=2"]
    assert main(["train", "--config", str(config), *overrides]) == 0, capsys.readouterr().err
    assert (exp_dir / "gaussian_counts.csv").read_text().splitlines()[0] == "step,num_gaussians"
    assert len((exp_dir / "gaussian_counts.csv").read_text().splitlines()) == 1 + 3  # steps 2, 4, 6
    assert (exp_dir / "checkpoints" / "last.pt").is_file()
    assert (exp_dir / "metrics.json").is_file()
    assert (exp_dir / "point_cloud.ply").is_file()
    assert (
        "on 7 views at 32x24 (data.factor 1; images generated; 2 for validation)" in (exp_dir / "train.log").read_text()
    )
