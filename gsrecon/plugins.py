"""Importing user code named in the YAML ``imports:`` list, so it can register hooks, writers, datasets."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from gsrecon.config import ConfigError

PLUGIN_PREFIX = "gsrecon_plugin_"  # the module name of a plugin imported from a file starts with it


def import_plugins(entries: list[str], source: str = "config") -> None:
    """Import each entry: a dotted module name, or a ``.py`` file (relative to the working directory).

    Importing twice is a no-op, so registrations inside a plugin run once per process. A plugin that
    fails or exits while being imported raises :class:`ConfigError` naming it.
    """
    for entry in entries:
        if entry.endswith(".py"):
            _import_file(Path(entry), source)
            continue
        try:
            importlib.import_module(entry)
        except (Exception, SystemExit) as exc:
            raise ConfigError(f"{source}: key 'imports': cannot import module '{entry}': {_describe(exc)}") from exc


def _import_file(path: Path, source: str) -> None:
    path = path.resolve()
    if not path.is_file():
        raise ConfigError(f"{source}: key 'imports': file not found: {path}")
    module_name = f"{PLUGIN_PREFIX}{path.stem}_{abs(hash(str(path))):x}"
    if module_name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        del sys.modules[module_name]
        raise ConfigError(f"{source}: key 'imports': importing {path} failed: {_describe(exc)}") from exc


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        return f"line {exc.lineno}: {exc.msg}"
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r}) while being imported"
    return f"{type(exc).__name__}: {exc}"
