"""The builders of a run, one per concern, from which every command assembles one: the data
(:func:`build_datapipeline`), the renderer (:func:`build_renderer`, :func:`build_scene_renderer`), the per-view modules
(:func:`build_view_modules`), the model, the loss, the strategy, the hooks and the training state (optimisers,
schedulers and the strategy's state: :func:`build_training_state`). :func:`build_training_run` assembles a training run
and :func:`build_scene_run` a trained scene's (``eval``, ``export``, ``render``, ``view``, ``lod``), both checked by
their components (:func:`check_run`); :func:`resolve_run` resolves a config only (the block runner and the merge). The
config is resolved first (:mod:`gsrecon.engine.resolve`), the device and threads set (:mod:`gsrecon.engine.runtime`)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gsrecon.component import RunChecked, RunFacts, RunSetup
from gsrecon.config import ConfigError, parse_structured
from gsrecon.data.blocks import PartitionConfig, block_scene, plan_partition
from gsrecon.data.pipeline import Batch, DataPipeline
from gsrecon.data.scene import Scene
from gsrecon.distributed import DistributedContext
from gsrecon.engine.forward import TrainingForward
from gsrecon.engine.hook import Hook
from gsrecon.engine.resolve import (
    RunConfig,
    old_views_notice,
    resolve_data_config,
    resolve_renderer_entry,
    resolve_run_config,
    resolve_strategy_entry,
    resolve_views_config,
    settle_auto_renderer,
    view_key,
)
from gsrecon.engine.runtime import resolve_device, set_cpu_threads
from gsrecon.logging.console import Logger
from gsrecon.losses.base import Loss, build_loss
from gsrecon.model.optim import Optimizers, Schedulers, build_optimizers, build_schedulers
from gsrecon.model.views.base import ViewModules, build_views
from gsrecon.registry import HOOK_REGISTRY, MODEL_REGISTRY, RENDERER_REGISTRY, STRATEGY_REGISTRY
from gsrecon.render.base import Renderer
from gsrecon.render.choice import renderer_on_device


@dataclass
class TrainingState:
    """What training changes besides the Gaussians and the per-view modules: the optimisers (by parameter group),
    their schedulers and the strategy's state; one owner (the trainer) holds it."""

    optimizers: Optimizers
    schedulers: Schedulers
    strategy_state: dict[str, Any]


@dataclass
class TrainingRun:
    """A training run's pieces (:func:`build_training_run`)."""

    cfg: RunConfig
    source: str  # where the config came from, for messages
    device: torch.device
    threads: str  # what set_cpu_threads chose and why
    resolved: dict[str, Any]  # the resolved config: what config.yaml holds
    datapipeline: DataPipeline
    model: torch.nn.Module
    loss: Loss
    renderer: Renderer
    views: ViewModules
    strategy: Any
    state: TrainingState
    hooks: dict[str, Hook]
    forward: TrainingForward  # a step's render and loss terms
    notices: list[str] = field(default_factory=list)  # warnings for the run's log once it is open (old config keys)


@dataclass
class SceneRun:
    """What draws a trained scene (:func:`build_scene_run`): its capture's data, a renderer and its per-view modules."""

    cfg: RunConfig
    source: str
    device: torch.device
    resolved: dict[str, Any]  # the resolved data, renderer and views sections
    datapipeline: DataPipeline
    renderer: Renderer
    views: ViewModules


def resolve_run(
    cfg: RunConfig, source: str, dist: DistributedContext | None = None
) -> tuple[torch.device, dict[str, Any]]:
    """``cfg``'s device and its config resolved (:func:`~gsrecon.engine.resolve.resolve_run_config`), nothing
    built: what the block runner and the merge need before each block's training builds its own run."""
    device = resolve_device(cfg.device, dist or DistributedContext())
    return device, resolve_run_config(cfg, device, source)


