"""Name -> class registries: how YAML entries become objects.

A registry maps a name to a class (or factory). ``build({"name": X, **kwargs})`` looks ``X`` up and
constructs it from the remaining keys, validated against the class's ``Config`` dataclass when it
has one. Built-in entries register where they are defined; each registry imports the modules that
define its built-ins on first use (MMEngine's ``locations``), so importing a registry stays cheap
and ``gsrecon eval`` never imports hooks or strategies. Users add entries from their own modules
(loaded through the YAML ``imports:`` list).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from gsrecon.config import build_from_config
from gsrecon.errors import InputError

T = TypeVar("T")


class RegistryError(InputError, KeyError):
    """An unknown or duplicate registry name (a name in a config, an option, or a plugin's registration)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Registry(Generic[T]):
    """A named collection of buildable classes (hooks, writers, renderers, ...).

    ``locations``: modules that register the built-in entries, imported on first lookup.
    """

    def __init__(self, name: str, plural: str | None = None, locations: tuple[str, ...] = ()) -> None:
        self.name = name
        self.plural = plural or f"{name}s"
        self.locations = locations
        self._entries: dict[str, T] = {}
        self._imported = False

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

    def _entries_with_builtins(self) -> dict[str, T]:
        if not self._imported:
            self._imported = True
            for module in self.locations:
                importlib.import_module(module)
        return self._entries

    def get(self, name: str) -> T:
        """The entry registered as ``name``; the error lists the known names (and the closest one)."""
        entries = self._entries_with_builtins()
        try:
            return entries[name]
        except KeyError:
            known = ", ".join(sorted(entries)) or "(none)"
            close = difflib.get_close_matches(str(name), list(entries), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise RegistryError(f"unknown {self.name} '{name}'{hint}; known {self.plural}: {known}") from None

    def build(self, cfg: Mapping[str, Any], **extra: Any) -> Any:
        """Construct ``cfg["name"]`` with the remaining keys (plus ``extra``) as arguments."""
        kwargs = dict(cfg)
        if "name" not in kwargs:
            raise RegistryError(f"a {self.name} entry needs a 'name' key; got keys {sorted(kwargs)}")
        cls = self.get(kwargs.pop("name"))
        return build_from_config(cls, kwargs, **extra)

    def __contains__(self, name: str) -> bool:
        return name in self._entries_with_builtins()

    def names(self) -> list[str]:
        return sorted(self._entries_with_builtins())

    @contextmanager
    def scoped(self) -> Iterator[Registry[T]]:
        """Entries registered inside the block are removed when it ends (tests, notebooks)."""
        before = dict(self._entries_with_builtins())
        try:
            yield self
        finally:
            self._entries.clear()
            self._entries.update(before)


HOOK_REGISTRY: Registry = Registry("hook", locations=("gsrecon.hooks",))
WRITER_REGISTRY: Registry = Registry("writer", locations=("gsrecon.logging.writers",))
DATASET_REGISTRY: Registry = Registry("dataset", locations=("gsrecon.data.readers",))
MODEL_REGISTRY: Registry = Registry("model", locations=("gsrecon.model.gaussians",))
RENDERER_REGISTRY: Registry = Registry(
    "renderer",
    locations=("gsrecon.render.torch_renderer", "gsrecon.render.gsplat_renderer", "gsrecon.render.cpu.renderer"),
)
STRATEGY_REGISTRY: Registry = Registry("strategy", "strategies", locations=("gsrecon.strategy",))
LOSS_REGISTRY: Registry = Registry(
    "loss term",
    locations=(
        "gsrecon.losses.l1",
        "gsrecon.losses.ssim",
        "gsrecon.losses.depth_prior",
        "gsrecon.losses.depth_maps",
        "gsrecon.losses.flatten",
        "gsrecon.losses.depth_normal",
    ),
)
VIEW_REGISTRY: Registry = Registry(
    "per-view module",
    locations=(
        "gsrecon.model.views.affine",
        "gsrecon.model.views.bilateral_grid",
        "gsrecon.model.views.pose",
        "gsrecon.model.views.transients",
        "gsrecon.model.views.robust",
        "gsrecon.model.views.environment",
        "gsrecon.model.views.distractors",
    ),
)
EXPORT_REGISTRY: Registry = Registry("export format", locations=("gsrecon.export", "gsrecon.lod.export"))
