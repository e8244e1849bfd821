"""Hooks: everything around the optimisation step. Importing this package registers the built-ins."""

from gsrecon.hooks import checkpoint, empty_cache, export, invalid_loss, log, metrics, timer, viewer  # noqa: F401
from gsrecon.hooks.base import Hook, Priority, get_priority

__all__ = ["Hook", "Priority", "get_priority"]
