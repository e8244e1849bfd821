"""The exception type for bad input that gsrecon rejects on purpose: the command line exits 2 for it."""

from __future__ import annotations


class InputError(ValueError):
    """Input a user can fix (a config key, a file, a value), rejected on purpose; the message names it.

    Its kinds: ``ConfigError`` (configs), ``DatasetError`` (scenes on disk), ``InvalidLossError`` (a run
    that diverged with its settings), and a missing optional package. Any other exception is a bug.
    """
