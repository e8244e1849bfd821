"""Densification strategies: how the set of Gaussians grows, shrinks and moves during training, and the pruners
composed with them (``floaters``); every change of rows goes through :mod:`gsrecon.model.ops`.

Importing this package registers the built-ins (``none``, ``default``, ``mcmc``, ``multiview``) in STRATEGY_REGISTRY.
"""

from gsrecon.strategy import default, mcmc, multiview  # noqa: F401
from gsrecon.strategy.base import NoStrategy, Strategy

__all__ = ["NoStrategy", "Strategy"]
