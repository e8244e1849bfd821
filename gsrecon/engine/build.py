"""A run built for a purpose from its config: :func:`build_run`, the one way training, ``eval``, ``export``,
``render``, ``view``, ``lod`` and the block runner assemble one. The config is resolved first
(:mod:`gsrecon.engine.resolve`), the device and threads set (:mod:`gsrecon.engine.runtime`), then the components are
built: the data pipeline, the renderer and the per-view modules for every purpose that draws a scene; for training
also the model, the loss, the strategy and the hooks, and the checks every component makes of the built run
(:func:`check_run`) and their set-up (:func:`setup_run`): the one protocol of every component."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gsrecon.component import RunChecked, RunFacts, RunSetup
from gsrecon.config import ConfigError, parse_structured
from gsrecon.data.blocks import block_scene, plan_partition
from gsrecon.data.pipeline import Batch, DataPipeline
from gsrecon.data.scene import Scene
from gsrecon.distributed import DistributedContext
from gsrecon.engine.hook import Hook
from gsrecon.engine.resolve import (
    RunConfig,
    old_views_notice,
    resolve_renderer_entry,
    resolve_run_config,
    resolve_strategy_entry,
    resolve_views_config,
    view_key,
)
from gsrecon.engine.runtime import resolve_device, set_cpu_threads
from gsrecon.logging.console import Logger
from gsrecon.losses.base import Loss, build_loss
from gsrecon.model.views.base import ViewModules, build_views
from gsrecon.registry import HOOK_REGISTRY, MODEL_REGISTRY, RENDERER_REGISTRY, STRATEGY_REGISTRY
from gsrecon.render.base import Renderer
from gsrecon.render.choice import renderer_on_device

# What a run is built for: training (everything), drawing a trained scene (its data, renderer and per-view modules)
# or the block runner (the config resolved: each block is then built for training).
SCENE_PURPOSES = ("eval", "export", "render", "view", "lod")
PURPOSES = ("train", *SCENE_PURPOSES, "block")


@dataclass
class Run:
    """A run's pieces, built for ``purpose`` (what a purpose leaves unbuilt is None or empty)."""

    cfg: RunConfig
    purpose: str
    source: str  # where the config came from, for messages
    device: torch.device
    threads: str  # what set_cpu_threads chose and why ("" for blocks: each block's training sets them)
    resolved: dict[str, Any]  # the resolved config (training, blocks: all of it; a scene: renderer and views)
    datapipeline: DataPipeline | None = None
    renderer: Renderer | None = None
    views: ViewModules | None = None
    model: torch.nn.Module | None = None
    loss: Loss | None = None
    strategy: Any = None
    hooks: dict[str, Hook] = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)  # warnings for the run's log once it is open (old config keys)


def build_run(
    cfg: RunConfig,
    purpose: str,
    source: str = "config",
    logger: Logger | None = None,
    dist: DistributedContext | None = None,
    device: str = "auto",
    claim: Callable[[dict[str, Any]], None] | None = None,
    views_state: dict[str, Any] | None = None,
    median_depth: bool = False,
) -> Run:
    """``cfg``'s run built for ``purpose`` (one of :data:`PURPOSES`) on ``device`` (``auto``: ``cfg.device``).

    Training resolves the whole config first (unknown names and bad arguments fail before any work), builds the
    hooks, calls ``claim`` with the resolved config (the trainer takes its run folder there, before anything slow),
    then the data pipeline (the partition's block where ``partition.block`` is set), the model, the loss, the
    renderer, the per-view modules, the strategy, lets every component check the run, then sets each up
    (:func:`setup_run`). A trained scene's purposes build the whole capture's data pipeline, the renderer that draws
    it on the device (:func:`~gsrecon.render.choice.renderer_on_device`, rendering the median depth too with
    ``median_depth``; set up without the run's data) and the per-view modules holding ``views_state`` (on the CPU;
    not set up: they only render); the threads line goes to ``logger``. ``block`` resolves the config only.
    """
    if purpose not in PURPOSES:
        raise ValueError(f"unknown purpose '{purpose}'; one of {', '.join(PURPOSES)}")
    logger = logger or Logger()
    dist = dist or DistributedContext()
    torch_device = resolve_device(device if device != "auto" else cfg.device, dist)
    if purpose == "block":  # each block's training sets the threads (and says so in its log)
        return Run(cfg, purpose, source, torch_device, "", resolve_run_config(cfg, torch_device, source))
    threads = set_cpu_threads(cfg.num_threads)
    if purpose in SCENE_PURPOSES:
        logger.info(threads)
        return _scene_run(cfg, purpose, source, logger, torch_device, threads, views_state or {}, median_depth)
    run = Run(cfg, purpose, source, torch_device, threads, resolve_run_config(cfg, torch_device, source, logger.info))
    run.hooks = build_hooks(run.resolved["hooks"], source)
    if claim is not None:
        claim(run.resolved)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    run.datapipeline = build_datapipeline(cfg, torch_device, dist, source)
    from gsrecon.data.prepare.triangulate import attach_triangulation  # training only: inference stays light

    attach_triangulation(run.datapipeline.scene)
    run.model = build_model(run.resolved["model"], run.datapipeline.scene, cfg.seed, source, logger)
    run.model.to(torch_device)
    dist.broadcast_params(run.model.params)
    run.loss = build_loss(run.resolved["loss"], source)
    run.renderer = RENDERER_REGISTRY.build(run.resolved["renderer"])
    train_names = [frame.name for frame in run.datapipeline.scene.train]
    run.views = build_views(run.resolved, train_names, torch_device, source)
    run.strategy = build_strategy(cfg, run.resolved, run.model, source)
    facts = run_facts(run.resolved, run.model, run.datapipeline.scene)
    components = run_components(cfg, run.model, run.renderer, run.strategy, run.loss, run.views, run.hooks)
    check_run(components, facts, source)
    setup_run(components, RunSetup(logger.info, run.datapipeline, training_draw(run), run.renderer))
    run.notices = [notice for notice in (old_views_notice(cfg, source),) if notice is not None]
    return run


