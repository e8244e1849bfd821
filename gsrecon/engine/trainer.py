"""DefaultTrainer: builds a run from its config and runs the training loop, calling hooks around it.

The core is deliberately small: one training step (render, loss, backward, optimiser, strategy)
and a validation pass. Logging, checkpoints, timing and anomaly checks are hooks.
"""

from __future__ import annotations

import random
import shutil
import signal
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

# Imported for their registrations (built-in hooks, writers, strategies, renderers).
import gsrecon.hooks
import gsrecon.logging.writers
import gsrecon.model.default_strategy
import gsrecon.model.mcmc_strategy
import gsrecon.model.strategy
import gsrecon.render.renderers  # noqa: F401
from gsrecon.config import ConfigError, load_config, parse_structured, resolved_entry, save_yaml, to_container
from gsrecon.data.cameras import Scene
from gsrecon.data.datapipeline import DataPipeline
from gsrecon.distributed import DistributedContext
from gsrecon.engine.checkpoints import RUN_MARKER, latest_checkpoint, load_checkpoint_file
from gsrecon.hooks.base import Hook, get_priority
from gsrecon.logging.console import Logger
from gsrecon.losses import photometric_loss
from gsrecon.lpips_weights import LPIPS_NETS
from gsrecon.metrics import ImageMetrics, mean_metrics
from gsrecon.model.gaussians import PARAM_NAMES
from gsrecon.model.optim import OptimizerConfig, SchedulerConfig, build_optimizers, build_schedulers
from gsrecon.plugins import import_plugins
from gsrecon.registry import (
    HOOK_REGISTRY,
    MODEL_REGISTRY,
    RENDERER_REGISTRY,
    STRATEGY_REGISTRY,
    WRITER_REGISTRY,
    Registry,
)
from gsrecon.render.base import RenderOutput

CHECKPOINT_VERSION = 1


class HookError(RuntimeError):
    """An exception raised inside a hook; the message names the hook and the hook point."""


class TrainingStopped(RuntimeError):
    """Raised by hooks to stop training with a message (e.g. a non-finite loss)."""


@dataclass
class LossConfig:
    ssim_lambda: float = 0.2  # loss = (1 - λ)·L1 + λ·(1 - SSIM)


@dataclass
class MetricsConfig:
    lpips_net: str = "alex"  # alex | vgg | none


def _default_hooks() -> list[dict[str, Any]]:
    return [{"name": "LogHook"}, {"name": "CheckPointHook"}]


