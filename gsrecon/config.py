"""YAML configs: loading (``_base_`` includes, ``key=value`` overrides) and validation into dataclasses.

One YAML file describes one run. :func:`load_config` reads it into plain dicts and lists;
:func:`parse_structured` checks it against a dataclass schema and returns the dataclass instance.
Every error is a :class:`ConfigError` naming the full key path and the file it came from.

Merging (``defaults``, then ``_base_`` files, then the file, then overrides) is key by key, with
these rules:

- a mapping whose ``name`` changes replaces the earlier one, whose options belonged to the other
  name (``strategy.name=mcmc`` drops the default strategy's options);
- ``hooks:`` is a mapping from an entry key to the hook's arguments, merged entry by entry: a new
  key adds a hook, an existing key reconfigures it (``hooks.CheckPointHook.interval=500``) and
  ``null`` removes it. The key is the hook's registry name, or any key with a ``name:`` inside (two
  hooks of one class). A list of ``{name: ...}`` entries is read as that mapping, keyed by name;
- ``imports:`` of a child config extend its base's.

``.py`` files in ``imports`` are relative to the YAML file that lists them.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gsrecon.errors import InputError

T = TypeVar("T")

BASE_KEY = "_base_"
MAX_CONFIG_BYTES = 1 << 20  # a YAML file larger than 1 MiB is refused
MAX_CONFIG_VALUES = 100_000  # values in a config once YAML aliases are expanded (each reference counts)
MAX_CONFIG_DEPTH = 32  # nesting levels of mappings and lists
ENTRY_MAPS = ("hooks", "loss", "views")  # top-level keys holding named registry entries, merged entry by entry
APPENDED_LISTS = ("imports",)  # top-level lists that a child config extends instead of replacing
# Top-level sections naming one module, where `mode` is another spelling of `name`: a layer (a file over its base, a
# command-line key) that names the module either way replaces what the layers below named, however they spelled it.
ALIASED_NAMES = ("appearance", "pose_opt")
REFERENCE_RUN_STEPS = 30_000  # the run length of the 3DGS paper, for which step-count defaults are given


def run_steps(default: int, minimum: int = 1, random_start: int | None = None) -> Any:
    """A dataclass field holding a step count that suits a :data:`REFERENCE_RUN_STEPS`-step run: where a
    config leaves it unset, :func:`resolved_entry` scales it to the run's ``max_steps``, never below
    ``minimum`` (for what takes a fixed number of optimiser steps whatever the run's length). With
    ``random_start``, that count replaces ``default`` for Gaussians started from random points (`per_start`)."""
    metadata: dict[str, Any] = {"run_steps": minimum}
    if random_start is not None:
        metadata["per_start"] = (random_start, default)
    return dataclasses.field(default=default, metadata=metadata)


def per_device(cpu: int, gpu: int) -> Any:
    """A dataclass field whose default depends on the device trained on: where a config leaves it
    unset, :func:`resolved_entry` picks ``cpu`` or ``gpu`` (the dataclass default is ``gpu``)."""
    return dataclasses.field(default=gpu, metadata={"per_device": (cpu, gpu)})


def per_start(random: float, points: float) -> Any:
    """A dataclass field whose default depends on what the Gaussians start from: where a config leaves it
    unset, :func:`resolved_entry` picks ``random`` for random points and ``points`` for SfM points or a PLY
    (the dataclass default)."""
    return dataclasses.field(default=points, metadata={"per_start": (random, points)})


def named_section(selector: str, siblings: Callable[[], list[str]] | None = None) -> Any:
    """A dataclass field holding the mapping that YAML writes under the key field ``selector`` names: with
    ``selector="dataset"``, ``data: {dataset: synthetic, synthetic: {width: 64}}`` fills it with ``{width: 64}``.
    It holds the options of the registry entry chosen by name, checked against that entry's own ``Config``
    where it is built, so that an entry added by a plugin brings its options without a change to this schema.
    ``siblings()`` lists the names of the other entries: their sections (a base config's reader, before a child
    or the command line chose another) are left out, not refused as unknown keys."""
    return dataclasses.field(default_factory=dict, metadata={"named_by": selector, "siblings": siblings})


def _check_containers(schema: Any, data: Any, source: str, prefix: str) -> None:
    """A ConfigError naming the key where ``data`` gives a single value or a mapping for a list field of the
    dataclass ``schema`` (or a single value or a list for a mapping field), which OmegaConf words in its own terms
    ("AnyNode is not a ListConfig") or fails on, or a number for a boolean field, which OmegaConf would take as true
    unless 0."""
    if not isinstance(data, Mapping) or not dataclasses.is_dataclass(schema):
        return
    try:
        hints = typing.get_type_hints(schema)
    except (NameError, TypeError):  # an annotation this module cannot resolve: OmegaConf checks it
        return
    for f in dataclasses.fields(schema):
        if f.name not in data:
            continue
        value, hint = data[f.name], hints[f.name]
        origin = typing.get_origin(hint) or hint
        wanted = "a list" if origin in (list, tuple) else "a mapping" if origin is dict else None
        key = ".".join(p for p in (prefix, f.name) if p)
        if wanted and not isinstance(value, (list, tuple) if wanted == "a list" else Mapping):
            raise ConfigError(f"{source}: key '{key}': must be {wanted}, got {value!r}")
        if hint is bool and isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ConfigError(f"{source}: key '{key}': must be true or false, got {value!r}")
        if dataclasses.is_dataclass(hint):
            _check_containers(hint, value, source, key)


def _gathered_sections(schema: Any, data: Any) -> Any:
    """``data`` (for the dataclass ``schema``) with each :func:`named_section` filled from the key that names it."""
    if not isinstance(data, Mapping) or not dataclasses.is_dataclass(schema):
        return data
    out = dict(data)
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for f in fields.values():
        if "named_by" in f.metadata:
            selector = fields[f.metadata["named_by"]]
            name = out.get(selector.name, selector.default)
            if isinstance(name, str) and name not in fields and name in out:
                out[f.name] = out.pop(name)
            unknown = [key for key in out if key not in fields and isinstance(out[key], Mapping)]
            if unknown and f.metadata["siblings"] is not None:
                siblings = set(f.metadata["siblings"]())
                out = {key: value for key, value in out.items() if key not in unknown or key not in siblings}
        elif f.name in out and f.default_factory is not dataclasses.MISSING:
            out[f.name] = _gathered_sections(type(f.default_factory()), out[f.name])
    return out


def _spread_sections(obj: Any, container: Any) -> Any:
    """The inverse of :func:`_gathered_sections` for the plain ``container`` of the dataclass instance ``obj``."""
    if not dataclasses.is_dataclass(obj) or not isinstance(container, dict):
        return container
    out = {}
    for f in dataclasses.fields(obj):
        value = container[f.name]
        if "named_by" in f.metadata:
            if value:
                out[getattr(obj, f.metadata["named_by"])] = value
        else:
            out[f.name] = _spread_sections(getattr(obj, f.name), value)
    return out


class ConfigError(InputError):
    """A config that cannot be used as written; the message names the key and the file."""


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _read_yaml(path: Path, chain: tuple[Path, ...], below: dict[str, Any]) -> dict[str, Any]:
    """Read one YAML file and merge it on top of its ``_base_`` file(s), which go on top of ``below``."""
    if path in chain:
        cycle = " -> ".join(str(p) for p in (*chain, path))
        raise ConfigError(f"{path}: circular {BASE_KEY} include ({cycle})")
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: a config file may hold at most {MAX_CONFIG_BYTES} bytes")
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or _first_line(exc)
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(data).__name__}")
    check_config_data(data, str(path))
    bases = data.pop(BASE_KEY, [])
    bases = [bases] if isinstance(bases, str) else bases
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ConfigError(f"{path}: '{BASE_KEY}' must be a relative path or a list of them")
    for base in bases:
        below = _read_yaml((path.parent / base).resolve(), (*chain, path), below)
    try:
        _normalize_entry_maps(data)
        if "imports" in data:
            data["imports"] = [
                str((path.parent / e).resolve()) if e.endswith(".py") else e for e in check_imports(data["imports"])
            ]
        return merge_configs(below, data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def check_config_data(data: Any, source: str) -> None:
    """Refuse config data that expands past :data:`MAX_CONFIG_VALUES` values or :data:`MAX_CONFIG_DEPTH`
    levels (YAML alias bombs, self-referencing checkpoints: copying them would hang), and ``${...}``
    interpolation, which would read other keys or environment variables: gsrecon takes values as written.
    """
    count = 0
    stack: list[tuple[Any, int, str]] = [(data, 0, "")]
    while stack:
        node, depth, key = stack.pop()
        count += 1
        if count > MAX_CONFIG_VALUES:
            raise ConfigError(
                f"{source}: the config expands to more than {MAX_CONFIG_VALUES} values (nested YAML aliases?)"
            )
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(f"{source}: key '{key}' is nested more than {MAX_CONFIG_DEPTH} levels deep")
        if isinstance(node, str) and "${" in node:
            raise ConfigError(
                f"{source}: key '{key}': '${{...}}' interpolation is not supported (it would read other keys or "
                f"environment variables); write the value itself, e.g. as key=value on the command line"
            )
        if isinstance(node, dict):
            stack.extend((value, depth + 1, f"{key}.{k}" if key else str(k)) for k, value in node.items())
        elif isinstance(node, (list, tuple)):
            stack.extend((value, depth + 1, f"{key}.{i}" if key else str(i)) for i, value in enumerate(node))


def check_imports(value: Any) -> list[str]:
    """The ``imports:`` value, which must be a list of module names or ``.py`` paths."""
    if isinstance(value, str):
        raise ConfigError(f"key 'imports': must be a list, e.g. imports: [{value}]")
    if not isinstance(value, list) or not all(isinstance(e, str) and e for e in value):
        raise ConfigError(f"key 'imports': must be a list of module names or .py files, got {value!r}")
    return value


def entry_map(value: Any, key: str = "hooks", source: str = "") -> dict[str, dict[str, Any] | None]:
    """A ``hooks:`` value as the mapping ``{entry key: arguments or None (remove)}``; a ConfigError names ``source``
    (the file and the command line) where it is given.

    A list of ``{name: ..., **arguments}`` entries is keyed by name (``Name-2`` for a second one).
    """
    at = f"{source}: " if source else ""
    if value is None:
        return {}
    if isinstance(value, list):
        entries: dict[str, dict[str, Any] | None] = {}
        for index, item in enumerate(value):
            if isinstance(item, str):
                raise ConfigError(
                    f"{at}key '{key}.{index}': '{item}' is a bare name; write `- name: {item}` "
                    f"(or as a mapping, `{key}: {{{item}: {{}}}}`)"
                )
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise ConfigError(f"{at}key '{key}.{index}': an entry is a mapping with a 'name', got {item!r}")
            entry_key, count = item["name"], 1
            while entry_key in entries:
                count += 1
                entry_key = f"{item['name']}-{count}"
            entries[entry_key] = item
        return entry_map(entries, key, source)
    if not isinstance(value, dict):
        raise ConfigError(f"{at}key '{key}': must be a mapping of entry name to arguments, got {value!r}")
    entries = {}
    for entry_key, item in value.items():
        if item is not None and not isinstance(item, dict):
            raise ConfigError(
                f"{at}key '{key}.{entry_key}': an entry is a mapping of its arguments ({{}} for its defaults) or "
                f"null to remove it, got {item!r}"
            )
        if item is not None and "name" in item and not isinstance(item["name"], str):
            raise ConfigError(f"{at}key '{key}.{entry_key}.name': must be a registry name, got {item['name']!r}")
        if item is not None and item.get("name") == entry_key:  # implied, so that it merges with `LogHook: {...}`
            item = {k: v for k, v in item.items() if k != "name"}
        entries[entry_key] = item
    return entries


def _normalize_entry_maps(cfg: dict[str, Any]) -> None:
    for key in ENTRY_MAPS:
        if key in cfg:
            cfg[key] = entry_map(cfg[key], key)


def merge_configs(base: dict[str, Any], override: dict[str, Any], path: str = "") -> dict[str, Any]:
    """``override`` on top of ``base``: mappings merge key by key, except that a mapping whose ``name``
    differs from the base's replaces it, and ``null`` in an entry map (``hooks``) removes the entry;
    any other value replaces the base's. ``path`` is the key path of ``base`` (for messages)."""
    out = dict(base)
    for key, value in override.items():
        where = f"{path}.{key}" if path else str(key)
        old = out.get(key)
        if value is None and path in ENTRY_MAPS:
            if key not in out:
                present = ", ".join(out) or "none"
                raise ConfigError(f"key '{where}': null removes an entry, but there is no '{key}' (present: {present})")
            del out[key]
            continue
        if not path and key in ALIASED_NAMES and isinstance(value, dict) and isinstance(old, dict):
            old = _respelled(old, value)
        renamed = isinstance(value, dict) and "name" in value and value["name"] != (old or {}).get("name")
        if isinstance(value, dict) and isinstance(old, dict) and not renamed:
            out[key] = merge_configs(old, value, where)
        elif where in APPENDED_LISTS and isinstance(old, list) and isinstance(value, list):
            out[key] = old + [v for v in value if v not in old]
        else:
            out[key] = value
    return out


def apply_overrides(cfg: dict[str, Any], overrides: Sequence[str], source: str = "command line") -> dict[str, Any]:
    """Apply ``key.path=value`` overrides in place, by the rules of :func:`merge_configs`.

    Values are parsed as YAML (``10``, ``true``, ``[1, 2]``, ``{name: mcmc}``, ``null``). Hooks are
    addressed by entry key (``hooks.LogHook.log_interval=10``, ``hooks.MyHook.every=5`` adds one,
    ``hooks.CheckPointHook=null`` removes one); other lists by index (``writers.0.x=1``).
    """
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{source}: override '{item}' is not of the form key=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        *parents, last = key.split(".")
        node: Any = cfg
        try:
            parts = [*parents, last]
            if len(parts) > 1 and parts[0] in ENTRY_MAPS and parts[1].isdigit():
                present = ", ".join(cfg.get(parts[0]) or {}) or "none"
                raise ConfigError(
                    f"cannot set '{key}': {parts[0]} are addressed by name, not position "
                    f"(e.g. {parts[0]}.LogHook.log_interval=10); this config's {parts[0]}: {present}"
                )
            for depth, part in enumerate(parents):
                node = node[_list_index(node, part, key)] if isinstance(node, list) else node.setdefault(part, {})
                if not isinstance(node, (dict, list)):
                    raise ConfigError(f"cannot set '{key}': '{'.'.join(parents[: depth + 1])}' is not a mapping")
            if isinstance(node, list):
                index = _list_index(node, last, key)
                node[index] = merge_configs({"v": node[index]}, {"v": value})["v"]
                continue
            if key in ENTRY_MAPS:
                value = entry_map(value, key)
            elif parents and parents[0] in ALIASED_NAMES and len(parents) == 1 and last in ("name", "mode"):
                respelled = _respelled(dict(node), {last: value})
                node.clear()
                node.update(respelled)
            elif last == "name" and node.get("name", value) != value:
                node.clear()  # the options of the previous name do not apply to the new one
            merged = merge_configs(node, {last: value}, ".".join(parents))
            node.clear()
            node.update(merged)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return cfg


def _respelled(below: dict[str, Any], above: dict[str, Any]) -> dict[str, Any]:
    """An :data:`ALIASED_NAMES` section ``below`` as the layer ``above`` it merges with sees it: where ``above`` names
    the module (as ``name`` or ``mode``), without the name as ``below`` spelled it, and without ``below``'s options
    where the module changes."""
    written = [spelling for spelling in ("name", "mode") if spelling in above]
    if not written:
        return below
    module = below.get("name", below.get("mode", "none"))
    if above[written[0]] != module:
        return {}
    return {k: v for k, v in below.items() if k not in ("name", "mode")}


def _list_index(node: list, part: str, key: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError(f"cannot set '{key}': '{part}' is not an index of a list of {len(node)} items")
    return int(part)


def load_config(
    path: str | Path, overrides: Sequence[str] = (), defaults: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Read a YAML config (with its ``_base_`` includes, on top of ``defaults``) and apply ``key=value`` overrides."""
    cfg = _read_yaml(Path(path).resolve(), (), copy.deepcopy(defaults or {}))
    return apply_overrides(cfg, overrides)


def parse_structured(schema: type[T], cfg: Mapping[str, Any] | None, source: str = "config", prefix: str = "") -> T:
    """Validate ``cfg`` against the dataclass ``schema`` and return the filled-in instance.

    Unknown keys and values of the wrong type raise :class:`ConfigError` naming the full key path
    (``prefix`` is prepended, e.g. ``hooks.0``) and ``source`` (usually the YAML file).
    """
    check_config_data(cfg, source)
    gathered = _gathered_sections(schema, cfg or {})
    _check_containers(schema, gathered, source, prefix)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), gathered)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", "") or ""
        full = ".".join(p for p in (prefix, str(key)) if p)
        where = f"key '{full}'" if full else "config"
        raise ConfigError(f"{source}: {where}: {_first_line(exc)}") from None
    except ValueError as exc:  # a config class's own check (__post_init__); named here unless it names its section
        section = prefix.split(".")[0]
        where = f"key '{prefix}': " if prefix and not str(exc).startswith(section) else ""
        raise ConfigError(f"{source}: {where}{exc}") from None


def to_container(obj: Any) -> Any:
    """A dataclass config as plain dicts and lists (other values unchanged), for YAML or checkpoints; a
    :func:`named_section` goes back under the key that names it (left out when empty)."""
    if dataclasses.is_dataclass(obj):
        return _spread_sections(obj, OmegaConf.to_container(OmegaConf.structured(obj), resolve=True))
    return obj


def build_from_config(
    cls: type, kwargs: Mapping[str, Any], source: str = "config", prefix: str = "", **extra: Any
) -> Any:
    """Construct ``cls`` from config ``kwargs``.

    Classes with a nested ``Config`` dataclass receive the validated instance as their only
    configuration argument; other classes receive ``kwargs`` as keyword arguments, checked
    against their signature. ``extra`` keyword arguments are passed through unchanged.
    """
    config_cls = getattr(cls, "Config", None)
    if config_cls is not None and dataclasses.is_dataclass(config_cls):
        return cls(parse_structured(config_cls, dict(kwargs), source, prefix), **extra)
    _check_signature(cls, kwargs, source, prefix, **extra)
    return cls(**kwargs, **extra)


def _check_signature(cls: type, kwargs: Mapping[str, Any], source: str, prefix: str, **extra: Any) -> None:
    try:
        inspect.signature(cls).bind(**kwargs, **extra)
    except TypeError as exc:
        where = f"key '{prefix}'" if prefix else "config"
        raise ConfigError(f"{source}: {where}: {cls.__name__}: {exc}") from None


def resolved_entry(
    cls: type,
    kwargs: Mapping[str, Any],
    source: str = "config",
    prefix: str = "",
    max_steps: int | None = None,
    device_type: str | None = None,
    start: str | None = None,
) -> dict:
    """``kwargs`` with the defaults of ``cls.Config`` filled in (unchanged for classes without one).

    With ``max_steps``, each :func:`run_steps` field that ``kwargs`` leaves out is scaled from its
    default to a ``max_steps`` run (at least its ``minimum``). With ``device_type`` ("cpu", "cuda", ...), each
    :func:`per_device` field that ``kwargs`` leaves out takes that device's default. With ``start`` (what
    the Gaussians were made from: "random", "sfm", "ply"), each :func:`per_start` field likewise.
    """
    config_cls = getattr(cls, "Config", None)
    if config_cls is not None and dataclasses.is_dataclass(config_cls):
        resolved = to_container(parse_structured(config_cls, dict(kwargs), source, prefix))
        for f in dataclasses.fields(config_cls):
            if f.name in kwargs or not f.metadata.keys() & {"per_device", "per_start", "run_steps"}:
                continue
            value = f.default
            if device_type is not None and "per_device" in f.metadata:
                cpu, gpu = f.metadata["per_device"]
                value = cpu if device_type == "cpu" else gpu
            if start is not None and "per_start" in f.metadata:
                random, points = f.metadata["per_start"]
                value = random if start == "random" else points
            if max_steps is not None and "run_steps" in f.metadata:
                value = max(f.metadata["run_steps"], round(value * max_steps / REFERENCE_RUN_STEPS))
            resolved[f.name] = value
        return resolved
    _check_signature(cls, kwargs, source, prefix)
    return dict(kwargs)


def save_yaml(data: Any, path: str | Path) -> None:
    """Write plain data as YAML (keys in insertion order)."""
    Path(path).write_text(yaml.safe_dump(to_container(data), sort_keys=False))
