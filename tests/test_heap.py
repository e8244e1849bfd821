"""The CLI's glibc heap setting: large blocks stay separate mappings, returned to the system when freed."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

# `blocks_mapped_by_a_4mib_malloc()`: how many separately mapped blocks glibc adds for a 4 MiB malloc made
# after a 30 MiB block was freed (which raises glibc's own threshold to 30 MiB): 0 by default, 1 after the setting.
_PROBE = """
import ctypes, sys

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2

def blocks_mapped_by_a_4mib_malloc():
    libc.free(libc.malloc(30 << 20))
    before = libc.mallinfo2().hblks
    libc.malloc(4 << 20)
    return libc.mallinfo2().hblks - before
"""


def _probe(mode: str, **env: str) -> list[str]:
    """Whether `unmap_large_blocks` applied (None: not called), and `blocks_mapped_by_a_4mib_malloc`."""
    code = _PROBE + (
        "from gsrecon.heap import unmap_large_blocks\n"
        f"applied = unmap_large_blocks() if {mode == 'set'} else None\n"
        "print(applied, blocks_mapped_by_a_4mib_malloc())\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, check=True
    )
    return run.stdout.split()


glibc_only = pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="needs glibc >= 2.33 (mallinfo2)")


@glibc_only
def test_a_large_block_is_mapped_on_its_own_after_the_setting():
    assert _probe("keep") == ["None", "0"]  # glibc's default: served from the heap, which keeps it when freed
    assert _probe("set") == ["True", "1"]


@glibc_only
def test_a_threshold_the_user_chose_is_left_alone():
    assert _probe("set", MALLOC_MMAP_THRESHOLD_=str(64 << 20)) == ["False", "0"]


@glibc_only
def test_every_gsrecon_command_runs_with_the_setting(tmp_path):
    # A plugin named by the config runs inside the command, after the CLI has set the heap up.
    (tmp_path / "probe.py").write_text(
        _PROBE + "open('mapped.txt', 'w').write(str(blocks_mapped_by_a_4mib_malloc()))\n"
    )
    (tmp_path / "run.yaml").write_text("_base_: {}\nimports: [probe.py]\n".format(CONFIGS / "synthetic.yaml"))
    subprocess.run([sys.executable, "-m", "gsrecon", "hooks", "--config", "run.yaml"], cwd=tmp_path, check=True)
    assert (tmp_path / "mapped.txt").read_text() == "1"


@glibc_only
def test_main_called_in_process_leaves_the_allocator_alone(tmp_path):
    """The setting belongs to the `gsrecon` process: a test or script calling `main()` keeps its own allocator."""
    code = _PROBE + (
        "from gsrecon.cli import main\n"
        f"assert main(['hooks', '--config', {str(CONFIGS / 'synthetic.yaml')!r}]) == 0\n"
        "print(blocks_mapped_by_a_4mib_malloc())\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert run.stdout.split()[-1] == "0"


@pytest.mark.slow  # trains in a subprocess: 6 s on a quiet machine
@glibc_only
def test_the_command_says_what_it_did_to_the_heap_with_debug(tmp_path):
    command = [sys.executable, "-m", "gsrecon", "hooks", "--config", str(CONFIGS / "synthetic.yaml")]
    applied = subprocess.run([*command, "--debug"], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert "heap: allocations of 1 MiB or more are mapped on their own" in applied.stderr
    quiet = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, check=True)
    assert "heap:" not in quiet.stderr
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(64 << 20)}
    chosen = subprocess.run([*command, "--debug"], capture_output=True, text=True, cwd=tmp_path, env=env, check=True)
    assert "heap: left as MALLOC_MMAP_THRESHOLD_ sets it" in chosen.stderr
