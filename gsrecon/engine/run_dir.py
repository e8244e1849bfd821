"""The run folder (``exp_dir``): who may write there, what ``--overwrite`` replaces, where checkpoints live.

The folder belongs to the user. gsrecon starts a run only in a new or empty folder or in one of its
own runs (marked by :data:`RUN_MARKER`, which lists what the run writes there), lets one process
train there at a time (:data:`LOCK_FILE`), and on ``--overwrite`` removes only what the previous
run listed, keeping everything else (notes, exports, ``eval/``, renders).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gsrecon.config import ConfigError, save_yaml
from gsrecon.logging.console import Logger
from gsrecon.logging.writers import Writers
from gsrecon.registry import WRITER_REGISTRY

RUN_MARKER = ".gsrecon-run"  # JSON: the top-level entries the run writes; `--overwrite` removes only those
LOCK_FILE = ".gsrecon-lock"  # flock'ed by the training process; says who holds it
CHECKPOINTS = "checkpoints"
# What a run wrote before runs listed their outputs in the marker (gsrecon 0.1 folders).
_LEGACY_OUTPUTS = ("config.yaml", "train.log", CHECKPOINTS, "tb", "scalars.jsonl", "metrics.json", "point_cloud.ply")
_TEMPORARY = re.compile(r"^\..+\.tmp\d+$")  # gsrecon.atomic's temporary files


class RunDir:
    """One run's folder: ``path``, its checkpoint folder, and the rules for starting a run in it."""

    def __init__(self, path: str | Path, source: str = "config") -> None:
        self.path = Path(path)
        self.source = source
        self._lock_fd: int | None = None

    @property
    def checkpoints(self) -> Path:
        """Where the run's checkpoints are written and found (``<exp_dir>/checkpoints``)."""
        return self.path / CHECKPOINTS

    def checkpoint_files(self) -> list[Path]:
        """The run's checkpoints, newest first: ``last.pt``, then ``step_*.pt`` by decreasing step."""
        last = [self.checkpoints / "last.pt"] if (self.checkpoints / "last.pt").is_file() else []
        return last + sorted(self.checkpoints.glob("step_*.pt"), reverse=True)

    def latest_checkpoint(self) -> Path | None:
        """``last.pt`` if present, else the ``step_*.pt`` with the highest step, else None."""
        files = self.checkpoint_files()
        return files[0] if files else None

    def resume_advice(self, extra: str = "") -> str:
        """How to continue the run in this folder (``extra``: more command-line words, e.g. `` partition.only=2``),
        or why it cannot be."""
        if self.latest_checkpoint() is None:
            return "no checkpoint was written (the config has no CheckPointHook), so the run cannot be resumed"
        return resume_command(self.path, extra)

    def check(self, overwrite: bool, resume: bool) -> None:
        """Refuse folders that hold other files, and runs that would be replaced without ``overwrite``."""
        folder = self.path
        if not folder.is_dir() or not any(folder.iterdir()):
            return
        if not (folder / RUN_MARKER).is_file():
            raise ConfigError(
                f"{self.source}: exp_dir '{folder}' is not empty and is not a gsrecon run folder; choose a new or "
                f"empty folder (gsrecon never deletes files it did not write)"
            )
        if resume:
            return
        holder = self._holder()
        if holder is not None:
            raise self._in_use(holder)
        if not overwrite:
            raise ConfigError(
                f"{self.source}: exp_dir '{folder}' already holds a run; continue it with --resume, "
                f"replace it with --overwrite, or set another exp_dir"
            )
        cwd = Path.cwd().resolve()
        for name in self._previous_outputs():
            if cwd.is_relative_to((folder / name).resolve()):
                raise ConfigError(
                    f"{self.source}: --overwrite would delete '{folder / name}', which holds the current folder"
                )

    def prepare(self, overwrite: bool, resume: bool) -> list[str]:
        """Take the folder for this process: create it, lock it, remove temporary files left by a killed
        write, and remove a previous run's outputs (with ``overwrite``). Returns what the replaced run
        left in place (files it did not write)."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.lock()
        for leftover in [*self.path.glob(".*.tmp*"), *self.checkpoints.glob(".*.tmp*")]:
            if _TEMPORARY.match(leftover.name) and leftover.is_file():  # a write killed before its rename
                leftover.unlink()
        kept: list[str] = []
        if overwrite and not resume and (self.path / RUN_MARKER).is_file():
            for name in self._previous_outputs():
                entry = self.path / name
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink(missing_ok=True)
            (self.path / RUN_MARKER).unlink()
            kept = sorted(p.name for p in self.path.iterdir() if p.name != LOCK_FILE)
        self.record_outputs([])
        return kept

    def record_outputs(self, outputs: Iterable[str]) -> None:
        """Add ``outputs`` (paths relative to the folder) to what the marker says this run writes."""
        known = self._previous_outputs() if (self.path / RUN_MARKER).is_file() else []
        names = [_top_level(o) for o in (*known, CHECKPOINTS, *outputs)]
        marker = {"gsrecon_run": 1, "outputs": list(dict.fromkeys(n for n in names if n not in ("", ".", "..")))}
        (self.path / RUN_MARKER).write_text(json.dumps(marker, indent=1) + "\n")

    def open_log(self, overwrite: bool, resume: bool, logger: Logger) -> None:
        """Take the folder (:meth:`prepare`) and send ``logger``'s lines to its ``train.log`` too."""
        kept = self.prepare(overwrite, resume)
        logger.set_log_file(self.path / "train.log")
        if kept:
            logger.info(f"--overwrite replaced the previous run and kept what it did not write: {kept}")

    def open_writers(self, resolved_config: dict[str, Any], hook_outputs: Iterable[str]) -> Writers:
        """Write the run's ``config.yaml``, record what the run writes (``train.log``, the writers' outputs and
        ``hook_outputs``, what the hooks write) and return its writers, which have the config too."""
        writers = Writers([WRITER_REGISTRY.build(w, exp_dir=self.path) for w in resolved_config["writers"]])
        self.record_outputs(["config.yaml", "train.log", *writers.outputs(), *hook_outputs])
        save_yaml(resolved_config, self.path / "config.yaml")
        writers.write_config(resolved_config)
        return writers

    def release(self) -> None:
        """Let another process train in the folder (also happens when this process ends, however it ends)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def lock(self) -> None:
        """Hold the folder's lock until :meth:`release` (or this process ends): no other process trains there, nor
        builds from it meanwhile. Raises ConfigError naming the folder and the holder where another process has it."""
        fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 256).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise self._in_use(holder) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"gsrecon pid {os.getpid()} on {socket.gethostname()}\n".encode())
        self._lock_fd = fd

    def _holder(self) -> str | None:
        """Who holds the folder's lock (``gsrecon pid ... on host``), None when no process does."""
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(self.path / LOCK_FILE, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released when closed
            except BlockingIOError:
                return os.read(fd, 256).decode(errors="replace").strip() or "another process"
            finally:
                os.close(fd)
        return None

    def _in_use(self, holder: str) -> ConfigError:
        """The error for a folder ``holder`` trains in."""
        return ConfigError(
            f"{self.source}: exp_dir '{self.path}' is in use by {holder}; wait for that run to end, stop it, or "
            "choose another exp_dir"
        )

    def _previous_outputs(self) -> list[str]:
        """What the run in this folder listed in its marker (older runs: what gsrecon 0.1 wrote)."""
        with contextlib.suppress(ValueError, OSError):
            marker = json.loads((self.path / RUN_MARKER).read_text())
            outputs = marker["outputs"] if isinstance(marker, dict) else None
            if isinstance(outputs, list) and all(isinstance(o, str) for o in outputs):
                return [o for o in outputs if _top_level(o) == o and o not in (".", "..")]
        return list(_LEGACY_OUTPUTS)


def resume_command(exp_dir: str | Path, extra: str = "") -> str:
    """The advice that continues the run in ``exp_dir`` (``extra``: more command-line words)."""
    return f"continue with: gsrecon train --config {Path(exp_dir) / 'config.yaml'}{extra} --resume"


def _top_level(path: str) -> str:
    """The first component of a path relative to the run folder (an absolute path is not the run's)."""
    parts = Path(path).parts
    return "" if not parts or Path(path).is_absolute() else parts[0]
