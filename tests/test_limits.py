"""Issue 51: the limits real machines set on a process (``ulimit -v``, ``ulimit -f``, a cgroup's memory), each met with
one line naming the key or the limit and exit 2."""

from __future__ import annotations

import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from conftest import write_yaml

from gsrecon.cli import main
from gsrecon.config import ConfigError
from gsrecon.data.prefetch import host_memory_room
from gsrecon.engine.checkpoints import CheckpointWriteError, save_checkpoint
from gsrecon.hooks import Hook
from gsrecon.model.views.base import VIEW_SECTIONS, build_views
from gsrecon.model.views.bilateral_grid import BilateralGridAppearance
from gsrecon.registry import VIEW_REGISTRY


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GSRECON_CACHE", str(tmp_path / "cache"))


@contextmanager
def soft_limit(which: int, value: int) -> Iterator[None]:
    """This process under the soft limit ``which`` = ``value`` inside the block."""
    soft, hard = resource.getrlimit(which)
    resource.setrlimit(which, (value, hard))
    try:
        yield
    finally:
        resource.setrlimit(which, (soft, hard))


def _mapped_bytes(field: str = "VmSize") -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith(f"{field}:")).split()[1]) * 1024


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in captured.err, captured
    return lines[0]


@pytest.mark.parametrize(
    ("limit", "field", "bound"),
    [
        (resource.RLIMIT_AS, "VmSize", "the process's address-space limit (ulimit -v)"),
        (resource.RLIMIT_DATA, "VmData", "the process's data limit (ulimit -d)"),
    ],
)
def test_the_memory_room_is_capped_by_the_process_limits(limit: int, field: str, bound: str) -> None:
    with soft_limit(limit, _mapped_bytes(field) + 2**30):
        room = host_memory_room()
    assert room[0] <= 2**30 and room[1] == bound


def test_a_bilateral_grid_beyond_ulimit_v_is_one_line_naming_the_key_and_the_limit(make_config, tmp_path, capsys):
    """It passed the check (the machine's free memory) and died with a MemoryError traceback, exit 1."""
    config = make_config(views={"appearance": {"name": "bilateral_grid", "shape": [192, 192, 64]}})
    path = write_yaml(tmp_path / "c.yaml", config)
    with soft_limit(resource.RLIMIT_AS, _mapped_bytes() + 2 * 2**30):
        code = main(["train", "--config", str(path)])
    line = _one_error_line(capsys)
    assert code == 2 and "key 'views.appearance'" in line and "shape [192, 192, 64]" in line, line
    assert "(the process's address-space limit (ulimit -v))" in line


class HungryModule(BilateralGridAppearance):
    """A per-view module whose parameters no machine holds (what passes every check and fails to allocate)."""

    def __init__(self, cfg: BilateralGridAppearance.Config, train_names: list[str]) -> None:
        super().__init__(cfg, train_names)
        self.huge = torch.nn.Parameter(torch.empty(2**42))  # 16 TiB


def test_an_allocation_that_fails_past_the_checks_is_one_line_naming_its_key() -> None:
    VIEW_REGISTRY.register("hungry")(HungryModule)
    entry = {"name": "hungry", **vars(BilateralGridAppearance.Config())}
    resolved = {**{section: {"name": "none"} for section in VIEW_SECTIONS}, "views": {"glutton": entry}}
    with pytest.raises(ConfigError, match=r"key 'views.glutton': out of memory for its 2 training images \(.*allocat"):
        build_views(resolved, ["a", "b"], torch.device("cpu"))


def test_a_checkpoint_refused_by_the_file_size_limit_names_it_not_the_disk(tmp_path: Path) -> None:
    """It said "free some space" with 70 GB free, and dropped the cause ("File too large")."""
    checkpoint = {"params": {"means": torch.zeros(100_000, 3)}}  # 1.1 MiB
    with soft_limit(resource.RLIMIT_FSIZE, 256 * 1024), pytest.raises(CheckpointWriteError) as raised:
        save_checkpoint(checkpoint, tmp_path / "ckpt.pt")
    message = str(raised.value)
    assert "File too large" in message and "file-size limit (ulimit -f) is 0.2 MiB" in message, message
    assert "free some space" not in message and not list(tmp_path.iterdir())  # nothing half-written left


class HungryHook(Hook):
    """A plugin's hook whose allocation fails part way through training."""

    def after_train_iter(self, trainer) -> None:
        torch.empty(2**42)  # 16 TiB


def test_an_allocation_that_fails_in_a_plugin_is_one_line_with_the_room_the_process_had(
    hook_registry, make_config, tmp_path, capsys
) -> None:
    hook_registry.register()(HungryHook)
    path = write_yaml(tmp_path / "c.yaml", make_config(hooks={"HungryHook": {}}))
    code = main(["train", "--config", str(path)])
    line = _one_error_line(capsys)
    assert code == 2 and "out of memory (" in line and "can't allocate memory" in line, line
    assert "GiB more (" in line and "a bug in gsrecon" not in line
