"""Reading back the JSON records gsrecon writes (``levels.json``, ``partition.json``, a site's ``lod-meta.json``):
one checked reader, whose errors name the file and the key, so that a damaged record is one line and exit 2.

A record's expected shape is a small schema: a type (``int``, ``float``, ``str``, ``bool``; ``float`` takes an
integer too), ``None`` (JSON null), a compiled regular expression (a string it matches in full), a tuple of
alternatives, a dict of the keys an object must have (others are allowed; a key wrapped in :class:`MayLack` may be
missing), or :class:`ListOf`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gsrecon.errors import InputError


class RecordError(InputError):
    """A record gsrecon wrote that does not read back as written; the message names the file and the key."""


@dataclass(frozen=True)
class ListOf:
    """A JSON list whose every item has the shape ``item`` (and ``length`` items, where given)."""

    item: Any
    length: int | None = None


@dataclass(frozen=True)
class MayLack:
    """A key of a dict schema that a record may not have (one written by an older gsrecon)."""

    key: str


_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null"}


def read_record(path: str | Path, schema: Any, fix: str) -> Any:
    """The JSON value in ``path``, checked against ``schema`` (see the module docstring).

    Raises RecordError naming ``path`` (and the key that is wrong), followed by ``fix``: what the user can do."""
    path = Path(path)
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise RecordError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); {fix}"
        ) from None
    except (UnicodeDecodeError, RecursionError):
        raise RecordError(f"{path} is not valid JSON (not UTF-8 text, or nested too deep); {fix}") from None
    except OSError as exc:
        raise RecordError(f"cannot read {path}: {exc.strerror or exc}; {fix}") from None
    problem = _mismatch(value, schema, "")
    if problem is not None:
        raise RecordError(f"{path}: {problem}; {fix}")
    return value


def _mismatch(value: Any, schema: Any, key: str) -> str | None:
    """What is wrong with ``value`` (found at ``key``) for ``schema``, or None where it fits."""
    where = f"key '{key}'" if key else "the record"
    if isinstance(schema, tuple):
        problems = [_mismatch(value, alternative, key) for alternative in schema]
        if all(problems):  # an object or a list where one alternative is one: what is wrong inside it
            alike = [p for s, p in zip(schema, problems) if isinstance(s, dict if isinstance(value, dict) else ListOf)]
            if len(alike) == 1 and isinstance(value, (dict, list)):
                return alike[0]
            return f"{where} must be {' or '.join(_describe(s) for s in schema)}, got {_shown(value)}"
        return None
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return f"{where} must be an object, got {_shown(value)}"
        for name, item in schema.items():
            field = name.key if isinstance(name, MayLack) else name
            inner = f"{key}.{field}" if key else field
            if field not in value:
                if isinstance(name, MayLack):
                    continue
                return f"key '{inner}' is missing"
            problem = _mismatch(value[field], item, inner)
            if problem is not None:
                return problem
        return None
    if isinstance(schema, ListOf):
        if not isinstance(value, list):
            return f"{where} must be a list, got {_shown(value)}"
        if schema.length is not None and len(value) != schema.length:
            return f"{where} must hold {schema.length} items, got {len(value)}"
        for index, item in enumerate(value):
            problem = _mismatch(item, schema.item, f"{key}[{index}]")
            if problem is not None:
                return problem
        return None
    if _fits(value, schema):
        return None
    return f"{where} must be {_describe(schema)}, got {_shown(value)}"


def _fits(value: Any, kind: type | re.Pattern[str] | None) -> bool:
    """Whether ``value`` is a JSON scalar of ``kind`` (None: null; a bool is no number; an integer is a float; a
    pattern: a string it matches)."""
    if isinstance(kind, re.Pattern):
        return isinstance(value, str) and kind.fullmatch(value) is not None
    if kind is None:
        return value is None
    if kind in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, (int, float)) if kind is float else isinstance(value, kind)


def _describe(schema: Any) -> str:
    if isinstance(schema, dict):
        return "an object"
    if isinstance(schema, ListOf):
        return "a list" if schema.length is None else f"a list of {schema.length}"
    if isinstance(schema, tuple):
        return " or ".join(_describe(s) for s in schema)
    if isinstance(schema, re.Pattern):
        return f"a string matching {schema.pattern}"
    return _NAMES[type(None) if schema is None else schema]


def _shown(value: Any) -> str:
    """``value`` as the record has it, cut short."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
