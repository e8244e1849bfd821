"""Export formats from EXPORT_REGISTRY: the documented list, formats from plugins, formats that need the views."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import write_yaml

from gsrecon.cli import main
from gsrecon.engine.checkpoints import load_checkpoint_file
from gsrecon.export import ExportContext, ExportFormat, export_gaussians
from gsrecon.registry import EXPORT_REGISTRY, Registry
from gsrecon.sh import sh_to_rgb

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "configs" / "examples" / "xyz_export.py"


@pytest.fixture(autouse=True)
def export_registry() -> Registry:
    """The export registry, scoped to one test: formats a test (or a plugin it imports) registers are undone."""
    with EXPORT_REGISTRY.scoped() as registry:
        yield registry


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    """A copy of the example plugin (a new file per test: a file already imported is not imported again)."""
    return Path(shutil.copy(EXAMPLE, tmp_path / "xyz_export.py"))


@pytest.fixture
def run(make_trainer) -> Path:
    """A trained tiny run folder."""
    trainer = make_trainer(max_steps=3)
    trainer.train()
    return trainer.exp_dir


def _documented_formats() -> dict[str, list[str]]:
    """``{format: [file endings]}`` from the table of the "Export formats" section of docs/outputs.md."""
    page = (REPO / "docs" / "outputs.md").read_text()
    section = re.search(r"^## Export formats\n(.*?)^## ", page, re.S | re.M)
    assert section, "docs/outputs.md has no '## Export formats' section"
    rows = re.findall(r"^\| `(\w+)` \| (.+?) \|", section.group(1), re.M)
    return {name: re.findall(r"`([^`]+)`", endings) for name, endings in rows}


def test_the_docs_list_exactly_the_registered_formats_with_their_file_endings() -> None:
    listed = _documented_formats()
    assert sorted(listed) == EXPORT_REGISTRY.names()
    for name, endings in listed.items():
        assert tuple(endings) == EXPORT_REGISTRY.get(name).suffixes, name


@pytest.mark.slow  # 6 s on a quiet 2-core machine: CI's slow run (the default run stays under 5 min)
def test_export_help_lists_the_registered_formats_without_slowing_other_commands(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for name in EXPORT_REGISTRY.names():
        entry = EXPORT_REGISTRY.get(name)
        assert f"{name} ({' or '.join(entry.suffixes)}): {entry.summary().rstrip('.')}" in help_text
    # Building the parser (what every command does) imports none of the formats' code.
    check = "import sys; from gsrecon.cli import build_parser; build_parser(); print('gsrecon.export' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


def test_example_plugin_format_from_the_cli(run: Path, plugin: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "scene.xyz"
    args = ["export", "--exp-dir", str(run), "--format", "xyz", "--out", str(out)]
    assert main(args) == 2  # a checkpoint's imports are never imported: the format is unknown without --imports
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "unknown export format 'xyz'" in err
    assert "known export formats: compressed_ply, glb, lod, mesh, ply, sog, splat, spz" in err
    assert not out.exists()

    assert main([*args, "--imports", str(plugin)]) == 0, capsys.readouterr().err
    params = load_checkpoint_file(run / "checkpoints" / "last.pt")["params"]
    rows = np.loadtxt(out)  # [N, 6]
    assert rows.shape == (params["means"].shape[0], 6)
    np.testing.assert_allclose(rows[:, :3], params["means"].numpy(), atol=1e-6)
    rgb = (sh_to_rgb(params["sh0"][:, 0]).clamp(0, 1) * 255).round().numpy()
    np.testing.assert_array_equal(rows[:, 3:], rgb)


def test_example_plugin_format_from_a_runs_imports(make_config, plugin: Path, tmp_path: Path, capsys) -> None:
    config = write_yaml(tmp_path / "xyz.yaml", make_config("xyz", max_steps=3, imports=[str(plugin)]))
    hook = "hooks.ExportXyz={name: ExportHook, path: scene.xyz, format: xyz}"
    assert main(["train", "--config", str(config), hook]) == 0, capsys.readouterr().err
    params = load_checkpoint_file(tmp_path / "xyz" / "checkpoints" / "last.pt")["params"]
    np.testing.assert_allclose(np.loadtxt(tmp_path / "xyz" / "scene.xyz")[:, :3], params["means"].numpy(), atol=1e-6)


def test_an_unknown_hook_format_names_the_key_and_the_known_formats(make_config, tmp_path: Path, capsys) -> None:
    config = write_yaml(tmp_path / "bad.yaml", make_config("bad", max_steps=3))
    assert main(["train", "--config", str(config), "hooks.ExportHook.format=spx"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "key 'hooks.ExportHook'" in err, err
    assert "unknown export format 'spx' (did you mean 'spz'?); known export formats:" in err
    assert not (tmp_path / "bad").exists()


class _ViewAlphas(ExportFormat):
    """Test format: each training view's name and mean rendered alpha, as JSON."""

    suffixes = (".json",)
    needs = ("train_batches", "render")

    def write(self, path, params, *, antialiased, context: ExportContext) -> None:
        alphas = {b.names[0]: context.render(b).alpha.mean().item() for b in context.train_batches()}
        path.write_text(json.dumps(alphas))


