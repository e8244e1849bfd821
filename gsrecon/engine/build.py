"""A run's components built from its resolved config (:mod:`gsrecon.engine.resolve`): the data pipeline, the model,
the strategy and the hooks, the checks every component makes of the built run (:func:`check_run`, the one protocol
of every component) and the run's first log line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from gsrecon.config import ConfigError, parse_structured
from gsrecon.data.blocks import block_scene, plan_partition
from gsrecon.data.pipeline import DataPipeline
from gsrecon.data.prepare.triangulate import points_from_poses
from gsrecon.data.scene import Scene
from gsrecon.distributed import DistributedContext
from gsrecon.engine.hook import Hook
from gsrecon.engine.resolve import RunConfig, resolve_strategy_entry
from gsrecon.logging.console import Logger
from gsrecon.losses.base import Loss
from gsrecon.model.views.base import VIEW_SECTIONS, ViewModules
from gsrecon.registry import HOOK_REGISTRY, MODEL_REGISTRY, STRATEGY_REGISTRY, RunChecked, RunFacts


def run_facts(resolved: dict[str, Any], model: torch.nn.Module, scene: Scene) -> RunFacts:
    """What the components of a run built from ``resolved`` check it against (:func:`check_run`)."""
    return RunFacts(
        resolved, model.num_gaussians, sfm_tracks=bool(scene.observed),
        depth_maps=any(frame.depth is not None for frame in scene.train),
    )  # fmt: skip


def run_components(
    model: RunChecked,
    renderer: RunChecked,
    strategy: RunChecked,
    loss: Loss,
    views: ViewModules,
    hooks: Mapping[str, RunChecked],
) -> dict[str, RunChecked]:
    """A built run's components by the config key that configures each (what :func:`check_run` names)."""
    view_keys = {key: key if key in VIEW_SECTIONS else f"views.{key}" for key in views.modules}
    return {
        "model": model,
        "renderer": renderer,
        "strategy": strategy,
        **{f"loss.{key}": term for key, term in loss.terms.items()},
        **{view_keys[key]: module for key, module in views.modules.items()},
        **{f"hooks.{key}": hook for key, hook in hooks.items()},
    }


def check_run(components: Mapping[str, RunChecked], run: RunFacts, source: str) -> None:
    """Let every component of a built run refuse it (:meth:`~gsrecon.registry.RunChecked.check`, ``components`` by
    the config keys that configure them); a refusal is a ConfigError naming the key and the file."""
    for key, component in components.items():
        try:
            component.check(run)
        except ValueError as exc:
            raise ConfigError(f"{source}: key '{key}': {exc}") from exc


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
        points_from_poses(scene, (logger or Logger()).info)
    return cls.from_scene(cfg, scene, seed)
