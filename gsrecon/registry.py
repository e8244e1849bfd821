"""Name -> class registries: how YAML entries become objects.

A registry maps a name to a class (or factory). ``build({"name": X, **kwargs})`` looks ``X`` up and
constructs it from the remaining keys, validated against the class's ``Config`` dataclass when it
has one. Users add entries from their own modules (loaded through the YAML ``imports:`` list).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from gsrecon.config import build_from_config

T = TypeVar("T")


class RegistryError(KeyError):
    """An unknown or duplicate registry name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Registry(Generic[T]):
    """A named collection of buildable classes (hooks, writers, renderers, ...)."""

    def __init__(self, name: str, plural: str | None = None) -> None:
        self.name = name
        self.plural = plural or f"{name}s"
        self._entries: dict[str, T] = {}

    def register(self, name: str | None = None) -> Callable[[T], T]:
        """Decorator registering a class under ``name`` (default: the class name)."""

        def decorator(obj: T) -> T:
            key = name or obj.__name__  # type: ignore[attr-defined]
            if key in self._entries:
                raise RegistryError(
                    f"{self.name} registry already has an entry named '{key}' "
                    f"({self._entries[key]!r}); pick another name"
                )
            self._entries[key] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        """The entry registered as ``name``; the error lists the known names."""
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "(none)"
            raise RegistryError(f"unknown {self.name} '{name}'; known {self.plural}: {known}") from None

    def build(self, cfg: Mapping[str, Any], **extra: Any) -> Any:
        """Construct ``cfg["name"]`` with the remaining keys (plus ``extra``) as arguments."""
        kwargs = dict(cfg)
        if "name" not in kwargs:
            raise RegistryError(f"a {self.name} entry needs a 'name' key; got keys {sorted(kwargs)}")
        cls = self.get(kwargs.pop("name"))
        return build_from_config(cls, kwargs, **extra)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def names(self) -> list[str]:
        return sorted(self._entries)


HOOK_REGISTRY: Registry = Registry("hook")
WRITER_REGISTRY: Registry = Registry("writer")
DATASET_REGISTRY: Registry = Registry("dataset")
MODEL_REGISTRY: Registry = Registry("model")
RENDERER_REGISTRY: Registry = Registry("renderer")
STRATEGY_REGISTRY: Registry = Registry("strategy", "strategies")
