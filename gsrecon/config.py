"""YAML configs: loading (``_base_`` includes, ``key=value`` overrides) and validation into dataclasses.

One YAML file describes one run. :func:`load_config` reads it into plain dicts and lists;
:func:`parse_structured` checks it against a dataclass schema and returns the dataclass instance.
Every error is a :class:`ConfigError` naming the full key path and the file it came from.

Merging (``_base_`` files, then overrides) is key by key, with one rule for registry entries: a
mapping whose ``name`` changes replaces the earlier one, whose options belonged to the other name
(``strategy.name=mcmc`` drops the default strategy's options). ``.py`` files in ``imports`` are
relative to the YAML file that lists them.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

T = TypeVar("T")

BASE_KEY = "_base_"


class ConfigError(ValueError):
    """A config that cannot be used as written; the message names the key and the file."""


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _read_yaml(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    """Read one YAML file, merging its ``_base_`` file(s) underneath it."""
    if path in chain:
        cycle = " -> ".join(str(p) for p in (*chain, path))
        raise ConfigError(f"{path}: circular {BASE_KEY} include ({cycle})")
    try:
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
    bases = data.pop(BASE_KEY, [])
    bases = [bases] if isinstance(bases, str) else bases
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ConfigError(f"{path}: '{BASE_KEY}' must be a relative path or a list of them")
    imports = data.get("imports")
    if isinstance(imports, list):
        data["imports"] = [
            str((path.parent / e).resolve()) if isinstance(e, str) and e.endswith(".py") else e for e in imports
        ]
    merged: dict[str, Any] = {}
    for base in bases:
        merged = merge_configs(merged, _read_yaml((path.parent / base).resolve(), (*chain, path)))
    return merge_configs(merged, data)


def merge_configs(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` on top of ``base``: mappings merge key by key, except that a mapping whose ``name``
    differs from the base's replaces it; any other value replaces the base's."""
    out = dict(base)
    for key, value in override.items():
        old = out.get(key)
        renamed = isinstance(value, dict) and "name" in value and value["name"] != (old or {}).get("name")
        if isinstance(value, dict) and isinstance(old, dict) and not renamed:
            out[key] = merge_configs(old, value)
        else:
            out[key] = value
    return out


def apply_overrides(cfg: dict[str, Any], overrides: Sequence[str], source: str = "command line") -> dict[str, Any]:
    """Apply ``key.path=value`` overrides in place (list items by index: ``hooks.0.log_interval=10``).

    Values are parsed as YAML (``10``, ``true``, ``[1, 2]``, ``{name: mcmc}``, ``null``).
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
        for depth, part in enumerate(parents):
            node = node[_list_index(node, part, key, source)] if isinstance(node, list) else node.setdefault(part, {})
            if not isinstance(node, (dict, list)):
                raise ConfigError(f"{source}: cannot set '{key}': '{'.'.join(parents[: depth + 1])}' is not a mapping")
        if isinstance(node, list):
            index = _list_index(node, last, key, source)
            node[index] = _merged_value(node[index], value)
        else:
            if last == "name" and node.get("name", value) != value:
                node.clear()  # the options of the previous name do not apply to the new one
            node[last] = _merged_value(node.get(last), value)
    return cfg


def _merged_value(old: Any, value: Any) -> Any:
    """``value`` set where ``old`` was, by the rules of :func:`merge_configs`."""
    return merge_configs({"v": old}, {"v": value})["v"]


def _list_index(node: list, part: str, key: str, source: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError(f"{source}: cannot set '{key}': '{part}' is not an index of a list of {len(node)} items")
    return int(part)


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Read a YAML config (with its ``_base_`` includes) and apply ``key=value`` overrides."""
    cfg = _read_yaml(Path(path).resolve(), ())
    return apply_overrides(cfg, overrides)


def parse_structured(schema: type[T], cfg: Mapping[str, Any] | None, source: str = "config", prefix: str = "") -> T:
    """Validate ``cfg`` against the dataclass ``schema`` and return the filled-in instance.

    Unknown keys and values of the wrong type raise :class:`ConfigError` naming the full key path
    (``prefix`` is prepended, e.g. ``hooks.0``) and ``source`` (usually the YAML file).
    """
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), cfg or {})
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", "") or ""
        full = ".".join(p for p in (prefix, str(key)) if p)
        where = f"key '{full}'" if full else "config"
        raise ConfigError(f"{source}: {where}: {_first_line(exc)}") from None


def to_container(obj: Any) -> Any:
    """A dataclass config as plain dicts and lists (other values unchanged), for YAML or checkpoints."""
    if dataclasses.is_dataclass(obj):
        return OmegaConf.to_container(OmegaConf.structured(obj), resolve=True)
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


def resolved_entry(cls: type, kwargs: Mapping[str, Any], source: str = "config", prefix: str = "") -> dict:
    """``kwargs`` with the defaults of ``cls.Config`` filled in (unchanged for classes without one)."""
    config_cls = getattr(cls, "Config", None)
    if config_cls is not None and dataclasses.is_dataclass(config_cls):
        return to_container(parse_structured(config_cls, dict(kwargs), source, prefix))
    _check_signature(cls, kwargs, source, prefix)
    return dict(kwargs)


def save_yaml(data: Any, path: str | Path) -> None:
    """Write plain data as YAML (keys in insertion order)."""
    Path(path).write_text(yaml.safe_dump(to_container(data), sort_keys=False))