def build_training_run(
    cfg: RunConfig,
    source: str,
    logger: Logger,
    dist: DistributedContext,
    claim: Callable[[dict[str, Any]], None] | None = None,
) -> TrainingRun:
    """``cfg``'s training run on ``cfg.device``: the whole config resolved first (unknown names and bad arguments fail
    before any work), the hooks, then ``claim`` called with the resolved config (the trainer takes its run folder
    there, before anything slow: the ``cpu`` renderer's kernels are built only after it,
    :func:`~gsrecon.engine.resolve.settle_auto_renderer`), then the data pipeline, the model, the loss, the renderer,
    the per-view modules, the strategy and the training state; every component checks the run, then each is set up
    (:func:`setup_run`), and a step's forward is put together from them
    (:class:`~gsrecon.engine.forward.TrainingForward`)."""
    device = resolve_device(cfg.device, dist)
    threads = set_cpu_threads(cfg.num_threads)
    resolved = resolve_run_config(cfg, device, source, logger.info)
    hooks = build_hooks(resolved["hooks"], source)
    if claim is not None:
        claim(resolved)
    resolved["renderer"] = settle_auto_renderer(cfg, resolved, source, logger.info)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    pipeline = build_datapipeline(cfg.data, device, cfg.seed, source, dist, cfg.partition)
    from gsrecon.data.prepare.triangulate import attach_triangulation  # training only: inference stays light

    attach_triangulation(pipeline.scene)
    model = build_model(resolved["model"], pipeline.scene, cfg.seed, source, logger)
    model.to(device)
    dist.broadcast_params(model.params)
    loss = build_loss(resolved["loss"], source)
    renderer = RENDERER_REGISTRY.build(resolved["renderer"])
    views = build_view_modules(resolved, pipeline.scene, device, source)
    strategy = build_strategy(cfg, resolved, model, source)
    components = {
        "model": model, "renderer": renderer, "strategy": strategy,
        **{f"loss.{key}": term for key, term in loss.terms.items()},
        **view_components(cfg, views), **{f"hooks.{key}": hook for key, hook in hooks.items()},
    }  # fmt: skip
    check_run(components, run_facts(resolved, model.num_gaussians, pipeline.scene), source)
    draw = training_draw(renderer, views, model)
    setup_run(components, RunSetup(logger.info, pipeline, draw, renderer.compiled, renderer.render))
    state = build_training_state(cfg, model, renderer, strategy, pipeline.scene.extent, dist.world_size)
    notices = [notice for notice in (old_views_notice(cfg, source),) if notice is not None]
    forward = TrainingForward(renderer, views, loss, pipeline)
    return TrainingRun(
        cfg, source, device, threads, resolved, pipeline, model, loss, renderer, views, strategy, state, hooks,
        forward, notices,
    )  # fmt: skip


def build_scene_run(
    cfg: RunConfig,
    source: str,
    logger: Logger,
    num_gaussians: int,
    device: str = "auto",
    views_state: dict[str, Any] | None = None,
    median_depth: bool = False,
) -> SceneRun:
    """The run that draws a scene of ``num_gaussians`` trained with ``cfg`` on ``device`` (``auto``: ``cfg.device``):
    the whole capture's data pipeline, the renderer that draws it there (:func:`build_scene_renderer`, rendering the
    median depth too with ``median_depth``) and the per-view modules holding ``views_state`` (on the CPU; not set up:
    they only render), checked by each of them as a training run is (:func:`check_run`); the threads line goes to
    ``logger``."""
    torch_device = resolve_device(device if device != "auto" else cfg.device, DistributedContext())
    logger.info(set_cpu_threads(cfg.num_threads))
    pipeline = build_datapipeline(cfg.data, torch_device, cfg.seed, source)
    entry = scene_renderer_entry(cfg, torch_device, logger, median_depth)
    renderer = build_renderer(entry, logger)
    resolved = {"data": resolve_data_config(cfg.data, source), "renderer": entry, **resolve_views_config(cfg, source)}
    views = build_view_modules(resolved, pipeline.scene, torch.device("cpu"), source, views_state)
    components = {"renderer": renderer, **view_components(cfg, views)}
    check_run(components, run_facts(resolved, num_gaussians, pipeline.scene), source)
    return SceneRun(cfg, source, torch_device, resolved, pipeline, renderer, views)


