"""Hooks: everything around the optimisation step. Importing this package registers the built-ins."""

from gsrecon.engine.hook import Hook, Priority, get_priority
from gsrecon.hooks import (  # noqa: F401
    checkpoint,
    empty_cache,
    export,
    floaters,
    invalid_loss,
    log,
    metrics,
    skip_views,
    timer,
    transients,
    viewer,
)

__all__ = ["Hook", "Priority", "get_priority"]