def training_draw(run: Run) -> Callable[[Mapping[str, torch.Tensor], Batch, int], torch.Tensor]:
    """``run``'s image of a batch as its loss sees it at a step (:attr:`~gsrecon.component.RunSetup.draw`): the
    cameras adjusted by the per-view modules, the renderer at the step's SH degree, the modules' composite and image
    adjustment (the trainer's own step draws the same)."""

    def draw(params: Mapping[str, torch.Tensor], batch: Batch, step: int) -> torch.Tensor:
        batch = run.views.adjust_cameras(batch)
        out = run.views.composite(run.renderer.render_batch(params, batch, run.model.active_sh_degree(step)), batch)
        return run.views.adjust_image(out.image, batch)

    return draw


def _scene_run(
    cfg: RunConfig,
    purpose: str,
    source: str,
    logger: Logger,
    device: torch.device,
    threads: str,
    views_state: dict[str, Any],
    median_depth: bool,
) -> Run:
    """:func:`build_run` for a trained scene's purposes."""
    pipeline = DataPipeline(cfg.data, device, cfg.seed, source=source)
    entry = scene_renderer_entry(cfg, device, logger, median_depth)
    renderer = build_renderer(entry, logger)
    resolved = {"renderer": entry, **resolve_views_config(cfg, source)}
    views = build_views(resolved, [frame.name for frame in pipeline.scene.train], torch.device("cpu"), source)
    views.load_state_dict(views_state)
    return Run(cfg, purpose, source, device, threads, resolved, pipeline, renderer, views)


def scene_renderer_entry(
    cfg: RunConfig, device: torch.device, logger: Logger, median_depth: bool = False
) -> dict[str, Any]:
    """The renderer entry a scene trained with ``cfg`` draws with on ``device`` (``auto`` resolved for it; another
    where the trained one cannot run there: :func:`~gsrecon.render.choice.renderer_on_device`), rendering the
    median depth too with ``median_depth``."""
    entry = renderer_on_device(resolve_renderer_entry(cfg.renderer, device, "config", logger.info), device, logger.info)
    return {**entry, "median_depth": True} if median_depth else entry


def build_renderer(entry: dict[str, Any], logger: Logger) -> Renderer:
    """The renderer of a resolved ``entry``, set up (its kernels built or loaded, saying so through ``logger``)."""
    renderer = RENDERER_REGISTRY.build(entry)
    renderer.setup(RunSetup(logger.info))
    return renderer


def run_facts(resolved: dict[str, Any], model: torch.nn.Module, scene: Scene) -> RunFacts:
    """What the components of a run built from ``resolved`` check it against (:func:`check_run`)."""
    return RunFacts(
        resolved, model.num_gaussians, sfm_tracks=bool(scene.observed),
        depth_maps=any(frame.depth is not None for frame in scene.train),
    )  # fmt: skip


def run_components(
    cfg: RunConfig,
    model: RunChecked,
    renderer: RunChecked,
    strategy: RunChecked,
    loss: Loss,
    views: ViewModules,
    hooks: Mapping[str, RunChecked],
) -> dict[str, RunChecked]:
    """A built run's components by the config key that configures each (what :func:`check_run` names)."""
    return {
        "model": model,
        "renderer": renderer,
        "strategy": strategy,
        **{f"loss.{key}": term for key, term in loss.terms.items()},
        **{view_key(cfg, key): module for key, module in views.modules.items()},
        **{f"hooks.{key}": hook for key, hook in hooks.items()},
    }


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


def build_datapipeline(cfg: RunConfig, device: torch.device, dist: DistributedContext, source: str) -> DataPipeline:
    """The run's datapipeline: the whole scene, or for a block of a partition (``partition.block``) its part."""
    if cfg.partition.block is None:
        return DataPipeline(cfg.data, device, cfg.seed, dist.rank, dist.world_size, source=source)
    index, count = cfg.partition.block, cfg.partition.num_blocks

    def select(scene: Scene) -> tuple[Scene, str]:
        block = plan_partition(scene, cfg.partition).blocks[index]
        return block_scene(scene, block), f"one of {count} blocks of the capture: {block.describe()}"

    return DataPipeline(cfg.data, device, cfg.seed, dist.rank, dist.world_size, select, source)


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