def training_draw(
    renderer: Renderer, views: ViewModules, model: torch.nn.Module
) -> Callable[[Mapping[str, torch.Tensor], Batch, int], torch.Tensor]:
    """A training run's image of a batch as its loss sees it at a step (:attr:`~gsrecon.component.RunSetup.draw`):
    the cameras adjusted by the per-view modules ``views``, ``renderer`` at ``model``'s SH degree of the step, the
    modules' composite and image adjustment (the trainer's own step draws the same)."""

    def draw(params: Mapping[str, torch.Tensor], batch: Batch, step: int) -> torch.Tensor:
        batch = views.adjust_cameras(batch)
        out = views.composite(renderer.render_batch(params, batch, model.active_sh_degree(step)), batch)
        return views.adjust_image(out.image, batch, out)

    return draw


def scene_renderer_entry(
    cfg: RunConfig, device: torch.device, logger: Logger, median_depth: bool = False
) -> dict[str, Any]:
    """The renderer entry a scene trained with ``cfg`` draws with on ``device`` (``auto`` resolved for it; another
    where the trained one cannot run there: :func:`~gsrecon.render.choice.renderer_on_device`), rendering the
    median depth too with ``median_depth``."""
    entry = renderer_on_device(resolve_renderer_entry(cfg.renderer, device, "config", logger.info), device, logger.info)
    return {**entry, "median_depth": True} if median_depth else entry


def build_renderer(entry: dict[str, Any], logger: Logger, data: DataPipeline | None = None) -> Renderer:
    """The renderer of a resolved ``entry``, set up (its kernels built or loaded, saying so through ``logger``; the
    run's ``data`` where it has one)."""
    renderer = RENDERER_REGISTRY.build(entry)
    renderer.setup(RunSetup(logger.info, data))
    return renderer


def build_scene_renderer(cfg: RunConfig, device: torch.device, logger: Logger, median_depth: bool = False) -> Renderer:
    """The renderer, set up, that draws a scene trained with ``cfg`` on ``device`` (:func:`scene_renderer_entry`)."""
    return build_renderer(scene_renderer_entry(cfg, device, logger, median_depth), logger)


def build_view_modules(
    resolved: dict[str, Any],
    scene: Scene,
    device: torch.device,
    source: str,
    state: Mapping[str, Any] | None = None,
) -> ViewModules:
    """The per-view modules of a resolved config (its ``views``) for ``scene``'s training views, on ``device``,
    holding a checkpoint's ``state`` where given."""
    views = build_views(resolved, [frame.name for frame in scene.train], device, source)
    if state is not None:
        views.load_state_dict(dict(state))
    return views


def build_training_state(
    cfg: RunConfig, model: torch.nn.Module, renderer: Renderer, strategy: Any, scene_extent: float, world_size: int
) -> TrainingState:
    """Fresh optimisers for ``model``'s parameters (row-sparse Adam when the renderer gives sparse gradients; the
    learning rates of a batch over ``world_size`` processes), their schedulers and the strategy's state."""
    global_batch = cfg.data.batch_size * world_size
    optimizers = build_optimizers(model.params, cfg.optimizer, scene_extent, global_batch, renderer.sparse_grad)
    schedulers = build_schedulers(optimizers, cfg.scheduler, cfg.max_steps)
    return TrainingState(optimizers, schedulers, strategy.initialize_state(scene_extent))


def run_facts(resolved: dict[str, Any], num_gaussians: int, scene: Scene) -> RunFacts:
    """What the components of a run built from ``resolved`` check it against (:func:`check_run`)."""
    return RunFacts(
        resolved, num_gaussians, sfm_tracks=bool(scene.observed),
        depth_maps=any(frame.depth is not None for frame in scene.train),
    )  # fmt: skip


def view_components(cfg: RunConfig, views: ViewModules) -> dict[str, RunChecked]:
    """A run's per-view modules by the config key that configures each (what :func:`check_run` names)."""
    return {view_key(cfg, key): module for key, module in views.modules.items()}