class DefaultTrainer:
    """Trains a Gaussian model on one dataset as described by :class:`DefaultTrainer.Config`.

    Attributes hooks may read: ``cfg``, ``exp_dir``, ``device``, ``step`` (completed steps),
    ``max_steps``, ``datapipeline``, ``model``, ``renderer``, ``optimizers``, ``schedulers``,
    ``strategy``, ``writers``, ``logger``, ``outputs`` (the last step's loss terms and timings),
    ``val_metrics`` / ``val_results`` (the last validation), ``stop_reason`` (None, or why training
    ended early), ``failed`` (it ended with an exception) and ``dist``.
    """

    @dataclass
    class Config:
        exp_dir: str = "outputs/run"
        seed: int = 0
        device: str = "auto"  # auto | cpu | cuda | cuda:N
        num_threads: int = 0  # torch CPU threads; 0 keeps torch's default
        max_steps: int = 30_000
        val_interval: int = 1_000  # validate every this many steps and after the last one
        resume: Any = False  # false | true (newest checkpoint of exp_dir) | a checkpoint path
        imports: list[str] = field(default_factory=list)  # modules or .py files imported before building
        data: DataPipeline.Config = field(default_factory=DataPipeline.Config)
        model: dict[str, Any] = field(default_factory=lambda: {"name": "gaussians"})
        renderer: dict[str, Any] = field(default_factory=lambda: {"name": "auto"})
        optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
        scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
        strategy: dict[str, Any] = field(default_factory=lambda: {"name": "none"})
        loss: LossConfig = field(default_factory=LossConfig)
        metrics: MetricsConfig = field(default_factory=MetricsConfig)
        writers: list[dict[str, Any]] = field(default_factory=lambda: [{"name": "TensorboardWriter"}])
        hooks: list[dict[str, Any]] = field(default_factory=_default_hooks)

    def __init__(
        self, cfg: Config, source: str = "config", overwrite: bool = False, logger: Logger | None = None
    ) -> None:
        self.cfg = cfg
        self.source = source
        import_plugins(cfg.imports, source)
        _check_top_level(cfg, source)
        self.dist = DistributedContext.from_env()
        self.logger = logger or Logger(console=None if self.dist.rank == 0 else Console(quiet=True))
        self.device = resolve_device(cfg.device, self.dist)
        if cfg.num_threads > 0:
            torch.set_num_threads(cfg.num_threads)
        self.exp_dir = Path(cfg.exp_dir)
        self.max_steps = cfg.max_steps
        self.step = 0
        self.outputs: dict[str, Any] = {}
        self.val_metrics: dict[str, float | None] = {}
        self.val_results: list[dict[str, Any]] = []
        self.stop_reason: str | None = None
        self.failed = False  # True when training ended with an exception (nothing more is saved)
        self._stop_requested = False
        self._metrics = None

        # Resolve every registry entry first: unknown names and bad arguments fail before any work.
        self.renderer_cfg = resolve_renderer_entry(cfg.renderer, self.device, source)
        self.model_cfg = _resolved_entry(MODEL_REGISTRY, cfg.model, source, "model")
        self.strategy_cfg = _resolved_entry(STRATEGY_REGISTRY, cfg.strategy, source, "strategy")
        writer_cfgs = [_resolved_entry(WRITER_REGISTRY, w, source, f"writers.{i}") for i, w in enumerate(cfg.writers)]
        hook_cfgs = [
            _resolved_entry(HOOK_REGISTRY, h, source, f"hooks.{i}", extra=("priority",))
            for i, h in enumerate(cfg.hooks)
        ]
        self.resolved_config = {
            **to_container(cfg),
            "model": self.model_cfg,
            "renderer": self.renderer_cfg,
            "strategy": self.strategy_cfg,
            "writers": writer_cfgs,
            "hooks": hook_cfgs,
        }
        self.resolved_config.pop("resume")
        self.hooks = self._build_hooks(hook_cfgs)
        self._check_exp_dir(overwrite)
        self._resume_from = self._find_resume_checkpoint()  # (path, checkpoint dict) or None

        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        self.datapipeline = DataPipeline(cfg.data, self.device, cfg.seed, self.dist.rank, self.dist.world_size)
        self.model = build_model(self.model_cfg, self.datapipeline.scene, cfg.seed, source).to(self.device)
        self.dist.broadcast_params(self.model.params)
        self.renderer = RENDERER_REGISTRY.build(self.renderer_cfg)
        self.renderer.setup(self.logger)
        self._build_optimizers()
        self.strategy = STRATEGY_REGISTRY.build(self.strategy_cfg)
        self.strategy.initialize(self)
        # Everything is built: only now may a previous run be replaced and outputs be written.
        self._prepare_exp_dir(overwrite)
        self.writers = [WRITER_REGISTRY.build(w, exp_dir=self.exp_dir) for w in writer_cfgs] if self.is_main else []
        if self.is_main:
            save_yaml(self.resolved_config, self.exp_dir / "config.yaml")
            for writer in self.writers:
                writer.write_config(self.resolved_config)

    # ------------------------------------------------------------------ building

    @property
    def is_main(self) -> bool:
        """True on the process that writes logs, checkpoints and exports (rank 0)."""
        return self.dist.rank == 0

    @property
    def scene_extent(self) -> float:
        return self.datapipeline.scene.extent

    @property
    def checkpoint_dir(self) -> Path:
        """Where checkpoints of this run live: the first CheckPointHook's folder, else ``<exp_dir>/checkpoints``."""
        for hook in self.hooks:
            if hasattr(hook, "checkpoint_dir"):
                return hook.checkpoint_dir(self)
        return self.exp_dir / "checkpoints"

    def _build_optimizers(self) -> None:
        """Fresh optimisers (row-sparse Adam when the renderer gives sparse gradients) and schedulers."""
        global_batch = self.cfg.data.batch_size * self.dist.world_size
        self.optimizers = build_optimizers(
            self.model.params, self.cfg.optimizer, self.scene_extent, global_batch, self.renderer.sparse_grad
        )
        self.schedulers = build_schedulers(self.optimizers, self.cfg.scheduler, self.cfg.max_steps)

    def _check_exp_dir(self, overwrite: bool) -> None:
        """Refuse folders that hold other files, and runs that would be replaced without --overwrite."""
        folder = self.exp_dir
        if not self.is_main or not folder.is_dir() or not any(folder.iterdir()):
            return
        if not (folder / RUN_MARKER).is_file():
            raise ConfigError(
                f"{self.source}: exp_dir '{folder}' is not empty and is not a gsrecon run folder; choose a new or "
                f"empty folder (gsrecon never deletes files it did not write)"
            )
        if self.cfg.resume is not False:
            return
        if not overwrite:
            raise ConfigError(
                f"{self.source}: exp_dir '{folder}' already holds a run; continue it with --resume, "
                f"replace it with --overwrite, or set another exp_dir"
            )
        if Path.cwd().resolve().is_relative_to(folder.resolve()):
            raise ConfigError(f"{self.source}: --overwrite would delete '{folder}', which holds the current folder")

    def _prepare_exp_dir(self, overwrite: bool) -> None:
        """Replace a previous run (with --overwrite), create the folder and start its log."""
        if self.is_main:
            if overwrite and self.cfg.resume is False and (self.exp_dir / RUN_MARKER).is_file():
                shutil.rmtree(self.exp_dir)
            self.exp_dir.mkdir(parents=True, exist_ok=True)
            (self.exp_dir / RUN_MARKER).write_text("A gsrecon run; `gsrecon train --overwrite` may replace it whole.\n")
            self.logger.set_log_file(self.exp_dir / "train.log")
        self.dist.barrier()

    def _find_resume_checkpoint(self) -> tuple[Path, dict[str, Any]] | None:
        """The checkpoint ``cfg.resume`` names, read and checked against this config; None for a new run."""
        resume = self.cfg.resume
        if resume is False or resume is None:
            return None
        if isinstance(resume, str):
            path = Path(resume)
        else:
            path = latest_checkpoint(self.checkpoint_dir)
            if path is None:
                raise ConfigError(
                    f"{self.source}: nothing to resume: no checkpoint in {self.checkpoint_dir}; "
                    f"drop --resume (resume: true) to start a new run"
                )
        checkpoint = load_checkpoint_file(path, "cpu")
        previous = checkpoint.get("config", {})
        old_model, new_model = previous.get("model", {}), self.resolved_config["model"]
        structural = getattr(MODEL_REGISTRY.get(new_model["name"]), "structural_keys", ())
        for key in ("name", *structural):  # these decide the shapes of the saved parameters
            if key in old_model and old_model[key] != new_model.get(key):
                raise ConfigError(
                    f"{self.source}: cannot resume {path}: it was trained with model.{key}={old_model[key]} but "
                    f"this config has model.{key}={new_model.get(key)}; set model.{key}={old_model[key]}"
                )
        return path, checkpoint

    def _build_hooks(self, hook_cfgs: list[dict[str, Any]]) -> list[Hook]:
        hooks: list[tuple[int, int, Hook]] = []
        for index, entry in enumerate(hook_cfgs):
            entry = dict(entry)
            priority = entry.pop("priority", None)
            hook = HOOK_REGISTRY.build(entry)
            try:
                hook.priority = get_priority(priority if priority is not None else hook.priority)
            except ValueError as exc:
                raise ConfigError(f"{self.source}: key 'hooks.{index}.priority': {exc}") from None
            hooks.append((hook.priority, index, hook))
        return [hook for _, _, hook in sorted(hooks, key=lambda t: (t[0], t[1]))]

    def call_hook(self, fn_name: str, **kwargs: Any) -> None:
        """Call ``fn_name(self, **kwargs)`` on every hook that has it, in priority order.

        Custom hook points are allowed. An exception inside a hook is re-raised as :class:`HookError`
        naming the hook class and the hook point (the original exception is its ``__cause__``).
        """
        for hook in self.hooks:
            fn = getattr(hook, fn_name, None)
            if fn is None:
                continue
            try:
                fn(self, **kwargs)
            except (HookError, KeyboardInterrupt):
                raise
            except Exception as exc:
                raise HookError(f"{type(hook).__name__}.{fn_name}: {exc}") from exc

    # ------------------------------------------------------------------ running

    def train(self) -> None:
        """Run (or resume) training to ``max_steps``, with validation every ``val_interval`` steps."""
        self.call_hook("before_run")
        try:
            self.resume_or_load()
            self.call_hook("before_train")
            with self._deferred_interrupt():
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
            for writer in self.writers:
                writer.close()
            self.logger.close()

    def request_stop(self) -> None:
        """Stop cleanly after the current step (as Ctrl-C does)."""
        self._stop_requested = True

    @contextmanager
    def _deferred_interrupt(self) -> Iterator[None]:
        """Turn the first Ctrl-C into a stop at the next step boundary; a second one interrupts at once."""
        if not _in_main_thread():
            yield
            return

        def handler(signum: int, frame: Any) -> None:
            if self._stop_requested:
                raise KeyboardInterrupt
            self.logger.warning("Ctrl-C: stopping after this step (press again to abort at once)")
            self.request_stop()

        previous = signal.signal(signal.SIGINT, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def render(
        self,
        viewmats: torch.Tensor,
        Ks: torch.Tensor,
        width: int,
        height: int,
        backgrounds: torch.Tensor,
        sh_degree: int | None = None,
    ) -> RenderOutput:
        """Render the model from ``viewmats`` [C, 4, 4] / ``Ks`` [C, 3, 3] at the current SH degree."""
        if sh_degree is None:
            sh_degree = self.model.active_sh_degree(self.step)
        return self.renderer.render(self.model.params, viewmats, Ks, width, height, sh_degree, backgrounds)

    def run_step(self) -> None:
        """One optimisation step; afterwards ``self.step`` counts it and ``self.outputs`` describes it."""
        self.call_hook("before_train_iter")
        start = time.perf_counter()
        batch = self.datapipeline.next_train(self.step)
        data_time = time.perf_counter() - start
        out = self.render(batch.viewmats, batch.Ks, batch.width, batch.height, batch.backgrounds)
        self.strategy.step_pre_backward(self, out.info)
        losses = photometric_loss(out.image, batch.images, self.cfg.loss.ssim_lambda)
        total = losses["loss"]
        regularization = self.strategy.regularization(self, out.info)
        if regularization is not None:
            total = total + regularization
        total.backward()
        self.dist.all_reduce_grads(self.model.params)
        for optimizer in self.optimizers.values():
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        for scheduler in self.schedulers.values():
            scheduler.step()
        self.strategy.step_post_backward(self, out.info)
        self.step += 1
        self.outputs = {
            "loss": total.detach(),
            "l1": losses["l1"].detach(),
            "ssim": losses["ssim"].detach(),
            "data_time": data_time,
            "num_gaussians": self.model.num_gaussians,
            "sh_degree": self.model.active_sh_degree(self.step - 1),
        }
        self.call_hook("after_train_iter")

    @property
    def metrics(self) -> ImageMetrics:
        """The validation metrics (PSNR, SSIM, LPIPS), built on first use without touching the RNG."""
        if self._metrics is None:
            with torch.random.fork_rng(devices=[]), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self._metrics = ImageMetrics(lpips_net=self.cfg.metrics.lpips_net, device=self.device)
            for warning in caught:  # e.g. missing LPIPS weights: into the console and train.log, once
                self.logger.warning(str(warning.message))
        return self._metrics

    @torch.no_grad()
    def validation(self) -> dict[str, float | None]:
        """Render every validation view, compute metrics and fill ``val_metrics`` / ``val_results``."""
        if self.datapipeline.num_val == 0:
            return {}
        self.call_hook("before_val")
        results: list[dict[str, Any]] = []
        for index, batch in enumerate(self.datapipeline.val_batches()):
            self.call_hook("before_val_iter", index=index)
            out = self.render(batch.viewmats, batch.Ks, batch.width, batch.height, batch.backgrounds)
            render = out.image[0].clamp(0.0, 1.0)
            metrics = self.metrics(render, batch.images[0])
            outputs = {
                "name": batch.names[0],
                "render": render,
                "gt": batch.images[0],
                "depth": out.depth[0],
                "alpha": out.alpha[0],
                "metrics": metrics,
            }
            self.call_hook("after_val_iter", index=index, outputs=outputs)
            results.append({"name": batch.names[0], **metrics})
        self.val_results = results
        self.val_metrics = mean_metrics(results)
        self.call_hook("after_val")
        return self.val_metrics

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self) -> dict[str, Any]:
        """Everything needed to resume exactly: model, optimisers, schedulers, strategy, hooks, RNG, config."""
        checkpoint = {
            "version": CHECKPOINT_VERSION,
            "step": self.step,
            "params": {k: v.detach().clone() for k, v in self.model.params.items()},
            "optimizers": {k: o.state_dict() for k, o in self.optimizers.items()},
            "schedulers": {k: s.state_dict() for k, s in self.schedulers.items()},
            "strategy": self.strategy.state_dict(),
            "hooks": {key: hook.state_dict() for key, hook in self._hook_keys()},
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                "python": random.getstate(),
            },
            "config": self.resolved_config,
            "scene_extent": self.scene_extent,
        }
        self.call_hook("before_save_checkpoint", checkpoint=checkpoint)
        return checkpoint

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore a :meth:`checkpoint` dict into this trainer."""
        if checkpoint.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"checkpoint version {checkpoint.get('version')} is not {CHECKPOINT_VERSION}")
        for name in PARAM_NAMES:
            self.model.params[name] = torch.nn.Parameter(checkpoint["params"][name].to(self.device))
        self._build_optimizers()
        for name, state in checkpoint["optimizers"].items():
            self.optimizers[name].load_state_dict(state)
        for name, state in checkpoint["schedulers"].items():
            if name in self.schedulers:
                self.schedulers[name].load_state_dict(state)
        self.strategy.load_state_dict(checkpoint["strategy"])
        hook_states = checkpoint.get("hooks", {})
        for key, hook in self._hook_keys():
            if key in hook_states:
                hook.load_state_dict(hook_states[key])
        rng = checkpoint["rng"]
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        random.setstate(_as_python_rng_state(rng["python"]))
        self.step = int(checkpoint["step"])
        self.call_hook("after_load_checkpoint", checkpoint=checkpoint)

    def resume_or_load(self) -> None:
        """Load the checkpoint ``cfg.resume`` asked for (found and checked when the trainer was built)."""
        if self._resume_from is None:
            return
        path, checkpoint = self._resume_from
        self._resume_from = None
        self.load_checkpoint(checkpoint)
        self.logger.info(f"resumed from {path} at step {self.step}")
        changes = _changed_settings(checkpoint.get("config", {}), self.resolved_config)
        if changes:
            shown = ", ".join(changes[:8]) + (f" and {len(changes) - 8} more" if len(changes) > 8 else "")
            self.logger.info(f"resuming with changed settings: {shown}")
        if self.step >= self.max_steps:
            self.logger.info(f"the checkpoint is already at max_steps ({self.max_steps}); raise max_steps to go on")

    def _hook_keys(self) -> Iterator[tuple[str, Hook]]:
        seen: dict[str, int] = {}
        for hook in self.hooks:
            name = type(hook).__name__
            seen[name] = seen.get(name, -1) + 1
            yield (name if seen[name] == 0 else f"{name}.{seen[name]}"), hook

    # ------------------------------------------------------------------ output

    def write_scalar(self, name: str, value: float, step: int | None = None) -> None:
        for writer in self.writers:
            writer.write_scalar(name, value, self.step if step is None else step)

    def write_image(self, name: str, image: torch.Tensor, step: int | None = None) -> None:
        for writer in self.writers:
            writer.write_image(name, image, self.step if step is None else step)

    def write_histogram(self, name: str, values: torch.Tensor, step: int | None = None) -> None:
        for writer in self.writers:
            writer.write_histogram(name, values, self.step if step is None else step)


def build_model(entry: dict[str, Any], scene: Scene, seed: int, source: str = "config") -> torch.nn.Module:
    """The ``model:`` entry's class, initialised from ``scene`` with its ``from_scene``."""
    args = dict(entry)
    cls = MODEL_REGISTRY.get(args.pop("name"))
    return cls.from_scene(parse_structured(cls.Config, args, source, "model"), scene, seed)


