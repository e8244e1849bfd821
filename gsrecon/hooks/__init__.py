"""Hooks: everything around the optimisation step. Importing this package registers the built-ins."""

from gsrecon.hooks import checkpoint_hook, empty_cache_hook, invalid_loss_hook, log_hook, timer_hook  # noqa: F401
from gsrecon.hooks.base import Hook, Priority, get_priority

__all__ = ["Hook", "Priority", "get_priority"]
