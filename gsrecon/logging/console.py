"""Console output of a run: a rich :class:`Logger` for messages and a :class:`ProgressLogger` bar.

Library code reports through the trainer's ``Logger``; nothing else prints.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class Logger:
    """Timestamped messages on a rich console, optionally mirrored to a plain-text log file."""

    def __init__(self, console: Console | None = None, log_file: str | Path | None = None) -> None:
        self.console = console or Console(stderr=True)
        self._file = open(log_file, "a") if log_file else None

    def _emit(self, style: str, level: str, message: str, echo: bool = True) -> None:
        if echo:
            prefix = f"[dim]{time.strftime('%H:%M:%S')}[/dim] " + (f"[{style}]{level}[/{style}] " if level else "")
            self.console.print(prefix + escape(message), soft_wrap=True, highlight=False)
        if self._file:
            self._file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {level or 'INFO'} {message}\n")
            self._file.flush()

    def info(self, message: str) -> None:
        self._emit("", "", message)

    def warning(self, message: str) -> None:
        self._emit("yellow", "WARNING", message)

    def error(self, message: str, echo: bool = True) -> None:
        """An error; with ``echo=False`` only the log file gets it (the CLI shows errors itself)."""
        self._emit("bold red", "ERROR", message, echo)

    def set_log_file(self, path: str | Path) -> None:
        """Mirror later messages to ``path`` (appending)."""
        if self._file:
            self._file.close()
        self._file = open(path, "a")

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None


class _StepsPerSecondColumn(ProgressColumn):
    """Training speed as rich estimates it from recent progress."""

    def render(self, task: Task) -> Text:
        return Text("- it/s" if task.speed is None else f"{task.speed:.1f} it/s")


class ProgressLogger:
    """A progress bar: ``label``, count, one column per entry of ``fields``, it/s, elapsed time and ETA.

    It draws only on an interactive terminal (or when ``force`` is set); elsewhere it is silent.
    ``fields`` maps a field name given to :meth:`update` to its column's label (training: the EMA
    loss and the number of Gaussians).
    """

    def __init__(
        self,
        total: int,
        console: Console,
        force: bool = False,
        label: str = "train",
        fields: dict[str, str] | None = None,
    ) -> None:
        fields = {"loss": "loss", "num_gaussians": "#GS"} if fields is None else fields
        self._progress = Progress(
            TextColumn(f"[bold blue]{label}"),
            BarColumn(),
            MofNCompleteColumn(),
            *(TextColumn(f"{title} {{task.fields[{name}]}}") for name, title in fields.items()),
            _StepsPerSecondColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            disable=not (force or console.is_terminal),
            refresh_per_second=5,
        )
        self._task = self._progress.add_task(label, total=total, **dict.fromkeys(fields, "-"))

    def start(self, completed: int) -> None:
        self._progress.update(self._task, completed=completed)
        self._progress.start()

    def update(self, completed: int, **fields: Any) -> None:
        """Move the bar to ``completed`` and refresh the text fields."""
        self._progress.update(self._task, completed=completed, **{k: str(v) for k, v in fields.items()})

    def stop(self) -> None:
        self._progress.stop()
