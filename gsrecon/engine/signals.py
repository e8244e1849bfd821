"""Stopping a run at a step boundary on Ctrl-C, instead of wherever the signal lands."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from gsrecon.logging.console import Logger


@contextmanager
def stop_at_step_boundary(request_stop: Callable[[], None], logger: Logger) -> Iterator[None]:
    """Inside the block the first Ctrl-C (SIGINT) calls ``request_stop`` and the loop finishes its
    step; a second one raises KeyboardInterrupt at once. Outside the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if received:
            raise KeyboardInterrupt
        received.append(signum)
        logger.warning("Ctrl-C: stopping after this step (press again to abort at once)")
        request_stop()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
