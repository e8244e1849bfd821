"""scripts/bench_sweep.py: an interrupted sweep continues where it stopped, but never passes off a row of another
commit or another recipe as one of its own runs (the defect: a sweep into a folder of an earlier sweep reused its
rows under the same labels)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import script_module

REPO = Path(__file__).resolve().parents[1]
sweep = script_module("bench_sweep")

SCENE = "synthetic=configs/synthetic.yaml data.synthetic.width=32"
VARIANT = "fast=max_steps=3"


def write_row(out: Path, **changes: str) -> None:
    """One finished run of ``SCENE`` / ``VARIANT``, 5 steps, seed 0, as this checkout would record it."""
    row = {"scene": "synthetic", "variant": "fast", "length": 5, "seed": 0, "psnr": 20.0, "ssim": 0.8, "lpips": 0.1,
           "gaussians": 100, "cpu_seconds": 1.0, "load1": 0.5, "depth_abs_rel": "", "psnr_colour_fit": "",
           "commit": sweep.code_version(),
           "recipe": "configs/synthetic.yaml data.synthetic.width=32 max_steps=3"}  # fmt: skip
    row.update(changes)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "runs.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(row))
        writer.writeheader()
        writer.writerow(row)


def run_sweep(out: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO / "scripts" / "bench_sweep.py"), "--out", str(out), "--lengths", "5"]
    command += ["--seeds", "0", "--scene", SCENE, "--variant", VARIANT]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300)


@pytest.mark.slow  # 12 s on the 2 loaded cores: CI's slow run (the default run stays under 5 min)
def test_a_run_already_recorded_by_this_commit_and_recipe_is_not_run_again(tmp_path: Path) -> None:
    write_row(tmp_path)
    result = run_sweep(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "steps seed 0:" not in result.stdout  # nothing trained
    assert "| synthetic | 5 | fast | 1 | 20.00 ± 0.00 |" in result.stdout
    assert not (tmp_path / "work").exists()


@pytest.mark.slow  # 37 s on the 2 loaded cores: CI's slow run (the default run stays under 5 min)
@pytest.mark.parametrize(
    "changes, said",
    [
        ({"commit": "0000000"}, "on 0000000"),
        ({"recipe": "configs/synthetic.yaml max_steps=4"}, "as configs/synthetic.yaml max_steps=4"),
        ({"commit": "", "recipe": ""}, "on an unrecorded commit"),
    ],
)
def test_a_row_of_another_commit_or_recipe_under_the_same_labels_is_refused(
    tmp_path: Path, changes: dict[str, str], said: str
) -> None:
    write_row(tmp_path, **changes)
    result = run_sweep(tmp_path)
    assert result.returncode == 2
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and "synthetic fast 5 steps seed 0" in err and said in err and "--out" in err
    assert not (tmp_path / "work").exists()  # refused before training anything


@pytest.mark.slow  # 11 s on the 2 loaded cores: CI's slow run (the default run stays under 5 min)
def test_a_runs_file_without_the_commit_and_recipe_columns_is_refused(tmp_path: Path) -> None:
    (tmp_path / "runs.csv").write_text("scene,variant,length,seed,psnr\nsynthetic,other,5,0,20.0\n")
    result = run_sweep(tmp_path)
    assert result.returncode == 2 and "older bench_sweep.py" in result.stderr and "--out" in result.stderr
    assert not (tmp_path / "work").exists()


def test_a_variant_keeps_its_colour_in_every_panel(tmp_path: Path) -> None:
    """The plot's panels list the variants in one order (a colour each), whichever order a panel's runs came in."""

    def row(length: int, variant: str, psnr: float) -> dict:
        return {"scene": "s", "length": float(length), "variant": variant, "cpu_seconds": 10.0, "psnr": psnr}

    rows = [row(2000, "default", 20.0), row(2000, "mcmc", 21.0), row(7000, "mcmc", 22.0), row(7000, "multiview", 23.0)]
    panels = sweep.panel_points(rows)
    assert [list(curves) for curves in panels.values()] == [["default", "mcmc", "multiview"]] * 2
    assert panels[("s", 7000)] == {"default": [], "mcmc": [(10.0, 22.0)], "multiview": [(10.0, 23.0)]}
    paths = sweep.plot_runs(rows, tmp_path)
    assert [p.name for p in paths] == ["psnr_vs_cpu_s_2000.png", "psnr_vs_cpu_s_7000.png", "psnr_vs_cpu.png"]
    assert all(p.stat().st_size > 0 for p in paths)
