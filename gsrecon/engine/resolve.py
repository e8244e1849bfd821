"""A run's config resolved: :class:`RunConfig` (the schema of a run's YAML), its layers (a YAML on top of the default
hooks and loss, plus ``key=value`` overrides), every registry entry with its defaults filled in (unknown names and bad
arguments refused before any work, each error naming the key and the file), the per-view modules' aliases, checked
by the rules between two components (:mod:`gsrecon.engine.rules`). What ``<exp_dir>/config.yaml`` holds comes from here.

Nothing here imports the trainer, the built-in hooks or the strategies: a registry imports its built-ins when an
entry is first looked up, so ``gsrecon eval/export/render`` stay light.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from gsrecon.config import ConfigError, entry_map, load_config, parse_structured, resolved_entry, to_container
from gsrecon.data.blocks import PartitionConfig
from gsrecon.data.pipeline import DataPipeline
from gsrecon.engine.hook import get_priority
from gsrecon.engine.rules import check_rules, with_strategy_absgrad
from gsrecon.losses.base import DEFAULT_LOSS
from gsrecon.lpips_weights import LPIPS_NETS
from gsrecon.metrics import MetricsConfig
from gsrecon.model.optim import OptimizerConfig, SchedulerConfig
from gsrecon.model.views.base import VIEW_SECTIONS, fold_view_section
from gsrecon.registry import (
    DATASET_REGISTRY,
    HOOK_REGISTRY,
    LOSS_REGISTRY,
    MODEL_REGISTRY,
    RENDERER_REGISTRY,
    STRATEGY_REGISTRY,
    VIEW_REGISTRY,
    WRITER_REGISTRY,
    Registry,
    RegistryError,
)
from gsrecon.render.choice import auto_renderer, cpu_or_torch, preferred_renderer

# The hooks of a run whose YAML lists none; a YAML's `hooks:` adds to, reconfigures or removes (null) these.
DEFAULT_HOOKS: dict[str, dict[str, Any]] = {
    "IterTimerHook": {},
    "CheckInvalidLossHook": {},
    "LogHook": {},
    "MetricsHook": {},
    "CheckPointHook": {},
    "ExportHook": {},
}


@dataclass
class RunConfig:
    """One training run, as written in its YAML (the schema of ``DefaultTrainer.Config``)."""

    exp_dir: str = "outputs/run"
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps (an Apple GPU, where torch reports one)
    num_threads: int = 0  # torch CPU threads; 0: auto (the cores other processes leave free, at least 1)
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
    loss: Any = None  # {term key: {weight, ...options}} (see gsrecon.losses.base); None: DEFAULT_LOSS
    # The per-view modules, {key: {name, ...options}} (see gsrecon.model.views.base): views.appearance (none | affine |
    # bilateral_grid) and views.pose_opt (camera pose refinement: none | se3), and any more
    views: Any = None
    # The old shape of views.appearance and views.pose_opt ({name or its alias mode, ...options}): read for one
    # release, with a notice
    appearance: dict[str, Any] = field(default_factory=dict)
    pose_opt: dict[str, Any] = field(default_factory=dict)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    writers: list[dict[str, Any]] = field(default_factory=lambda: [{"name": "TensorboardWriter"}])
    hooks: Any = None  # {entry key: arguments} (see gsrecon.config); None: DEFAULT_HOOKS
    partition: PartitionConfig = field(default_factory=PartitionConfig)  # block training (gsrecon.partition)

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"key 'max_steps': must be >= 1, got {self.max_steps}")
        if self.val_interval < 1:
            raise ValueError(f"key 'val_interval': must be >= 1, got {self.val_interval}")
        if self.num_threads < 0:
            raise ValueError(f"key 'num_threads': must be 0 (auto) or a number of threads >= 1, got {self.num_threads}")
        if not (self.resume is None or isinstance(self.resume, (bool, str))):
            raise ValueError(f"key 'resume': must be true, false or a checkpoint path, got {self.resume!r}")
        if self.metrics.lpips_net not in (*LPIPS_NETS, "none"):
            raise ValueError(
                f"key 'metrics.lpips_net': must be one of {', '.join(LPIPS_NETS)} or none, "
                f"got '{self.metrics.lpips_net}'"
            )


def load_run_config(path: str, overrides: Sequence[str] = ()) -> tuple[RunConfig, str]:
    """A run's YAML (on top of :data:`DEFAULT_HOOKS`) plus ``key=value`` overrides, validated.

    Returns the config and a description of its source for messages.
    """
    source = str(path) + (" + command line" if overrides else "")
    raw = load_config(path, overrides, defaults={"hooks": DEFAULT_HOOKS, "loss": DEFAULT_LOSS})
    return parse_structured(RunConfig, raw, source=source), source


def resolve_entry(
    registry: Registry,
    entry: dict[str, Any],
    source: str,
    key: str,
    extra: tuple[str, ...] = (),
    max_steps: int | None = None,
    device: torch.device | None = None,
    start: str | None = None,
) -> dict[str, Any]:
    """A registry entry ``{name, **args}`` with its defaults filled in (step counts the entry leaves
    unset scaled to ``max_steps``, see :func:`gsrecon.config.run_steps`; device-dependent ones for
    ``device``, see :func:`gsrecon.config.per_device`; start-dependent ones for the Gaussians' ``start``,
    see :func:`gsrecon.config.per_start`); keys in ``extra`` pass through."""
    entry = dict(entry)
    if "name" not in entry:
        raise ConfigError(f"{source}: key '{key}': needs a 'name' (one of {', '.join(registry.names())})")
    try:
        cls = registry.get(entry["name"])
    except RegistryError as exc:
        raise ConfigError(f"{source}: key '{key}.name': {exc}") from None
    passthrough = {k: entry.pop(k) for k in extra if k in entry}
    name = entry.pop("name")
    device_type = device.type if device is not None else None
    return {"name": name, **passthrough, **resolved_entry(cls, entry, source, key, max_steps, device_type, start)}


def resolve_renderer_entry(
    entry: dict[str, Any], device: torch.device, source: str, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """``name: auto`` becomes :func:`auto_renderer`'s choice for ``device`` (what it builds or why it falls back
    is said through ``log``)."""
    entry = dict(entry)
    name = entry.get("name", "auto")
    if name == "auto":
        entry["name"] = auto_renderer(device, log)
    elif name not in RENDERER_REGISTRY:
        known = ", ".join(["auto", *RENDERER_REGISTRY.names()])
        raise ConfigError(f"{source}: key 'renderer.name': unknown renderer '{name}'; known renderers: {known}")
    return resolve_entry(RENDERER_REGISTRY, entry, source, "renderer")


def resolve_hooks(hooks: Any, source: str, max_steps: int | None = None) -> dict[str, dict[str, Any] | None]:
    """The ``hooks:`` entries with defaults and priorities filled in (step counts left unset scaled to
    ``max_steps``, see :func:`gsrecon.config.run_steps`), in the order they run.

    Order: priority (the entry's ``priority``, else the class's), then listing order. Each value is
    ``{name (when it differs from the key), priority, **arguments}``; a default hook the config
    removed follows as ``key: None``, so that the resolved config, read again, removes it again.
    """
    entries = DEFAULT_HOOKS if hooks is None else entry_map(hooks, "hooks", source)
    resolved: list[tuple[int, int, str, dict[str, Any]]] = []
    for index, (key, args) in enumerate(entries.items()):
        if args is None:
            continue
        args = {"name": key, **args}
        try:
            cls = HOOK_REGISTRY.get(args["name"])
        except RegistryError as exc:
            present = ", ".join(k for k in entries if k != key) or "none"
            raise ConfigError(f"{source}: key 'hooks.{key}': {exc}; this config's other hooks: {present}") from None
        entry = resolve_entry(HOOK_REGISTRY, args, source, f"hooks.{key}", extra=("priority",), max_steps=max_steps)
        try:
            priority = get_priority(entry.pop("priority", cls.priority))
        except ValueError as exc:
            raise ConfigError(f"{source}: key 'hooks.{key}.priority': {exc}") from None
        name = entry.pop("name")
        resolved.append(
            (priority, index, key, {**({"name": name} if name != key else {}), "priority": priority, **entry})
        )
    running = {key: entry for _, _, key, entry in sorted(resolved, key=lambda t: (t[0], t[1]))}
    return {**running, **{key: None for key in DEFAULT_HOOKS if key not in running}}


def resolve_run_config(
    cfg: RunConfig, device: torch.device, source: str, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """The run's config as plain data with every registry entry resolved: what ``config.yaml`` holds, ``renderer.name:
    auto`` as the renderer it prefers on ``device`` (:func:`~gsrecon.render.choice.preferred_renderer`: nothing is
    built here; :func:`settle_auto_renderer` builds the ``cpu`` renderer's kernels once the run folder is claimed).
    ``log`` hears what resolving an entry needs to say."""
    resolved = to_container(cfg)
    for key in ("resume", *VIEW_SECTIONS):  # the old shape's sections: read into views
        resolved.pop(key)
    resolved["data"] = resolve_data_config(cfg.data, source)
    resolved["model"] = resolve_entry(
        MODEL_REGISTRY, cfg.model, source, "model", max_steps=cfg.max_steps, device=device
    )
    resolved["strategy"] = resolve_strategy_entry(cfg, source)
    auto = cfg.renderer.get("name", "auto") == "auto"
    planned = {**cfg.renderer, "name": preferred_renderer(device)} if auto else cfg.renderer
    renderer = resolve_renderer_entry(planned, device, source, log)
    resolved["renderer"] = with_strategy_absgrad(renderer, resolved["strategy"], cfg.renderer, source)
    resolved["writers"] = [resolve_entry(WRITER_REGISTRY, w, source, f"writers.{i}") for i, w in enumerate(cfg.writers)]
    resolved["hooks"] = resolve_hooks(cfg.hooks, source, cfg.max_steps)
    resolved["loss"] = resolve_entry_map(LOSS_REGISTRY, cfg.loss, DEFAULT_LOSS, source, "loss", cfg.max_steps)
    resolved.update(resolve_views_config(cfg, source))
    check_rules(resolved, source, lambda key: view_key(cfg, key))
    return resolved


def settle_auto_renderer(
    cfg: RunConfig, resolved: dict[str, Any], source: str, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """The renderer entry of :func:`resolve_run_config`'s ``resolved``, settled: where ``renderer.name: auto`` planned
    the ``cpu`` renderer, its kernels built (or loaded) now, and where they cannot be the torch renderer in its place
    (:func:`~gsrecon.render.choice.cpu_or_torch`; ``log`` hears the build and why)."""
    planned = resolved["renderer"]
    if cfg.renderer.get("name", "auto") != "auto" or planned["name"] != "cpu" or cpu_or_torch(log) == "cpu":
        return planned
    torch_entry = resolve_renderer_entry({**cfg.renderer, "name": "torch"}, torch.device("cpu"), source)
    return with_strategy_absgrad(torch_entry, resolved["strategy"], cfg.renderer, source)


def resolve_views_config(cfg: RunConfig, source: str) -> dict[str, Any]:
    """The per-view modules' part of the resolved config: ``{"views": {key: entry}}``, where the keys of
    :data:`VIEW_SECTIONS` (``appearance``, ``pose_opt``) always appear (``name: none`` when off) and take a module of
    their kind. The old shape's top-level sections of those names are read for one release (``mode``: ``name``'s
    alias), merged with the ``views:`` entry of the same key (:func:`fold_view_section`, :func:`old_views_notice`)."""
    views = entry_map(cfg.views, "views", source) if cfg.views is not None else {}
    old = [section for section in VIEW_SECTIONS if getattr(cfg, section)]
    resolved = {}
    for section, kind in VIEW_SECTIONS.items():
        written, entry = f"views.{section}", dict(views.get(section) or {})
        if section in old:
            written, entry = section, fold_view_section(entry, getattr(cfg, section), section, source)
        resolved[section] = resolve_view_section(entry, source, written, kind, cfg.max_steps)
    others = {key: value for key, value in views.items() if key not in VIEW_SECTIONS}
    resolved.update(resolve_entry_map(VIEW_REGISTRY, others, {}, source, "views", cfg.max_steps))
    return {"views": resolved}


def view_key(cfg: RunConfig, key: str) -> str:
    """The config key that configures the per-view module ``key``, as ``cfg`` wrote it (``views.<key>``, or the old
    shape's section)."""
    return key if key in VIEW_SECTIONS and getattr(cfg, key) else f"views.{key}"


def old_views_notice(cfg: RunConfig, source: str) -> str | None:
    """The one-line notice of a config that uses the old shape's per-view sections (None: it does not)."""
    old = [section for section in VIEW_SECTIONS if getattr(cfg, section)]
    if not old:
        return None
    keys = ", ".join(f"'{section}:' as views.{section}" for section in old)
    return f"{source}: read {keys} (the old keys are read until the next release; write them under views:)"


def resolve_entry_map(
    registry: Registry,
    value: Any,
    defaults: dict[str, dict[str, Any]],
    source: str,
    key: str,
    max_steps: int | None = None,
) -> dict[str, dict[str, Any] | None]:
    """An entry map (``loss:``, ``views:``; None: ``defaults``) with every entry's defaults filled in, in listing
    order; a default entry the config removed follows as ``key: None``, so that the resolved config, read again,
    removes it again."""
    entries = defaults if value is None else entry_map(value, key, source)
    resolved: dict[str, dict[str, Any] | None] = {}
    for entry_key, args in entries.items():
        if args is not None:
            entry = resolve_entry(
                registry, {"name": entry_key, **args}, source, f"{key}.{entry_key}", max_steps=max_steps
            )
            name = entry.pop("name")
            resolved[entry_key] = {**({"name": name} if name != entry_key else {}), **entry}
    return {**resolved, **{k: None for k in defaults if k not in resolved}}


def resolve_view_section(section: dict[str, Any], source: str, key: str, kind: str, max_steps: int) -> dict[str, Any]:
    """A per-view section (``views.appearance``, or the old shape's ``appearance:``, written ``key``), an entry
    ``{name, ...options}`` (``mode``: the alias of ``name``) naming a VIEW_REGISTRY module of ``kind`` whose options
    fill in the rest; ``none`` turns it off (its other keys are kept as written, for a config that turns it on
    again)."""
    options = dict(section)
    written = "mode" if "mode" in options else "name"
    if "mode" in options and "name" in options:
        raise ConfigError(f"{source}: key '{key}.mode': an alias of {key}.name; give one of them")
    name = options.pop(written, "none")
    if name == "none":
        check_off_section(options, source, key, kind, max_steps)
        return {"name": "none", **options}
    try:
        cls = VIEW_REGISTRY.get(name)
    except RegistryError as exc:
        raise ConfigError(f"{source}: key '{key}.{written}': {exc} (or none)") from None
    if cls.kind != kind:
        fitting = [n for n in VIEW_REGISTRY.names() if VIEW_REGISTRY.get(n).kind == kind]
        what = f"{_article(cls.kind)} {cls.kind} module" if cls.kind else "a module for views: entries"
        raise ConfigError(
            f"{source}: key '{key}.{written}': '{name}' is {what}; {key} takes {_article(kind)} {kind} module "
            f"({', '.join(fitting)}) or none"
        )
    return resolve_entry(VIEW_REGISTRY, {"name": name, **options}, source, key, max_steps=max_steps)


def check_off_section(options: dict[str, Any], source: str, key: str, kind: str, max_steps: int) -> None:
    """A ConfigError where the options a section that is off keeps (for a config that turns it on again) fit none of
    the modules of ``kind``; the error is that of a module that knows every option given, if one does."""
    errors = []
    for name in VIEW_REGISTRY.names():
        cls = VIEW_REGISTRY.get(name)
        if cls.kind != kind or not options:
            continue
        try:
            resolve_entry(VIEW_REGISTRY, {"name": name, **options}, source, key, max_steps=max_steps)
            return
        except ConfigError as exc:
            known = {f.name for f in fields(cls.Config)}
            errors.append((not set(options) <= known, exc))
    if errors:
        raise min(errors, key=lambda error: error[0])[1]


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def resolve_data_config(data: DataPipeline.Config, source: str) -> dict[str, Any]:
    """The ``data:`` section as plain data, the reader's own section (``data.<dataset>``) checked against its Config
    and its defaults filled in (left out for a reader without options)."""
    resolved = to_container(data)
    try:
        reader = DATASET_REGISTRY.get(data.dataset)
    except RegistryError as exc:
        raise ConfigError(f"{source}: key 'data.dataset': {exc}") from None
    options = resolved_entry(reader, data.reader, source, f"data.{data.dataset}")
    resolved.pop(data.dataset, None)
    return {**resolved, **({data.dataset: options} if options else {})}


def resolve_strategy_entry(cfg: RunConfig, source: str, start: str | None = None) -> dict[str, Any]:
    """The ``strategy:`` entry resolved for a ``cfg.max_steps``-step run whose Gaussians start from ``start``
    (None before the model is built: the defaults for a start from points, see :func:`gsrecon.config.per_start`)."""
    return resolve_entry(STRATEGY_REGISTRY, cfg.strategy, source, "strategy", max_steps=cfg.max_steps, start=start)


def structural_keys(model_entry: dict[str, Any]) -> tuple[str, ...]:
    """The ``model:`` keys that decide the parameters' shapes (a checkpoint resumes only if they match)."""
    return ("name", *getattr(MODEL_REGISTRY.get(model_entry["name"]), "structural_keys", ()))
