"""The interface of a loss term and the sum of a run's terms.

A run's ``loss:`` section is an entry map like ``hooks:``: ``{key: {weight, ...options}}``, each entry
a :data:`~gsrecon.registry.LOSS_REGISTRY` name (or ``name:`` given), ``null`` removing one a base config
listed. Each step the trainer asks every term for its value on the step's render and batch and sums
``weight × value``; the weighted terms are what ``train/loss/<key>`` logs, so they add up to
``train/loss``. A term is one module: a :class:`LossTerm` subclass registered with
``@LOSS_REGISTRY.register("name")``; a plugin adds one through ``imports:``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor

from gsrecon.component import RunChecked
from gsrecon.config import ConfigError
from gsrecon.registry import LOSS_REGISTRY

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gsrecon.data.pipeline import Batch, DataPipeline
    from gsrecon.render.base import Renderer, RenderOutput

# The terms of a run whose YAML lists none: the 3DGS loss (1 - λ)·L1 + λ·(1 - SSIM) with λ = 0.2.
DEFAULT_LOSS: dict[str, dict[str, Any]] = {"l1": {"weight": 0.8}, "ssim": {"weight": 0.2}}


@dataclass
class LossInputs:
    """What a term may read in one step."""

    image: Tensor  # [B, H, W, 3] the render after the per-view modules (what the photos are compared with)
    render: RenderOutput  # the renderer's output: depth, alpha [B, H, W, 1] and its info
    batch: Batch  # the step's views: photos, masks, cameras, names
    data: DataPipeline  # the scene (its points, extent) and its training frames
    params: Mapping[str, Tensor] | None = None  # the Gaussians rendered (pre-activation; see gsrecon.model.gaussians)
    renderer: Renderer | None = None  # what rendered them (a term may render other features of them with it)


class LossTerm(RunChecked):
    """One term of the loss; subclasses extend :class:`LossTerm.Config` and implement :meth:`__call__`, may refuse a
    run (:meth:`~gsrecon.component.RunChecked.check`) and prepare what they need from its data before training
    (:meth:`~gsrecon.component.RunChecked.setup`, ``run.data``)."""

    @dataclass
    class Config:
        weight: float = 1.0  # the term's factor in the sum; 0 leaves it out (not computed)

        def __post_init__(self) -> None:
            if not (math.isfinite(self.weight) and self.weight >= 0):
                raise ValueError(f"weight must be a finite number >= 0, got {self.weight!r}")

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def __call__(self, inputs: LossInputs) -> Tensor | None:
        """The term's unweighted value (a differentiable scalar), or None where this step gives it nothing."""
        raise NotImplementedError


class Loss:
    """A run's loss terms by key, in the order the config lists them."""

    def __init__(self, terms: dict[str, LossTerm]) -> None:
        self.terms = {key: term for key, term in terms.items() if term.cfg.weight > 0}

    def __call__(self, inputs: LossInputs) -> dict[str, Tensor]:
        """``{key: weight × value}`` of the terms that gave a value this step."""
        values = {}
        for key, term in self.terms.items():
            value = term(inputs)
            if value is not None:
                values[key] = term.cfg.weight * value
        return values


def build_loss(resolved: dict[str, dict[str, Any] | None], source: str = "config") -> Loss:
    """The :class:`Loss` of resolved ``loss:`` entries (removed ones, None, skipped)."""
    terms = {}
    for key, entry in resolved.items():
        if entry is None:
            continue
        try:
            terms[key] = LOSS_REGISTRY.build({"name": key, **entry})
        except ValueError as exc:
            raise ConfigError(f"{source}: key 'loss.{key}': {exc}") from exc
    return Loss(terms)