def _changed_settings(old: Any, new: Any, prefix: str = "") -> list[str]:
    """``key: old -> new`` for every leaf of two nested configs that differs."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = list(old) + [k for k in new if k not in old]
        return [c for k in keys for c in _changed_settings(old.get(k), new.get(k), f"{prefix}{k}.")]
    return [] if old == new else [f"{prefix[:-1]}: {old} -> {new}"]


def _check_top_level(cfg: DefaultTrainer.Config, source: str) -> None:
    if cfg.max_steps < 1:
        raise ConfigError(f"{source}: key 'max_steps': must be >= 1, got {cfg.max_steps}")
    if cfg.val_interval < 1:
        raise ConfigError(f"{source}: key 'val_interval': must be >= 1, got {cfg.val_interval}")
    if not 0 <= cfg.loss.ssim_lambda <= 1:  # also refuses NaN
        raise ConfigError(f"{source}: key 'loss.ssim_lambda': must be in [0, 1], got {cfg.loss.ssim_lambda}")
    if not (cfg.resume is None or isinstance(cfg.resume, (bool, str))):
        raise ConfigError(f"{source}: key 'resume': must be true, false or a checkpoint path, got {cfg.resume!r}")
    if cfg.metrics.lpips_net not in (*LPIPS_NETS, "none"):
        raise ConfigError(
            f"{source}: key 'metrics.lpips_net': must be one of {', '.join(LPIPS_NETS)} or none, "
            f"got '{cfg.metrics.lpips_net}'"
        )


def resolve_device(name: str, dist: DistributedContext) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"device '{name}' was asked for but CUDA is not available; use device=cpu")
        if name == "cuda" and dist.world_size > 1:
            name = f"cuda:{dist.local_rank}"
    elif name != "cpu":
        raise ConfigError(f"key 'device': must be auto, cpu, cuda or cuda:N, got '{name}'")
    return torch.device(name)


def _resolved_entry(
    registry: Registry, entry: dict[str, Any], source: str, key: str, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A registry entry ``{name, **args}`` with its defaults filled in; keys in ``extra`` pass through."""
    entry = dict(entry)
    if "name" not in entry:
        raise ConfigError(f"{source}: key '{key}': needs a 'name' (one of {', '.join(registry.names())})")
    try:
        cls = registry.get(entry["name"])
    except KeyError as exc:
        raise ConfigError(f"{source}: key '{key}.name': {exc}") from None
    passthrough = {k: entry.pop(k) for k in extra if k in entry}
    name = entry.pop("name")
    return {"name": name, **passthrough, **resolved_entry(cls, entry, source, key)}


