"""DefaultTrainer: the training loop, validation driving and the hook points around them.

Everything else lives where it belongs: the config and the components in ``engine/builder.py``,
the run folder in ``engine/run_dir.py``, what a checkpoint holds in ``engine/checkpoints.py``,
scoring views in ``engine/evaluator.py``, and logging, checkpoints, exports, timing and anomaly
checks in hooks.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from gsrecon.config import ConfigError, save_yaml
from gsrecon.data.pipeline import Batch, DataPipeline
from gsrecon.distributed import DistributedContext
from gsrecon.engine import checkpoints
from gsrecon.engine.builder import (
    RunConfig,
    build_hooks,
    build_model,
    check_run_config,
    resolve_device,
    resolve_run_config,
    resolve_strategy_entry,
    set_cpu_threads,
    structural_keys,
)
from gsrecon.engine.evaluator import build_metrics, evaluate_views
from gsrecon.engine.run_dir import RunDir
from gsrecon.engine.signals import stop_at_step_boundary
from gsrecon.logging.console import Logger
from gsrecon.logging.writers import Writers
from gsrecon.losses import photometric_loss, point_depth_loss
from gsrecon.metrics import ImageMetrics, mean_metrics
from gsrecon.model.appearance import (
    appearance_state,
    build_appearance,
    build_appearance_optimizer,
    fit_left_half,
    load_appearance_state,
)
from gsrecon.model.optim import build_optimizers, build_schedulers
from gsrecon.model.params import PARAM_NAMES
from gsrecon.plugins import import_plugins
from gsrecon.registry import RENDERER_REGISTRY, STRATEGY_REGISTRY, WRITER_REGISTRY
from gsrecon.render.base import RenderOutput


class HookError(RuntimeError):
    """An exception raised inside a hook; the message names the hook and the hook point."""


class DefaultTrainer:
    """Trains a Gaussian model on one dataset as described by :class:`RunConfig` (``DefaultTrainer.Config``).

    Attributes hooks may read: ``cfg``, ``resolved_config``, ``run_dir`` / ``exp_dir``, ``device``,
    ``step`` (completed steps), ``max_steps``, ``datapipeline``, ``model``, ``renderer``,
    ``optimizers``, ``schedulers``, ``appearance`` (None when off) and ``appearance_optimizer``,
    ``strategy`` and ``strategy_state``, ``hooks`` (key -> hook, in run order), ``writers``, ``logger``,
    ``outputs`` (the last step's loss terms), ``val_metrics`` /
    ``val_results`` (the last validation), ``stop_reason`` (None, or why training ended early),
    ``failed`` (it ended with an exception) and ``dist``.
    """

    Config = RunConfig

    def __init__(
        self, cfg: RunConfig, source: str = "config", overwrite: bool = False, logger: Logger | None = None
    ) -> None:
        import_plugins(cfg.imports, source)
        check_run_config(cfg, source)
        self.cfg = cfg
        self.source = source
        self.dist = DistributedContext.from_env()
        self.logger = logger or Logger(console=None if self.is_main else Console(quiet=True))
        self.device = resolve_device(cfg.device, self.dist)
        threads = set_cpu_threads(cfg.num_threads)
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

        # Every registry entry is resolved first: unknown names and bad arguments fail before any work.
        self.resolved_config = resolve_run_config(cfg, self.device, source)
        self.hooks = build_hooks(self.resolved_config["hooks"], source)
        self.run_dir = RunDir(cfg.exp_dir, source)
        resume = cfg.resume is not False and cfg.resume is not None
        if self.is_main:
            self.run_dir.check(overwrite, resume)
        model = self.resolved_config["model"]
        self._resume_from = checkpoints.find_resume(
            cfg.resume, self.run_dir, model, structural_keys(model), source, self.logger.warning
        )

        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        self.datapipeline = DataPipeline(cfg.data, self.device, cfg.seed, self.dist.rank, self.dist.world_size)
        self.model = build_model(self.resolved_config["model"], self.datapipeline.scene, cfg.seed, source, self.logger)
        self.model.to(self.device)
        self.dist.broadcast_params(self.model.params)
        if cfg.loss.depth_lambda > 0 and not self.datapipeline.scene.observed:
            raise ConfigError(
                f"{source}: key 'loss.depth_lambda': the depth prior needs SfM points and the photos that observed "
                f"them (a COLMAP model, or a transforms.json capture triangulated by model.init: auto); data.path "
                f"'{cfg.data.path or cfg.data.dataset}' gives none: set loss.depth_lambda=0"
            )
        self.renderer = RENDERER_REGISTRY.build(self.resolved_config["renderer"])
        self.renderer.setup(self.logger)
        train_names = [frame.name for frame in self.datapipeline.scene.train]
        self.appearance = build_appearance(cfg.appearance, train_names, self.device)
        self._build_optimizers()
        # Resolved again now that the start is known: some defaults differ for random points (per_start).
        self.resolved_config["strategy"] = resolve_strategy_entry(cfg, source, getattr(self.model, "start", None))
        self.strategy = STRATEGY_REGISTRY.build(self.resolved_config["strategy"])
        self.strategy.check_sanity(self.model.params, self.resolved_config["renderer"])
        self.strategy_state = self.strategy.initialize_state(self.scene_extent)
        # Everything is built: only now may a previous run be replaced and outputs be written.
        self.writers = Writers([])
        if self.is_main:
            kept = self.run_dir.prepare(overwrite, resume)
            self.logger.set_log_file(self.exp_dir / "train.log")
            self.logger.info(f"{source}: {threads}; device {self.device}; {self.datapipeline.cache_note}")
            if self.datapipeline.mask_note:
                self.logger.info(self.datapipeline.mask_note)
            if kept:
                self.logger.info(f"--overwrite replaced the previous run and kept what it did not write: {kept}")
            self.writers = Writers(
                [WRITER_REGISTRY.build(w, exp_dir=self.exp_dir) for w in self.resolved_config["writers"]]
            )
            hook_outputs = [path for hook in self.hooks.values() for path in getattr(hook, "outputs", list)()]
            self.run_dir.record_outputs(["config.yaml", "train.log", *self.writers.outputs(), *hook_outputs])
            save_yaml(self.resolved_config, self.exp_dir / "config.yaml")
            self.writers.write_config(self.resolved_config)
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

    def _build_optimizers(self) -> None:
        """Fresh optimisers (row-sparse Adam when the renderer gives sparse gradients) and schedulers."""
        global_batch = self.cfg.data.batch_size * self.dist.world_size
        self.optimizers = build_optimizers(
            self.model.params, self.cfg.optimizer, self.scene_extent, global_batch, self.renderer.sparse_grad
        )
        self.schedulers = build_schedulers(self.optimizers, self.cfg.scheduler, self.cfg.max_steps)
        if self.appearance is not None:
            self.appearance_optimizer = build_appearance_optimizer(self.appearance, self.cfg.appearance)

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
                raise RuntimeError(
                    f"out of memory at step {self.step} with {self.model.num_gaussians} Gaussians; lower "
                    f"data.factor, data.batch_size or the strategy's cap_max"
                ) from exc
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

    def render(self, batch: Batch, sh_degree: int | None = None) -> RenderOutput:
        """Render the model from ``batch``'s cameras at the current SH degree (or ``sh_degree``)."""
        if sh_degree is None:
            sh_degree = self.model.active_sh_degree(self.step)
        return self.renderer.render(
            self.model.params, batch.viewmats, batch.Ks, batch.width, batch.height, sh_degree, batch.backgrounds,
            camera_model=batch.camera_model,
        )  # fmt: skip

    def run_step(self) -> None:
        """One optimisation step; afterwards ``self.step`` counts it and ``self.outputs`` describes it."""
        self.call_hook("before_train_iter")
        params, state = self.model.params, self.strategy_state
        start = time.perf_counter()
        batch = self.datapipeline.next_train(self.step)
        data_time = time.perf_counter() - start
        out = self.render(batch)
        self.strategy.step_pre_backward(params, self.optimizers, state, self.step, out.info)
        image = out.image if self.appearance is None else self.appearance(out.image, batch.names)  # [B, H, W, 3]
        losses = photometric_loss(image, batch.images, self.cfg.loss.ssim_lambda, batch.masks)
        total = losses["loss"]
        if self.appearance is not None:
            total = total + self.appearance.regularization()
        depth_term = None
        if self.cfg.loss.depth_lambda > 0:
            depth_term = point_depth_loss(out.depth, self.datapipeline.point_depths(batch.names))
            if depth_term is not None:
                total = total + self.cfg.loss.depth_lambda * self.scene_extent * depth_term
        regularization = self.strategy.regularization(params, state, out.info)
        if regularization is not None:
            total = total + regularization
        total.backward()
        self.dist.all_reduce_grads(params)
        if self.appearance is not None:
            self.dist.all_reduce_grads(dict(self.appearance.named_parameters()))
            self.appearance_optimizer.step()
            self.appearance_optimizer.zero_grad(set_to_none=True)
        for optimizer in self.optimizers.values():
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        for scheduler in self.schedulers.values():
            scheduler.step()
        self.strategy.step_post_backward(params, self.optimizers, state, self.step, out.info, self.dist)
        self.step += 1
        self.outputs = {
            "loss": total.detach(),
            "l1": losses["l1"].detach(),
            "ssim": losses["ssim"].detach(),
            "depth_prior": None if depth_term is None else depth_term.detach(),  # the disparity error, unweighted
            "data_time": data_time,
            "num_gaussians": self.model.num_gaussians,
            "sh_degree": self.model.active_sh_degree(self.step - 1),
        }
        self.call_hook("after_train_iter")

    @property
    def metrics(self) -> ImageMetrics:
        """The validation metrics (PSNR, SSIM, LPIPS), built on first use."""
        if self._metrics is None:
            self._metrics = build_metrics(self.cfg.metrics.lpips_net, self.device, self.logger)
        return self._metrics

    def validation(self) -> dict[str, float | None]:
        """Render every validation view, compute metrics and fill ``val_metrics`` / ``val_results``."""
        if self.datapipeline.num_val == 0:
            return {}
        self.call_hook("before_val")
        fit_left = self.appearance is not None and self.cfg.appearance.eval == "fit_left"
        self.val_results = evaluate_views(
            self.render,
            self.datapipeline.val_batches(),
            self.metrics,
            before_view=lambda index: self.call_hook("before_val_iter", index=index),
            after_view=lambda index, outputs: self.call_hook("after_val_iter", index=index, outputs=outputs),
            adjust=self._fit_left_half if fit_left else None,
        )
        self.val_metrics = mean_metrics(self.val_results)
        self.call_hook("after_val")
        return self.val_metrics

    def checkpoint(self) -> dict[str, Any]:
        """Everything needed to resume exactly (see :mod:`gsrecon.engine.checkpoints`); hooks may add to it."""
        checkpoint = checkpoints.capture(
            step=self.step,
            params=self.model.params,
            optimizers=self.optimizers,
            schedulers=self.schedulers,
            strategy_state=self.strategy_state,
            hooks=self.hooks,
            config=self.resolved_config,
            scene_extent=self.scene_extent,
        )
        if self.appearance is not None:
            checkpoint["appearance"] = appearance_state(self.appearance, self.appearance_optimizer)
        self.call_hook("before_save_checkpoint", checkpoint=checkpoint)
        return checkpoint

    def _fit_left_half(self, render: torch.Tensor, gt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A validation view's colour transform fitted on its left half; the right halves to score."""
        return fit_left_half(render, gt, self.cfg.appearance.eval_steps, self.cfg.appearance.eval_lr)

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore a :meth:`checkpoint` dict into this trainer."""
        checkpoints.check_version(checkpoint)
        for name in PARAM_NAMES:
            self.model.params[name] = torch.nn.Parameter(checkpoint["params"][name].to(self.device))
        self._build_optimizers()
        step = int(checkpoint["step"])
        changed = checkpoints.restore_optimization(checkpoint, self.optimizers, self.schedulers, step)
        if changed:
            self.logger.info(f"resuming with this config's learning-rate schedule for {', '.join(changed)}")
        if self.appearance is not None and "appearance" in checkpoint:
            load_appearance_state(self.appearance, self.appearance_optimizer, checkpoint["appearance"])
        fresh = self.strategy.initialize_state(self.scene_extent)
        self.strategy_state = checkpoints.restore_strategy_state(checkpoint, fresh, self.device)
        checkpoints.restore_hooks(checkpoint, self.hooks)
        checkpoints.restore_rng(checkpoint)
        self.step = step
        self.call_hook("after_load_checkpoint", checkpoint=checkpoint)

    def resume_or_load(self) -> None:
        """Load the checkpoint ``cfg.resume`` asked for (found and checked when the trainer was built)."""
        if self._resume_from is None:
            return
        path, checkpoint = self._resume_from
        self._resume_from = None
        self.load_checkpoint(checkpoint)
        self.logger.info(f"resumed from {path} at step {self.step}")
        for line in checkpoints.describe_changes(checkpoint.get("config", {}), self.resolved_config):
            self.logger.info(line)
        if self.step >= self.max_steps:
            self.logger.info(f"the checkpoint is already at max_steps ({self.max_steps}); raise max_steps to go on")
