"""The command line: one red line and exit code 2 for bad input; training and reproducing a run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import write_yaml

from gsrecon.cli import main
from gsrecon.engine.trainer import HookError


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["max_steps=0"], "max_steps"),
        (["model.sh_degre=1"], "model.sh_degre"),
        (["max_steps=many"], "max_steps"),
        (["hooks.NoSuchHook.every=2"], "unknown hook 'NoSuchHook'"),
        (["writers.0.name=NoSuchWriter"], "known writers: JsonlWriter, TensorboardWriter"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, make_config, tmp_path: Path, overrides, message) -> None:
    config = write_yaml(tmp_path / "c.yaml", make_config())
    code, err = _run(capsys, "train", "--config", str(config), *overrides)
    assert code == 2
    assert (message in err and "c.yaml" in err) or message in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2  # one message (rich may wrap it)


def test_unknown_flags_are_still_rejected(capsys, make_config, tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "c.yaml", make_config())
    with pytest.raises(SystemExit) as info:
        main(["train", "--config", str(config), "--bogus"])
    assert info.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_debug_shows_the_traceback(make_config, tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "c.yaml", make_config())
    with pytest.raises(ValueError, match="max_steps"):
        main(["train", "--config", str(config), "max_steps=0", "--debug"])


_BROKEN_HOOK = """
from gsrecon.hooks import Hook
from gsrecon.registry import HOOK_REGISTRY


@HOOK_REGISTRY.register()
class BrokenHook(Hook):
    def after_train_iter(self, trainer):
        if trainer.step == 2:
            raise {error}("bug in a plugin")
"""


@pytest.mark.parametrize("error", ["ValueError", "KeyError", "RuntimeError"])
def test_a_bug_in_a_hook_exits_1_naming_the_hook_and_point(capsys, make_config, tmp_path: Path, error: str) -> None:
    (tmp_path / "broken.py").write_text(_BROKEN_HOOK.format(error=error))
    config = write_yaml(tmp_path / "c.yaml", make_config(max_steps=3, imports=["broken.py"]))
    code, err = _run(capsys, "train", "--config", str(config), "hooks.BrokenHook={}")
    assert code == 1
    assert "BrokenHook.after_train_iter" in err and "bug in a plugin" in err and "--debug" in err
    assert "Traceback" not in err
    with pytest.raises(HookError, match="BrokenHook.after_train_iter"):
        main(["train", "--config", str(config), "hooks.BrokenHook={}", "--overwrite", "--debug"])


_POISON_HOOK = """
import torch

from gsrecon.hooks import Hook
from gsrecon.registry import HOOK_REGISTRY


@HOOK_REGISTRY.register()
class PoisonHook(Hook):
    def before_train_iter(self, trainer):
        if trainer.step == 2:
            with torch.no_grad():
                trainer.model.params["sh0"].fill_(float("nan"))