def check_run(components: Mapping[str, RunChecked], run: RunFacts, source: str) -> None:
    """Let every component of a built run refuse it (:meth:`~gsrecon.component.RunChecked.check`, ``components`` by
    the config keys that configure them); a refusal is a ConfigError naming the key and the file."""
    for key, component in components.items():
        try:
            component.check(run)
        except ValueError as exc:
            raise ConfigError(f"{source}: key '{key}': {exc}") from exc


def setup_run(components: Mapping[str, RunChecked], run: RunSetup) -> None:
    """Set up every component of a run that all of them accepted (:meth:`~gsrecon.component.RunChecked.setup`), in
    the order of ``components``."""
    for component in components.values():
        component.setup(run)


def describe_run(
    cfg: RunConfig, resolved: dict[str, Any], source: str, threads: str, device: torch.device, notes: Sequence[str]
) -> str:
    """A run's first log line: its config, ``threads`` (:func:`set_cpu_threads`' line), the device, the renderer
    (and whether ``auto`` chose it) and the data pipeline's ``notes``."""
    how = " (auto)" if cfg.renderer.get("name", "auto") == "auto" else ""
    run = f"{source}: {threads}; device {device}; renderer {resolved['renderer']['name']}{how}"
    return "; ".join([run, *notes])


def build_hooks(resolved: dict[str, dict[str, Any] | None], source: str = "config") -> dict[str, Hook]:
    """Hook objects from :func:`resolve_hooks` entries (removed ones skipped), keyed and ordered as given."""
    hooks = {}
    for key, entry in resolved.items():
        if entry is None:
            continue
        args = {k: v for k, v in entry.items() if k != "priority"}
        try:
            hook = HOOK_REGISTRY.build({"name": key, **args})
        except ValueError as exc:
            raise ConfigError(f"{source}: key 'hooks.{key}': {exc}") from exc
        hook.priority = entry["priority"]
        hooks[key] = hook
    return hooks


def build_strategy(cfg: RunConfig, resolved: dict[str, Any], model: torch.nn.Module, source: str) -> Any:
    """The run's strategy, its entry resolved again (into ``resolved``) now that the model's start is known, since
    some defaults differ for random points (``per_start``)."""
    resolved["strategy"] = resolve_strategy_entry(cfg, source, getattr(model, "start", None))
    return STRATEGY_REGISTRY.build(resolved["strategy"])


def build_datapipeline(
    data: DataPipeline.Config,
    device: torch.device,
    seed: int,
    source: str,
    dist: DistributedContext | None = None,
    partition: PartitionConfig | None = None,
) -> DataPipeline:
    """The data pipeline of ``data`` (``dist``: the process's share of the training views): the whole scene, or where
    ``partition.block`` is set that block's part."""
    dist = dist or DistributedContext()
    if partition is None or partition.block is None:
        return DataPipeline(data, device, seed, dist.rank, dist.world_size, source=source)
    index, count = partition.block, partition.num_blocks

    def select(scene: Scene) -> tuple[Scene, str]:
        block = plan_partition(scene, partition).blocks[index]
        return block_scene(scene, block), f"one of {count} blocks of the capture: {block.describe()}"

    return DataPipeline(data, device, seed, dist.rank, dist.world_size, select, source)


def build_model(
    entry: dict[str, Any], scene: Scene, seed: int, source: str = "config", logger: Logger | None = None
) -> torch.nn.Module:
    """The ``model:`` entry's class, initialised from ``scene`` with its ``from_scene``.

    With ``init: auto``, a scene without points whose reader can triangulate them (``Scene.triangulate``) gets
    them first (:func:`~gsrecon.data.prepare.triangulate.points_from_poses`), its progress logged to ``logger``.
    """
    args = dict(entry)
    cls = MODEL_REGISTRY.get(args.pop("name"))
    cfg = parse_structured(cls.Config, args, source, "model")
    if getattr(cfg, "init", None) == "auto" and len(scene.points) == 0 and scene.triangulate is not None:
        from gsrecon.data.prepare.triangulate import points_from_poses  # training only: inference stays light

        points_from_poses(scene, (logger or Logger()).info)
    return cls.from_scene(cfg, scene, seed)
