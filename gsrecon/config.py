"""YAML configs: loading (``_base_`` includes, ``key=value`` overrides) and validation into dataclasses.

One YAML file describes one run. :func:`load_config` reads it into a plain OmegaConf tree;
:func:`parse_structured` checks it against a dataclass schema and returns the dataclass instance.
Every error is a :class:`ConfigError` naming the full key path and the file it came from.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

T = TypeVar("T")

BASE_KEY = "_base_"


class ConfigError(ValueError):
    """A config that cannot be used as written; the message names the key and the file."""


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _read_yaml(path: Path, chain: tuple[Path, ...]) -> DictConfig:
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
        raise ConfigError(f"{path}: invalid YAML: {_first_line(exc)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(data).__name__}")
    bases = data.pop(BASE_KEY, [])
    bases = [bases] if isinstance(bases, str) else bases
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ConfigError(f"{path}: '{BASE_KEY}' must be a relative path or a list of them")
    merged = OmegaConf.create()
    for base in bases:
        merged = OmegaConf.merge(merged, _read_yaml((path.parent / base).resolve(), (*chain, path)))
    try:
        return OmegaConf.merge(merged, OmegaConf.create(data))  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{path}: {_first_line(exc)}") from None


def apply_overrides(cfg: DictConfig, overrides: Sequence[str], source: str = "command line") -> DictConfig:
    """Apply ``key.path=value`` overrides; values are parsed as YAML (``10``, ``true``, ``[1, 2]``, ``null``)."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{source}: override '{item}' is not of the form key=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        try:
            OmegaConf.update(cfg, key.strip(), value, merge=True, force_add=True)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"{source}: cannot set '{key}': {_first_line(exc)}") from None
    return cfg


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> DictConfig:
    """Read a YAML config (with its ``_base_`` includes) and apply ``key=value`` overrides."""
    cfg = _read_yaml(Path(path).resolve(), ())
    return apply_overrides(cfg, overrides)


def parse_structured(
    schema: type[T], cfg: Mapping[str, Any] | DictConfig | None, source: str = "config", prefix: str = ""
) -> T:
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
    """A dataclass config (or OmegaConf node) as plain dicts and lists, for YAML or checkpoints."""
    if dataclasses.is_dataclass(obj):
        return OmegaConf.to_container(OmegaConf.structured(obj), resolve=True)
    if isinstance(obj, (DictConfig,)) or OmegaConf.is_config(obj):
        return OmegaConf.to_container(obj, resolve=True)
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
    try:
        inspect.signature(cls).bind(**kwargs, **extra)
    except TypeError as exc:
        where = f"key '{prefix}'" if prefix else "config"
        raise ConfigError(f"{source}: {where}: {cls.__name__}: {exc}") from None
    return cls(**kwargs, **extra)


def resolved_entry(cls: type, kwargs: Mapping[str, Any], source: str = "config", prefix: str = "") -> dict:
    """``kwargs`` with the defaults of ``cls.Config`` filled in (unchanged for classes without one)."""
    config_cls = getattr(cls, "Config", None)
    if config_cls is not None and dataclasses.is_dataclass(config_cls):
        return to_container(parse_structured(config_cls, dict(kwargs), source, prefix))
    return dict(kwargs)


def save_yaml(data: Any, path: str | Path) -> None:
    """Write plain data as YAML (keys in insertion order)."""
    Path(path).write_text(yaml.safe_dump(to_container(data), sort_keys=False))
