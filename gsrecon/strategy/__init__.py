"""Densification strategies: how the set of Gaussians grows, shrinks and moves during training.

Importing this package registers the built-ins (``none``, ``default``, ``mcmc``) in STRATEGY_REGISTRY.
"""

from gsrecon.strategy import default, mcmc  # noqa: F401
from gsrecon.strategy.base import NoStrategy, Strategy

__all__ = ["NoStrategy", "Strategy"]
