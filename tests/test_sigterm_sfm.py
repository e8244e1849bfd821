"""Issue 51: SIGTERM during structure from motion printed pycolmap's native stack trace (its logging library answers
SIGTERM with one) instead of gsrecon's one line and exit 143; Ctrl-C waited for the native stage to end."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("pycolmap") is None, reason="pycolmap not installed")

IN_NATIVE_WORK = """
import os, shutil, signal, sys
from pathlib import Path
from gsrecon.data.prepare.sfm import exit_on_signal, import_pycolmap, remove_partial
pycolmap = import_pycolmap("a test")
pycolmap.logging.minloglevel = pycolmap.logging.ERROR
partial = Path(sys.argv[1])
partial.mkdir()
with exit_on_signal("structure from motion", cleanup=lambda: remove_partial(partial)):
    os.kill(os.getpid(), int(sys.argv[3]))
    pycolmap.extract_features(partial / "database.db", sys.argv[2])  # native work, minutes on a large capture
print("the block ended")
"""


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_sigterm_after_pycolmap_is_imported_gets_no_native_stack_trace() -> None:
    script = "import os, signal; from gsrecon.data.prepare.sfm import import_pycolmap; import_pycolmap('a test'); "
    result = _run(script + "os.kill(os.getpid(), signal.SIGTERM); print('alive')")
    assert result.returncode == -signal.SIGTERM and result.stdout == "" and result.stderr == "", result


@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGTERM, 143), pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow)]
)
def test_a_signal_during_native_structure_from_motion_is_one_line_its_exit_code_and_no_partial_output(
    tmp_path, signum: signal.Signals, code: int
) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    result = _run(IN_NATIVE_WORK, str(tmp_path / "partial"), str(photos), str(int(signum)))
    assert result.returncode == code and result.stdout == "", result
    assert result.stderr == f"stopped by {signum.name} during structure from motion; its partial output removed\n"
    assert not (tmp_path / "partial").exists()


@pytest.mark.slow
def test_sigterm_while_train_data_runs_structure_from_motion_on_photos(shared_data: Path, tmp_path: Path) -> None:
    """End to end: ``gsrecon train --data <photos>``, SIGTERM once the features stage has begun."""
    photos = tmp_path / "photos"
    photos.mkdir()
    for photo in sorted((shared_data / "statuette_colmap" / "images").iterdir())[:8]:
        shutil.copy(photo, photos / photo.name)
    env = {**os.environ, "GSRECON_CACHE": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "gsrecon", "train", "--data", str(photos), f"exp_dir={tmp_path / 'run'}"]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as run:
        lines = []
        for line in run.stdout:
            lines.append(line)
            if "features:" in line:
                run.send_signal(signal.SIGTERM)
                break
        lines += run.stdout.readlines()
        code = run.wait(timeout=120)
    output = "".join(lines)
    assert code == 143 and "stopped by SIGTERM during structure from motion" in lines[-1], output
    assert "***" not in output and "stack trace" not in output
    assert not [p for p in (tmp_path / "cache").rglob("*partial*")]
