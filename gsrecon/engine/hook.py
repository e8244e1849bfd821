"""The :class:`Hook` base class, hook priorities and :class:`TrainerView`, what a hook sees of the trainer.

A hook is everything that happens *around* the optimisation step. The trainer calls each hook
point on every hook that defines it, in priority order (lower runs first; equal priorities keep
the order of the YAML ``hooks:`` entries). Hook points receive the trainer first, seen through
:class:`TrainerView` (what a hook may read); a hook writes only its own outputs and state.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING, Any, Protocol

from gsrecon.component import RunChecked
from gsrecon.registry import HOOK_REGISTRY

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from gsrecon.data.pipeline import Batch, DataPipeline
    from gsrecon.distributed import DistributedContext
    from gsrecon.engine.run_dir import RunDir
    from gsrecon.logging.console import Logger
    from gsrecon.logging.writers import Writers
    from gsrecon.losses.base import Loss
    from gsrecon.metrics import ImageMetrics
    from gsrecon.model.gaussians import GaussianModel
    from gsrecon.model.ops import GaussianEditor
    from gsrecon.model.views.base import ViewModules
    from gsrecon.optim import LRScheduler, Optimizer
    from gsrecon.render.base import Renderer, RenderOutput
    from gsrecon.strategy.base import Strategy


HOOK_POINTS = (
    "before_run",
    "after_load_checkpoint",
    "before_train",
    "before_train_iter",
    "after_loss",
    "after_train_iter",
    "before_val",
    "before_val_iter",
    "after_val_iter",
    "after_val",
    "before_save_checkpoint",
    "after_train",
    "after_run",
)


class Priority(IntEnum):
    """Named hook priorities (MMEngine's names); any int in [0, 100] is accepted too."""

    HIGHEST = 0
    VERY_HIGH = 10
    HIGH = 30
    ABOVE_NORMAL = 40
    NORMAL = 50
    BELOW_NORMAL = 60
    LOW = 70
    VERY_LOW = 90
    LOWEST = 100


def get_priority(priority: int | str | Priority) -> int:
    """Convert a priority name or int to an int in [0, 100]; raise ValueError otherwise."""
    if isinstance(priority, str):
        try:
            return int(Priority[priority.upper()])
        except KeyError:
            names = ", ".join(p.name for p in Priority)
            raise ValueError(f"unknown priority '{priority}'; use one of {names} or an int from 0 to 100") from None
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 100:
        raise ValueError(f"priority must be a name or an int from 0 to 100, got {priority!r}")
    return int(priority)


class TrainerView(Protocol):
    """What a hook may read of the trainer, and the few things it may ask of it (the engine's
    :class:`~gsrecon.engine.trainer.DefaultTrainer` is one).

    A hook writes only its own outputs and state (files under the run folder it lists in ``outputs``, its
    ``state_dict``, what it adds to a checkpoint in ``before_save_checkpoint``). It reads everything else and changes
    none of it, with one exception: the set of Gaussians, which it changes only through :meth:`edit_gaussians` (rows
    removed, appended or replaced, opacities reset; the optimisers' moments and the strategy's per-Gaussian state
    follow), and only in ``after_train_iter`` (between steps, before checkpoints are written)."""

    resolved_config: dict[str, Any]  # the run's config, every registry entry resolved (what config.yaml holds)
    run_dir: RunDir  # the run folder (exp_dir, checkpoints/)
    device: torch.device
    step: int  # completed training steps
    max_steps: int
    datapipeline: DataPipeline
    model: GaussianModel
    renderer: Renderer
    optimizers: dict[str, Optimizer]  # one per Gaussian parameter (gsrecon.optim: torch.optim's interface)
    schedulers: dict[str, LRScheduler]
    loss: Loss  # the named terms
    views: ViewModules  # the per-view modules
    strategy: Strategy
    strategy_state: dict[str, Any]
    hooks: dict[str, Hook]  # key -> hook, in run order
    writers: Writers
    logger: Logger
    outputs: dict[str, Any]  # the last step's loss, its terms, data time, Gaussians and SH degree
    val_metrics: dict[str, float | None]  # the last validation's means
    val_results: list[dict[str, Any]]  # the last validation's rows, one per test image
    stop_reason: str | None  # None, or why training ended early
    stop_signal: int | None  # the signal that stopped training early, if one did
    failed: bool  # training ended with an exception
    dist: DistributedContext  # the processes training together

    @property
    def is_main(self) -> bool:
        """True on the process that writes logs, checkpoints and exports (rank 0)."""

    @property
    def exp_dir(self) -> Path:
        """The run folder's path."""

    @property
    def scene_extent(self) -> float:
        """The scene's radius (what learning rates and densification scale with)."""

    @property
    def metrics(self) -> ImageMetrics:
        """The validation metrics (PSNR, SSIM, LPIPS)."""

    def render(self, batch: Batch, sh_degree: int | None = None) -> RenderOutput:
        """The model rendered from ``batch``'s cameras at the current SH degree (or ``sh_degree``)."""

    def call_hook(self, fn_name: str, **kwargs: Any) -> None:
        """Call ``fn_name`` on every hook that has it (a custom hook point too)."""

    def request_stop(self, signum: int | None = None) -> None:
        """Stop cleanly after the current step."""

    def skip_update(self) -> None:
        """Leave out this step's backward pass and optimiser step (only from ``after_loss``)."""

    def checkpoint(self) -> dict[str, Any]:
        """Everything needed to resume exactly (hooks may add to it)."""

    def edit_gaussians(self) -> GaussianEditor:
        """The one door to change the set of Gaussians (see the class's docstring)."""


class Hook(RunChecked):
    """Base class of trainer hooks. Override the points you need; the defaults do nothing.

    Order of calls in a run::

        check(facts), setup(run)                 as the run is built, before the trainer exists (RunChecked)
        before_run
        [after_load_checkpoint]                  when resuming
        before_train
          per step: before_train_iter -> (render, loss) -> after_loss -> (update) -> after_train_iter
          every val_interval and at the end:
            before_val -> per view: before_val_iter -> after_val_iter -> after_val
          [before_save_checkpoint]               whenever a checkpoint is written
        after_train                              also after Ctrl-C or an error, with trainer.stop_reason set
        after_run
    """

    priority: int | str = Priority.NORMAL

    def before_run(self, trainer: TrainerView) -> None:
        """Once, after everything is built and before any resume."""

    def after_run(self, trainer: TrainerView) -> None:
        """Once, last (also after training stopped early)."""

    def before_train(self, trainer: TrainerView) -> None:
        """Once, before the first training step (after a resume, ``trainer.step`` is the resumed step)."""

    def after_train(self, trainer: TrainerView) -> None:
        """Once, after the last training step or when training stopped (``trainer.stop_reason``)."""

    def before_train_iter(self, trainer: TrainerView) -> None:
        """Before each training step; ``trainer.step`` is the step about to run (0-based)."""

    def after_loss(self, trainer: TrainerView, batch: Batch, losses: dict[str, torch.Tensor]) -> None:
        """After the loss of step ``trainer.step`` (its weighted terms by key, for ``batch``), before the backward
        pass; a hook may ask the trainer to leave out this step's update (:meth:`TrainerView.skip_update`)."""

    def after_train_iter(self, trainer: TrainerView) -> None:
        """After each optimiser step; ``trainer.outputs`` holds the step's loss terms and timings,
        ``trainer.step`` is the number of completed steps."""

    def before_val(self, trainer: TrainerView) -> None:
        """Before a validation pass."""

    def after_val(self, trainer: TrainerView) -> None:
        """After a validation pass; ``trainer.val_metrics`` holds the mean metrics."""

    def before_val_iter(self, trainer: TrainerView, index: int) -> None:
        """Before rendering validation view ``index``."""

    def after_val_iter(self, trainer: TrainerView, index: int, outputs: dict[str, Any]) -> None:
        """After validation view ``index``; ``outputs`` has ``name``, ``render``, ``gt``, ``depth``, ``metrics``."""

    def before_save_checkpoint(self, trainer: TrainerView, checkpoint: dict[str, Any]) -> None:
        """Before a checkpoint dict is written; hooks may add entries to it."""

    def after_load_checkpoint(self, trainer: TrainerView, checkpoint: dict[str, Any]) -> None:
        """After a checkpoint was loaded into the trainer, before training continues."""

    def outputs(self) -> list[str]:
        """Paths (relative to ``exp_dir``) this hook writes: they belong to the run, and ``--overwrite``
        replaces them with it (anything not listed is left alone)."""
        return []

    def state_dict(self) -> dict[str, Any]:
        """State that must survive a resume (stored in checkpoints)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


def hook_points(cls: type) -> list[str]:
    """The standard hook points ``cls`` implements (overrides of :class:`Hook`'s empty methods), in call order."""
    return [point for point in HOOK_POINTS if getattr(cls, point, None) not in (None, getattr(Hook, point))]


def describe_hooks(resolved: dict[str, dict[str, Any] | None]) -> list[tuple[str, str, str, str, str]]:
    """Per entry of resolved ``hooks:`` (in run order): its key, class, priority, arguments and the hook points its
    class implements (what ``gsrecon hooks`` shows); a hook the config removed says so."""
    rows = []
    for key, entry in resolved.items():
        if entry is None:
            rows.append((key, "-", "-", "removed by this config", "-"))
            continue
        name, priority = entry.get("name", key), entry["priority"]
        named = next((p.name for p in Priority if p == priority), None)
        arguments = ", ".join(f"{k}={v}" for k, v in entry.items() if k not in ("name", "priority"))
        points = ", ".join(hook_points(HOOK_REGISTRY.get(name)))
        rows.append((key, name, f"{named} ({priority})" if named else str(priority), arguments or "-", points))
    return rows
