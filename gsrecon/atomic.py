"""Atomic file writes: a finished file is either the old one or the complete new one, never half of each."""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a full disk, a quota, a file-size limit


class WriteError(OSError):
    """A file could not be written; the message names the file the user asked for, not gsrecon's temporary file
    beside it."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds it replaces ``path`` atomically.

    On an exception the temporary file is removed and ``path`` is left untouched.
    """
    with atomic_paths(path) as (tmp,):
        yield tmp


@contextmanager
def atomic_paths(*paths: str | Path) -> Iterator[list[Path]]:
    """Yield a temporary path beside each of ``paths``; when the block succeeds they replace ``paths`` in the order
    given, with nothing else in between (files that belong together, e.g. a scene and its scores).

    On an exception the temporary files are removed and ``paths`` are left untouched. An OSError that names a
    temporary file (a missing or read-only folder), or names no file but says the disk is full, is raised as
    :class:`WriteError` naming the path, as is a path that is a folder or lies in a "folder" that is a file.
    """
    finals = [Path(p) for p in paths]
    temps = [p.with_name(f".{p.name}.tmp{os.getpid()}") for p in finals]
    try:
        for path in finals:
            if path.is_dir():
                raise WriteError(errno.EISDIR, "it is a folder; name a file", str(path))
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except (FileExistsError, NotADirectoryError):
                raise WriteError(errno.ENOTDIR, "a part of its folder is a file", str(path)) from None
        yield temps
        for tmp, path in zip(temps, finals, strict=True):
            os.replace(tmp, path)
    except OSError as exc:
        named = [str(final) for tmp, final in zip(temps, finals, strict=True) if exc.filename == str(tmp)]
        if exc.filename is None and exc.errno in _FULL:  # a write to an open file: it names none
            named = [" or ".join(map(str, finals))]
        if not named:
            raise
        raise WriteError(exc.errno, exc.strerror, named[0]) from None
    finally:
        for tmp in temps:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                tmp.unlink()


def write_json(path: str | Path, data: Any) -> None:
    """Write ``data`` as indented JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
