"""The run folder (``exp_dir``): who may write there, what ``--overwrite`` replaces, where checkpoints live.

The folder belongs to the user. gsrecon starts a run only in a new or empty folder or in one of its
own runs (marked by :data:`RUN_MARKER`), and replaces a previous run only when asked to.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from gsrecon.config import ConfigError

RUN_MARKER = ".gsrecon-run"  # in every exp_dir gsrecon created; `--overwrite` replaces only such folders


class RunDir:
    """One run's folder: ``path``, its checkpoint folder, and the rules for starting a run in it."""

    def __init__(self, path: str | Path, source: str = "config") -> None:
        self.path = Path(path)
        self.source = source

    @property
    def checkpoints(self) -> Path:
        """Where the run's checkpoints are written and found (``<exp_dir>/checkpoints``)."""
        return self.path / "checkpoints"

    def latest_checkpoint(self) -> Path | None:
        """``last.pt`` if present, else the ``step_*.pt`` with the highest step, else None."""
        if (self.checkpoints / "last.pt").is_file():
            return self.checkpoints / "last.pt"
        steps = sorted(self.checkpoints.glob("step_*.pt"))
        return steps[-1] if steps else None

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
        if not overwrite:
            raise ConfigError(
                f"{self.source}: exp_dir '{folder}' already holds a run; continue it with --resume, "
                f"replace it with --overwrite, or set another exp_dir"
            )
        if Path.cwd().resolve().is_relative_to(folder.resolve()):
            raise ConfigError(f"{self.source}: --overwrite would delete '{folder}', which holds the current folder")

    def prepare(self, overwrite: bool, resume: bool) -> None:
        """Replace a previous run (with ``overwrite``), then create the folder and its marker."""
        if overwrite and not resume and (self.path / RUN_MARKER).is_file():
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / RUN_MARKER).write_text("A gsrecon run; `gsrecon train --overwrite` may replace it whole.\n")
