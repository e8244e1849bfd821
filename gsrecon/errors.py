"""The exception type for bad input that gsrecon rejects on purpose: the command line exits 2 for it."""

from __future__ import annotations


class InputError(ValueError):
    """Input a user can fix (a config key, a file, a value), rejected on purpose; the message names it.

    Its kinds: ``ConfigError`` (configs), ``DatasetError`` (scenes on disk), ``InvalidLossError`` (a run
    that diverged with its settings), and a missing optional package. Any other exception is a bug.
    """


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation that failed: Python's ``MemoryError``, torch's on a GPU or on the CPU (its
    allocator raises a RuntimeError saying it "can't allocate memory")."""
    if isinstance(exc, MemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower())


def last_line(exc: BaseException) -> str:
    """The last non-empty line of an error's message (a compiler's output and an allocator's end with what failed),
    or its type's name."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__
