"""PruneFloatersHook: runs the floater pruner (:mod:`gsrecon.strategy.floaters`) on its schedule."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gsrecon.engine.hook import Hook, Priority
from gsrecon.registry import HOOK_REGISTRY
from gsrecon.strategy.floaters import FloaterPruner

if TYPE_CHECKING:
    from gsrecon.engine.hook import TrainerView


@HOOK_REGISTRY.register()
class PruneFloatersHook(Hook):
    """Every ``every`` steps from ``start`` until ``stop``, after the optimiser step: renders every training view
    and removes the Gaussians in front of what every view that sees them shows (:class:`FloaterPruner`).

    Runs before checkpoints are written (a checkpoint of a step holds that step's pruning), and works with any
    strategy: the rows go through the trainer's one door, ``trainer.edit_gaussians()``, with those of the optimiser
    moments and of the state the strategy declares per Gaussian.
    """

    priority = Priority.HIGH
    Config = FloaterPruner.Config

    def __init__(self, cfg: FloaterPruner.Config) -> None:
        self.pruner = FloaterPruner(cfg)
        self.pruned = 0  # Gaussians removed in this run so far (not saved: a count for the log)

    def after_train_iter(self, trainer: TrainerView) -> None:
        step = trainer.step
        if not self.pruner.due(step):
            return
        n = trainer.model.num_gaussians
        count = self.pruner.prune(trainer.edit_gaussians(), trainer.render, trainer.datapipeline.train_batches())
        if count == 0:
            return
        self.pruned += count
        trainer.logger.info(
            f"step {step}: pruned {count} of {n} Gaussians in front of every training view that sees them "
            f"({self.pruned} so far)"
        )
