"""Files from elsewhere never run code or hang gsrecon: checkpoints' imports, YAML bombs, interpolation, plugins."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import write_yaml

from gsrecon.cli import main

IMPORT_MARKER_PLUGIN = "from pathlib import Path\nPath({marker!r}).write_text('imported')\n"


def _trained_checkpoint(make_trainer) -> Path:
    trainer = make_trainer(max_steps=3)
    trainer.train()
    return trainer.exp_dir / "checkpoints" / "last.pt"


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_export_never_imports_what_a_checkpoint_names(make_trainer, tmp_path: Path, capsys) -> None:
    marker = tmp_path / "marker"
    plugin = tmp_path / "x" / "helper.py"
    plugin.parent.mkdir()
    plugin.write_text(IMPORT_MARKER_PLUGIN.format(marker=str(marker)))
    checkpoint = torch.load(_trained_checkpoint(make_trainer), weights_only=True)
    checkpoint["config"]["imports"] = [str(plugin)]
    torch.save(checkpoint, tmp_path / "evil.pt")
    assert main(["export", "--checkpoint", str(tmp_path / "evil.pt"), "--out", str(tmp_path / "o.ply")]) == 0
    assert (tmp_path / "o.ply").is_file()
    assert not marker.exists(), "a file named in the checkpoint was imported"
    # The user may trust it explicitly.
    args = [
        "export",
        "--checkpoint",
        str(tmp_path / "evil.pt"),
        "--imports",
        str(plugin),
        "--out",
        str(tmp_path / "p.ply"),
    ]
    assert main(args) == 0
    assert marker.read_text() == "imported"


def test_a_dataset_from_the_runs_plugins_is_named_with_how_to_import_it(make_trainer, tmp_path: Path, capsys) -> None:
    checkpoint = torch.load(_trained_checkpoint(make_trainer), weights_only=True)
    checkpoint["config"]["imports"] = ["my_datasets.py"]
    checkpoint["config"]["data"]["dataset"] = "my_dataset"
    del checkpoint["config"]["data"]["synthetic"]  # its reader's own section would be data.my_dataset
    torch.save(checkpoint, tmp_path / "custom.pt")
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(tmp_path / "custom.pt"), "--out", str(tmp_path / "eval")]) == 2
    err = _one_line(capsys)
    assert "data.dataset" in err and "unknown dataset 'my_dataset'" in err
    assert "never imports from a checkpoint" in err and "--imports" in err


def _run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gsrecon", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_yaml_alias_bomb_fails_fast(tmp_path: Path) -> None:
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for previous, name in zip("abcdef", "bcdefg"):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{previous}"] * 9) + "]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")  # under 600 bytes, 9^7 = 4.8 million values when expanded
    assert bomb.stat().st_size < 600
    result = _run_cli("train", "--config", str(bomb), f"exp_dir={tmp_path / 'run'}")
    assert result.returncode == 2, result.stderr
    assert "expands to more than 100000 values" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # 4 s on a quiet 2-core machine: CI's slow run (the default run stays under 5 min)
def test_checkpoint_with_a_deeply_shared_config_fails_fast(make_trainer, tmp_path: Path) -> None:
    checkpoint = torch.load(_trained_checkpoint(make_trainer), weights_only=True)
    nested: list = [0] * 10
    for _ in range(8):
        nested = [nested] * 10  # 10^9 leaves, a few hundred bytes when pickled
    checkpoint["config"]["data"]["extra"] = nested
    torch.save(checkpoint, tmp_path / "shared.pt")
    result = _run_cli("export", "--checkpoint", str(tmp_path / "shared.pt"), "--out", str(tmp_path / "o.ply"))
    assert result.returncode == 2, result.stderr
    assert "shared.pt (stored config)" in result.stderr and "expands to more than" in result.stderr
    assert not (tmp_path / "o.ply").exists()


def test_interpolation_is_refused_naming_the_key(make_config, tmp_path: Path, capsys) -> None:
    config = make_config()
    config["exp_dir"] = "${oc.env:HOME}/run"
    path = write_yaml(tmp_path / "env.yaml", config)
    assert main(["train", "--config", str(path)]) == 2
    err = _one_line(capsys)
    assert "env.yaml" in err and "key 'exp_dir'" in err and "interpolation is not supported" in err


def test_a_plugin_calling_sys_exit_is_one_line_and_exit_2(make_config, tmp_path: Path, capsys) -> None:
    (tmp_path / "quitter.py").write_text("import sys\nsys.exit(3)\n")
    path = write_yaml(tmp_path / "c.yaml", make_config(imports=["quitter.py"]))
    assert main(["train", "--config", str(path)]) == 2
    err = _one_line(capsys)
    assert "quitter.py" in err and "sys.exit(3)" in err