def test_a_format_that_needs_the_views_and_the_renderer_gets_them_from_the_cli_and_the_hook(
    make_config, tmp_path: Path, capsys
) -> None:
    EXPORT_REGISTRY.register("view_alphas")(_ViewAlphas)
    config = write_yaml(tmp_path / "c.yaml", make_config("run", max_steps=3))
    hook = "hooks.ExportAlphas={name: ExportHook, path: alphas.json, format: view_alphas}"
    assert main(["train", "--config", str(config), hook]) == 0, capsys.readouterr().err
    from_hook = json.loads((tmp_path / "run" / "alphas.json").read_text())
    assert len(from_hook) == 7 and all(0 < alpha <= 1 for alpha in from_hook.values())  # 9 views, 2 for validation

    out = tmp_path / "cli.json"
    assert main(["export", "--exp-dir", str(tmp_path / "run"), "--format", "view_alphas", "--out", str(out)]) == 0
    from_cli = json.loads(out.read_text())
    assert from_cli.keys() == from_hook.keys()
    for name, alpha in from_cli.items():  # the same scene: the final step's Gaussians, at the final SH degree
        assert alpha == pytest.approx(from_hook[name], abs=1e-6), name

    params = load_checkpoint_file(tmp_path / "run" / "checkpoints" / "last.pt")["params"]
    with pytest.raises(ValueError, match="^export format 'view_alphas' needs train_batches and render, which the"):
        export_gaussians(params, tmp_path / "lib.json", "view_alphas")
    assert not (tmp_path / "lib.json").exists()


class _Scaled(ExportFormat):
    """Test format with options: the centres times ``scale``, rounded to ``digits``, as JSON."""

    suffixes = (".json",)

    @dataclass
    class Config:
        scale: float = 1.0
        digits: int = 3

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    def write(self, path, params, *, antialiased, context: ExportContext) -> None:
        centres = (params["means"][:2] * self.cfg.scale).tolist()
        path.write_text(json.dumps([[round(v, self.cfg.digits) for v in row] for row in centres]))


def test_a_plugin_format_takes_its_options_on_the_command_line_as_key_value(run: Path, tmp_path: Path, capsys) -> None:
    EXPORT_REGISTRY.register("scaled")(_Scaled)
    args = ["export", "--exp-dir", str(run), "--format", "scaled"]
    assert main([*args, "--out", str(tmp_path / "one.json")]) == 0, capsys.readouterr().err
    assert main([*args, "--out", str(tmp_path / "two.json"), "scaled.scale=2", "scaled.digits=1"]) == 0
    one, two = (np.array(json.loads((tmp_path / f"{n}.json").read_text())) for n in ("one", "two"))
    np.testing.assert_allclose(two, np.round(one * 2, 1), atol=0.051)
    capsys.readouterr()
    assert main([*args, "--out", str(tmp_path / "bad.json"), "scaled.sharpness=3"]) == 2
    assert "sharpness" in capsys.readouterr().err
    assert main([*args, "--out", str(tmp_path / "bad.json"), "--voxel", "0.1"]) == 2
    assert "options of --format mesh, not scaled" in capsys.readouterr().err
    assert not (tmp_path / "bad.json").exists()