"""


def test_a_non_finite_loss_a_hook_finds_exits_2(capsys, make_config, tmp_path: Path) -> None:
    """A diverged run is a setting to change (learning rates), reported on purpose by CheckInvalidLossHook."""
    (tmp_path / "poison.py").write_text(_POISON_HOOK)
    config = write_yaml(tmp_path / "c.yaml", make_config(max_steps=4, imports=["poison.py"]))
    code, err = _run(
        capsys, "train", "--config", str(config), "hooks.PoisonHook={}", "hooks.CheckInvalidLossHook.interval=1"
    )
    assert code == 2, err
    assert "CheckInvalidLossHook.after_train_iter: the loss is nan at step 3" in err and "Traceback" not in err


def test_missing_config(capsys, tmp_path: Path) -> None:
    code, err = _run(capsys, "train", "--config", str(tmp_path / "nope.yaml"))
    assert code == 2 and "config file not found" in err and "nope.yaml" in err


def test_refuses_to_clobber_a_run_unless_overwrite(capsys, make_config, tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "c.yaml", make_config(max_steps=2))
    assert _run(capsys, "train", "--config", str(config))[0] == 0
    metrics = (tmp_path / "run" / "metrics.json").read_text()
    code, err = _run(capsys, "train", "--config", str(config))
    assert code == 2 and "already holds a run" in err and "--resume" in err
    assert (tmp_path / "run" / "metrics.json").read_text() == metrics  # nothing lost
    # --overwrite with a config that cannot be built (bad data) keeps the previous run as well.
    code, err = _run(capsys, "train", "--config", str(config), "--overwrite", "data.synthetic.width=-1")
    assert code == 2 and "width" in err
    assert (tmp_path / "run" / "metrics.json").read_text() == metrics
    assert _run(capsys, "train", "--config", str(config), "--overwrite")[0] == 0


def test_overwrite_never_deletes_folders_that_are_not_runs(capsys, make_config, tmp_path: Path) -> None:
    folder = tmp_path / "project"
    (folder / "photos").mkdir(parents=True)
    (folder / "photos" / "a.jpg").write_bytes(b"precious")
    config = write_yaml(folder / "config.yaml", {**make_config(max_steps=1), "exp_dir": str(folder)})
    code, err = _run(capsys, "train", "--config", str(config), "--overwrite")
    assert code == 2 and "is not empty and is not a gsrecon run folder" in err
    assert (folder / "photos" / "a.jpg").read_bytes() == b"precious"


def test_resume_flag_continues_and_config_yaml_reproduces_the_run(capsys, make_config, tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "c.yaml", make_config(max_steps=4))
    assert _run(capsys, "train", "--config", str(config))[0] == 0
    code, _ = _run(capsys, "train", "--config", str(config), "--resume", "max_steps=6")  # overrides after flags
    assert code == 0
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["step"] == 6

    first = write_yaml(tmp_path / "d.yaml", make_config("orig", max_steps=4))
    assert _run(capsys, "train", "--config", str(first))[0] == 0
    resolved = tmp_path / "orig" / "config.yaml"
    assert _run(capsys, "train", "--config", str(resolved), f"exp_dir={tmp_path / 'copy'}")[0] == 0
    original = json.loads((tmp_path / "orig" / "metrics.json").read_text())
    copy = json.loads((tmp_path / "copy" / "metrics.json").read_text())
    assert copy["mean"] == original["mean"]


@pytest.mark.slow  # 28 s on the 2 loaded cores: CI's slow run (the default run stays under 5 min)
def test_python_dash_m_entry_point(make_config, tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "c.yaml", make_config(max_steps=1))
    result = subprocess.run(
        [sys.executable, "-m", "gsrecon", "train", "--config", str(config)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "finished 1 steps" in result.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "gsrecon", "train", "--config", str(config), "seed=x"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "seed" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without CUDA")
def test_gsplat_without_cuda_is_one_line_with_the_way_out(capsys, make_config, tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "c.yaml", make_config())
    code, err = _run(capsys, "train", "--config", str(config), "renderer.name=gsplat")
    assert code == 2 and "needs a CUDA GPU" in err and "renderer.name=torch" in err
    assert not (tmp_path / "run").exists()  # nothing was written


@pytest.mark.parametrize(
    "command, default",
    [
        (["train"], None),
        (["hooks"], None),
        (["eval"], "(default: auto)"),
        (["render"], "(default: ellipse)"),
        (["export"], "(default: ply)"),
        (["weights"], None),
        (["data", "colmap"], "(default: SIMPLE_RADIAL)"),
        (["data", "triangulate"], "(default: exhaustive)"),
    ],
)
def test_every_subcommand_help_has_a_description_and_shows_defaults(capsys, command, default) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    usage, description = out.split("\n\n")[:2]
    assert usage.startswith("usage: gsrecon") and len(description.split()) >= 8, out
    assert default is None or default in out
    assert "(default: None)" not in out and "(default: False)" not in out


@pytest.mark.slow  # 17 s on the 2 loaded cores: CI's slow run (the default run stays under 5 min)
def test_training_needs_no_ffmpeg(make_config, tmp_path: Path) -> None:
    """imageio-ffmpeg is for videos only: a run (validation panels, depth colouring, export) trains without it."""
    config = write_yaml(tmp_path / "c.yaml", make_config(max_steps=3))
    no_ffmpeg = "import sys; sys.modules['imageio_ffmpeg'] = None; from gsrecon.cli import main; sys.exit(main())"
    result = subprocess.run(
        [sys.executable, "-c", no_ffmpeg, "train", "--config", str(config)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "finished 3 steps" in result.stdout


@pytest.mark.slow  # 13 s on the 2 loaded cores: CI's slow run (the default run stays under 5 min)
def test_the_package_needs_imageio_only_for_its_tests() -> None:
    """imageio is a dev dependency: no gsrecon module imports it (videos go through imageio-ffmpeg)."""
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith("imageio>") or dep == "imageio" for dep in project["dependencies"])
    assert any(dep.startswith("imageio") for dep in project["optional-dependencies"]["dev"])
    import_all = (
        "import importlib, pkgutil, sys; sys.modules['imageio'] = None; import gsrecon\n"
        "for module in pkgutil.walk_packages(gsrecon.__path__, 'gsrecon.'):\n"
        "    if module.name == 'gsrecon.__main__':\n"
        "        continue\n"
        "    try:\n"
        "        importlib.import_module(module.name)\n"
        "    except ModuleNotFoundError as exc:\n"
        "        if exc.name == 'imageio':\n"
        "            raise\n"  # other optional packages (viser) may be absent here
    )
    result = subprocess.run([sys.executable, "-c", import_all], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
