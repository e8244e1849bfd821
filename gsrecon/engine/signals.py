"""Stopping a run at a step boundary on Ctrl-C (SIGINT) or SIGTERM, instead of wherever the signal lands."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from gsrecon.logging.console import Logger

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C; kill, timeout, Slurm and Kubernetes


@contextmanager
def stop_at_step_boundary(
    request_stop: Callable[[int], None], logger: Logger, stopping: str = "stopping after this step with a checkpoint"
) -> Iterator[None]:
    """Inside the block the first SIGINT or SIGTERM calls ``request_stop(signum)`` and the loop finishes
    its step, the log saying what happens now (``stopping``); a second one raises KeyboardInterrupt at once. Outside
    the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if received:
            raise KeyboardInterrupt
        received.append(signum)
        name = signal.Signals(signum).name
        logger.warning(f"{name}: {stopping} (send it again to abort at once)")
        request_stop(signum)

    previous = {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
