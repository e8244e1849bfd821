"""What an export format is: the interface `gsrecon export`, ExportHook and plugins share.

A format is a subclass of :class:`ExportFormat` registered in ``EXPORT_REGISTRY`` under the name
``--format`` and ``ExportHook.format`` take; its docstring's first line describes it in
``gsrecon export --help``. Built-in formats register in their own modules (see ``gsrecon.export``);
a plugin module named in ``imports:`` or ``--imports`` registers its own the same way.
"""

from __future__ import annotations

import abc
import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor

from gsrecon.errors import InputError
from gsrecon.registry import EXPORT_REGISTRY

if TYPE_CHECKING:
    from gsrecon.data.pipeline import Batch
    from gsrecon.logging.console import Logger
    from gsrecon.render.base import RenderOutput


@dataclass(frozen=True)
class TrainedRun:
    """The run folder a trained scene comes from, for a format made of more than its Gaussians (``lod``: the run's
    levels of detail, built and kept in the folder)."""

    folder: Path
    scene: Any  # the run's trained scene (a gsrecon.engine.inference.TrainedScene: config, step, per-view state)
    logger: Logger  # the caller's log
    device: str = "auto"  # where the format trains what it needs (auto: the run's device)
    held: bool = False  # whether the caller holds the folder's lock (ExportHook: the training process does)


@dataclass(frozen=True)
class ExportContext:
    """What a format may need beyond the Gaussians; callers fill the fields a format names in ``needs``.

    ``train_batches``: every training view once, a batch each (cameras, images, backgrounds).
    ``render``: the trained scene rendered from a batch's cameras with the renderer and settings it
    was trained with, without gradients, and with the median depth (``RenderOutput.median_depth``).
    ``run``: the run folder the scene was trained in (:class:`TrainedRun`).
    ``overwrite``: whether a format writing several files may replace what a previous export left at the path.
    """

    train_batches: Callable[[], Iterable[Batch]] | None = None
    render: Callable[[Batch], RenderOutput] | None = None
    run: TrainedRun | None = None
    overwrite: bool = False

    def missing(self, needs: Iterable[str]) -> list[str]:
        """The names in ``needs`` this context does not give (a name that is none of its fields included)."""
        return [name for name in needs if getattr(self, name, None) is None]


class ExportFormat(abc.ABC):
    """A file format for trained Gaussians (subclass it and register it with ``@EXPORT_REGISTRY.register(name)``).

    ``suffixes``: how the names of its files end (the first is the usual one), for the README and ``--help``.
    ``needs``: the :class:`ExportContext` fields ``write`` reads; empty for a format of the parameters alone.
    """

    suffixes: ClassVar[tuple[str, ...]] = ()
    needs: ClassVar[tuple[str, ...]] = ()

    @abc.abstractmethod
    def write(self, path: Path, params: Mapping[str, Tensor], *, antialiased: bool, context: ExportContext) -> None:
        """Write ``params`` (gsrecon's pre-activation Gaussians) to ``path``, recording ``antialiased``
        (Mip-Splatting's opacity compensation) where the format can. Raises ValueError for a scene the
        format cannot hold, before writing anything."""

    @classmethod
    def summary(cls) -> str:
        """The first line of the format's docstring."""
        return (cls.__doc__ or "").strip().split("\n")[0]

    @classmethod
    def check_path(cls, path: Path) -> None:
        """Raise ValueError for a ``path`` this format cannot write, before anything is trained or written (the
        default takes any)."""


def describe_formats() -> str:
    """The registered export formats for ``--help``: each with its file endings, its summary and its options (the
    fields of its ``Config``, ``<name>.<field>=<default>``)."""
    described = []
    for name in EXPORT_REGISTRY.names():
        entry = EXPORT_REGISTRY.get(name)
        config = getattr(entry, "Config", None)
        fields = dataclasses.fields(config) if config else ()
        options = [
            f"{name}.{f.name}={str(f.default).lower() if isinstance(f.default, bool) else f.default}" for f in fields
        ]
        text = f"{name} ({' or '.join(entry.suffixes)}): {entry.summary().rstrip('.')}"
        described.append(text + (f", options {' '.join(options)}" if options else ""))
    return "; ".join(described)


def export_gaussians(
    params: Mapping[str, Tensor],
    path: str | os.PathLike,
    fmt: str,
    antialiased: bool = False,
    context: ExportContext = ExportContext(),
    options: Mapping[str, object] | None = None,
) -> Path:
    """Write ``params`` to ``path`` in the registered format ``fmt`` with its ``options`` (the fields of its
    ``Config``, e.g. the mesh's ``voxel``); return the path.

    Raises RegistryError (a KeyError) naming the known formats when ``fmt`` is not registered, ConfigError for
    options the format does not take, and ValueError when the format needs something ``context`` does not give.
    """
    if options and getattr(EXPORT_REGISTRY.get(fmt), "Config", None) is None:
        raise InputError(f"export format '{fmt}' takes no options; given {', '.join(sorted(options))}")
    exporter: ExportFormat = EXPORT_REGISTRY.build({"name": fmt, **(options or {})})
    missing = context.missing(exporter.needs)
    if missing:
        raise ValueError(f"export format '{fmt}' needs {' and '.join(missing)}, which the caller did not give")
    exporter.write(Path(path), params, antialiased=antialiased, context=context)
    return Path(path)
