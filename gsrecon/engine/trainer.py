"""DefaultTrainer: the training loop, validation driving and the hook points around them.

Everything else lives where it belongs: the config in ``engine/resolve.py``, the components in ``engine/build.py``,
the run folder in ``engine/run_dir.py``, what a checkpoint holds in ``engine/checkpoints.py``,
scoring views in ``engine/evaluator.py``, and logging, checkpoints, exports, timing and anomaly
checks in hooks.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from gsrecon.data.pipeline import Batch
from gsrecon.distributed import DistributedContext
from gsrecon.engine import build, checkpoints, resolve, runtime
from gsrecon.engine.evaluator import build_metrics, evaluate_views
from gsrecon.engine.run_dir import RunDir
from gsrecon.engine.signals import stop_at_step_boundary
from gsrecon.errors import InputError
from gsrecon.logging.console import Logger
from gsrecon.logging.writers import Writers
from gsrecon.metrics import ImageMetrics, describe_metrics, mean_metrics
from gsrecon.model.ops import GaussianEditor
from gsrecon.params import PARAM_NAMES
from gsrecon.plugins import import_plugins
from gsrecon.render.base import RenderOutput


class HookError(RuntimeError):
    """An exception raised inside a hook; the message names the hook and the hook point."""


class DefaultTrainer:
    """Trains a Gaussian model on one dataset as described by its run config (``DefaultTrainer.Config``).

    Hooks see it as a :class:`~gsrecon.engine.hook.TrainerView`: what they may read and ask of it.
    """

    Config = resolve.RunConfig

    def __init__(
        self, cfg: resolve.RunConfig, source: str = "config", overwrite: bool = False, logger: Logger | None = None,
        dist: DistributedContext | None = None,
    ) -> None:  # fmt: skip
        import_plugins(cfg.imports, source)
        self.cfg = cfg
        self.source = source
        self.dist = dist or DistributedContext.from_env()
        self.logger = logger or Logger(console=None if self.is_main else Console(quiet=True))
        self.max_steps = cfg.max_steps
        self.step = 0
        self.outputs: dict[str, Any] = {}
        self.val_metrics: dict[str, float | None] = {}
        self.val_results: list[dict[str, Any]] = []
        self.stop_reason: str | None = None
        self.stop_signal: int | None = None  # the signal that stopped training early, if one did
        self.failed = False  # True when training ended with an exception (nothing more is saved)
        self._stop_requested = False
        self._metrics: ImageMetrics | None = None
        self.run_dir = RunDir(cfg.exp_dir, source)
        resume = cfg.resume is not False and cfg.resume is not None

        def claim(resolved: dict[str, Any]) -> None:  # the config is resolved: check the folder before any work
            if self.is_main:
                self.run_dir.check(overwrite, resume)
            model = resolved["model"]
            self._resume_from = checkpoints.find_resume(
                cfg.resume, self.run_dir, model, resolve.structural_keys(model), source, self.logger.warning
            )

        run = build.build_training_run(cfg, source, self.logger, self.dist, claim)
        self.device, self.resolved_config, self.hooks = run.device, run.resolved, run.hooks
        self.datapipeline, self.model, self.loss, self.renderer = run.datapipeline, run.model, run.loss, run.renderer
        self.views, self.strategy, self.forward = run.views, run.strategy, run.forward
        self.optimizers, self.schedulers = run.state.optimizers, run.state.schedulers
        self.strategy_state = run.state.strategy_state
        # Everything is built: only now may a previous run be replaced and outputs be written.
        self.writers = Writers([])
        if self.is_main:
            self.run_dir.open_log(overwrite, resume, self.logger)
            notes = self.datapipeline.notes
            self.logger.info(build.describe_run(cfg, self.resolved_config, source, run.threads, self.device, notes))
            for notice in run.notices:
                self.logger.warning(notice)
            hook_outputs = [path for hook in self.hooks.values() for path in hook.outputs()]
            self.writers = self.run_dir.open_writers(self.resolved_config, hook_outputs)
        self.dist.barrier()

    @property
    def is_main(self) -> bool:
        """True on the process that writes logs, checkpoints and exports (rank 0)."""
        return self.dist.rank == 0

    @property
    def exp_dir(self) -> Path:
        return self.run_dir.path

    @property
    def scene_extent(self) -> float:
        return self.datapipeline.scene.extent

    def call_hook(self, fn_name: str, **kwargs: Any) -> None:
        """Call ``fn_name(self, **kwargs)`` on every hook that has it, in priority order.

        Custom hook points are allowed. An exception inside a hook is re-raised as :class:`HookError`
        naming the hook and the hook point (the original exception is its ``__cause__``).
        """
        for key, hook in self.hooks.items():
            fn = getattr(hook, fn_name, None)
            if fn is None:
                continue
            try:
                fn(self, **kwargs)
            except (HookError, KeyboardInterrupt):
                raise
            except Exception as exc:
                raise HookError(f"{key}.{fn_name}: {exc}") from exc

    def train(self) -> None:
        """Run (or resume) training to ``max_steps``, with validation every ``val_interval`` steps."""
        self.call_hook("before_run")
        try:
            self.resume_or_load()
            self.call_hook("before_train")
            with stop_at_step_boundary(self.request_stop, self.logger):
                while self.step < self.max_steps and not self._stop_requested:
                    self.run_step()
                    if self.is_main and (self.step % self.cfg.val_interval == 0 or self.step == self.max_steps):
                        self.validation()
            if self._stop_requested:
                self.stop_reason = f"interrupted at step {self.step}"
        except BaseException as exc:
            self.stop_reason = f"failed at step {self.step}: {exc}"
            self.failed = True
            self.logger.error(self.stop_reason, echo=False)
            self._finish(raising=True)
            if isinstance(exc, torch.OutOfMemoryError):
                raise runtime.out_of_memory(self.step, self.model.num_gaussians) from exc
            raise
        self._finish(raising=False)

    def _finish(self, raising: bool) -> None:
        try:
            self.call_hook("after_train")
            self.call_hook("after_run")
        except Exception:
            if not raising:
                raise
        finally:
            self.writers.close()
            self.logger.close()
            self.run_dir.release()

    def request_stop(self, signum: int | None = None) -> None:
        """Stop cleanly after the current step (as Ctrl-C and SIGTERM do, passing their signal number)."""
        self._stop_requested = True
        self.stop_signal = signum

    def skip_update(self) -> None:
        """Leave out this step's backward pass and optimiser step (asked in ``after_loss``; schedules still advance)."""
        self._skip_update = True

    def render(self, batch: Batch, sh_degree: int | None = None) -> RenderOutput:
        """Render the model (and what per-view modules draw behind it) from ``batch``'s cameras at the SH degree."""
        degree = self.model.active_sh_degree(self.step) if sh_degree is None else sh_degree
        return self.views.composite(self.renderer.render_batch(self.model.params, batch, degree), batch)

    def edit_gaussians(self) -> GaussianEditor:
        """The one door through which a hook changes the set of Gaussians (:class:`~gsrecon.model.ops.GaussianEditor`:
        parameters, optimiser moments and the strategy's per-Gaussian state stay row-aligned)."""
        return GaussianEditor(self.model.params, self.optimizers, self.strategy_state, self.strategy.per_gaussian_state)

    def run_step(self) -> None:
        """One optimisation step; afterwards ``self.step`` counts it and ``self.outputs`` describes it: ``loss`` (the
        sum), ``losses`` (its weighted terms by key: loss terms, per-view and strategy regularisation), ``updated``
        (False where a hook skipped the update), ``data_time``, ``num_gaussians`` and ``sh_degree``."""
        self.call_hook("before_train_iter")
        params, state = self.model.params, self.strategy_state
        start = time.perf_counter()
        batch = self.views.adjust_cameras(self.datapipeline.next_train(self.step))
        data_time = time.perf_counter() - start
        forward = self.forward(params, batch, self.model.active_sh_degree(self.step))
        out, losses = forward.out, forward.losses
        self.strategy.step_pre_backward(params, self.optimizers, state, self.step, out.info)
        regularization = self.strategy.regularization(params, state, out.info)
        if regularization is not None:
            losses["strategy"] = regularization
        total = sum(losses.values())
        self._skip_update = False
        self.call_hook("after_loss", batch=batch, losses=losses)
        if not self._skip_update:
            total.backward()
            self.dist.all_reduce_grads(params)
            self.views.step(batch.names, self.dist)
            for optimizer in self.optimizers.values():
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        for scheduler in self.schedulers.values():
            scheduler.step()
        self.strategy.step_post_backward(params, self.optimizers, state, self.step, out.info, self.dist)
        self.step += 1
        self.outputs = {
            "loss": total.detach(),
            "losses": {key: value.detach() for key, value in losses.items()},
            "updated": not self._skip_update,
            "data_time": data_time,
            "num_gaussians": self.model.num_gaussians,
            "sh_degree": self.model.active_sh_degree(self.step - 1),
        }
        self.call_hook("after_train_iter")

    @property
    def metrics(self) -> ImageMetrics:
        """The validation metrics (PSNR, SSIM, LPIPS), built on first use."""
        if self._metrics is None:
            self._metrics = build_metrics(self.cfg.metrics, self.device, self.logger, self.renderer.compiled)
        return self._metrics

    def validation(self) -> dict[str, float | None]:
        """Render every validation view, compute metrics and fill ``val_metrics`` / ``val_results``."""
        if self.datapipeline.num_val == 0:
            return {}
        self.call_hook("before_val")
        self.val_results = evaluate_views(
            self.render,
            self.datapipeline.val_batches(),
            self.metrics,
            before_view=lambda index: self.call_hook("before_val_iter", index=index),
            after_view=lambda index, outputs: self.call_hook("after_val_iter", index=index, outputs=outputs),
            adjust=self.views.eval_adjust(),
            fit_cameras=self.views.eval_cameras,
        )
        self.val_metrics = mean_metrics(self.val_results)
        self.call_hook("after_val")
        return self.val_metrics

    def checkpoint(self) -> dict[str, Any]:
        """Everything needed to resume exactly (see :mod:`gsrecon.engine.checkpoints`); hooks may add to it."""
        checkpoint = checkpoints.capture(self)
        self.call_hook("before_save_checkpoint", checkpoint=checkpoint)
        return checkpoint

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore a :meth:`checkpoint` dict into this trainer."""
        checkpoints.check_version(checkpoint)
        for name in PARAM_NAMES:
            self.model.params[name] = torch.nn.Parameter(checkpoint["params"][name].to(self.device))
        state = build.build_training_state(
            self.cfg, self.model, self.renderer, self.strategy, self.scene_extent, self.dist.world_size
        )
        self.optimizers, self.schedulers = state.optimizers, state.schedulers
        step = int(checkpoint["step"])
        changed = checkpoints.restore_optimization(checkpoint, self.optimizers, self.schedulers, step)
        if changed:
            self.logger.info(f"resuming with this config's learning-rate schedule for {', '.join(changed)}")
        self.views.load_state_dict(checkpoint.get("views", {}))
        self.strategy_state = checkpoints.restore_strategy_state(checkpoint, state.strategy_state, self.device)
        checkpoints.restore_hooks(checkpoint, self.hooks)
        checkpoints.restore_rng(checkpoint)
        self.step = step
        self.call_hook("after_load_checkpoint", checkpoint=checkpoint)

    def report(self) -> list[str]:
        """What the command line says when training ended: the steps and final metrics and where the outputs are,
        or why it stopped early and how to continue."""
        if self.stop_reason:
            return [f"{self.stop_reason}; {self.run_dir.resume_advice()}"]
        metrics = describe_metrics(self.val_metrics)
        return [f"finished {self.step} steps{': ' + metrics if metrics else ''}", f"outputs: {self.exp_dir}"]

    def resume_or_load(self) -> None:
        """Load the checkpoint ``cfg.resume`` asked for (found and checked when the trainer was built)."""
        if self._resume_from is None:
            return
        path, checkpoint = self._resume_from
        self._resume_from = None
        try:
            self.load_checkpoint(checkpoint)
        except InputError as exc:
            raise InputError(f"cannot resume {path}: {exc}") from None
        for line in checkpoints.unrestored_warnings(path, self.optimizers) if self.step > 0 else []:
            self.logger.warning(line)
        for line in checkpoints.resume_notes(path, checkpoint, self.resolved_config, self.max_steps):
            self.logger.info(line)