def resolve_renderer_entry(entry: dict[str, Any], device: torch.device, source: str) -> dict[str, Any]:
    """``name: auto`` becomes gsplat on CUDA (when installed) and torch elsewhere."""
    entry = dict(entry)
    name = entry.get("name", "auto")
    if name == "auto":
        entry["name"] = "gsplat" if device.type == "cuda" and "gsplat" in RENDERER_REGISTRY else "torch"
    elif name not in RENDERER_REGISTRY:
        known = ", ".join(["auto", *RENDERER_REGISTRY.names()])
        raise ConfigError(f"{source}: key 'renderer.name': unknown renderer '{name}'; known renderers: {known}")
    return _resolved_entry(RENDERER_REGISTRY, entry, source, "renderer")


def _as_python_rng_state(state: Any) -> tuple:
    """``random.setstate`` needs tuples; checkpoints may store lists."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def build_trainer(
    cfg_source: str,
    overrides: list[str] = (),
    resume: bool | str | None = None,
    overwrite: bool = False,
    logger: Logger | None = None,
) -> DefaultTrainer:
    """Load a YAML config (plus ``key=value`` overrides), validate it and build the trainer."""
    source = str(cfg_source) + (" + command line" if overrides else "")
    raw = load_config(cfg_source, overrides)
    import_plugins(list(raw.get("imports", []) or []), source)
    cfg = parse_structured(DefaultTrainer.Config, raw, source=source)
    if resume is not None:
        cfg.resume = resume
    return DefaultTrainer(cfg, source=source, overwrite=overwrite, logger=logger)
