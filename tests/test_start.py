"""A process's start: ``gsrecon train`` never imports ``torch._dynamo`` (1.6-2 s of a start on one CPU core, imported
by every ``torch.optim`` optimiser's first call and by torchvision), with any built-in optimiser, schedule or
metric of a default run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from capture_layouts import ns_process_data

from gsrecon.kernels.build import missing_toolchain

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# Runs the CLI and says on its last line which of the heavy modules the process imported.
_TRAIN = (
    "import sys\n"
    "from gsrecon.cli import main\n"
    "code = main()\n"
    "print('imported:', [m for m in ('torch._dynamo', 'torchvision') if m in sys.modules])\n"
    "sys.exit(code)\n"
)


def _train(*argv: str) -> str:
    """The output of ``gsrecon train *argv`` in a fresh interpreter; fails on a non-zero exit."""
    command = [sys.executable, "-c", _TRAIN, "train", *argv, "num_threads=1", "writers=[]"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.slow  # 4 s on a quiet 2-core machine: CI's slow run (the default run stays under 5 min)
def test_a_run_with_every_optimiser_schedule_and_metric_never_imports_dynamo(tmp_path: Path) -> None:
    """The synthetic scene's config with the per-view modules (the poses' row-wise Adam and schedule, the colours'),
    test-time pose fitting (the fits' Adam), validation with LPIPS and a checkpoint."""
    renderer = "torch" if missing_toolchain() else "cpu"
    out = _train(
        "--config", str(CONFIGS / "synthetic.yaml"), f"renderer.name={renderer}", f"exp_dir={tmp_path / 'run'}",
        f"data.synthetic.cache_dir={tmp_path / 'cache'}", "data.synthetic.num_views=9", "data.synthetic.width=32",
        "data.synthetic.height=32", "max_steps=3", "val_interval=3", "views.pose_opt.name=se3",
        "views.pose_opt.eval=fit", "views.pose_opt.eval_steps=2", "views.appearance.name=affine",
        "hooks.CheckPointHook.interval=2",
    )  # fmt: skip
    assert "finished 3 steps" in out
    assert "imported: []" in out


@pytest.mark.slow
def test_the_phone_and_statuette_configs_never_import_dynamo(tmp_path: Path, shared_data: Path) -> None:
    capture = ns_process_data(tmp_path / "capture", tmp_path / "cache")
    phone = _train(
        "--config", str(CONFIGS / "phone.yaml"), f"data.path={capture}", f"exp_dir={tmp_path / 'phone'}",
        "renderer.name=torch", "max_steps=2", "val_interval=2", "data.factor=1",
    )  # fmt: skip
    assert "finished 2 steps" in phone and "imported: []" in phone
    statuette = _train(
        "--config", str(CONFIGS / "statuette.yaml"), f"data.path={shared_data / 'statuette_colmap'}",
        f"exp_dir={tmp_path / 'statuette'}", "max_steps=2", "val_interval=2",
    )  # fmt: skip
    assert "finished 2 steps" in statuette and "imported: []" in statuette
