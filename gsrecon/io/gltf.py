"""glTF 2.0 files holding one point primitive: writing ``.glb`` (or ``.gltf`` with a ``.bin`` beside it) in bounded
memory, and reading one back with every JSON member it reads checked against glTF's type (one walk of the document
by a schema of those members) and every accessor checked against the bytes it names before it is trusted.

The layouts live with their users: Gaussian splats (``KHR_gaussian_splatting``) in `gsrecon.model.gltf`.
"""

from __future__ import annotations

import base64
import binascii
import json
import mmap
import os
import struct
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gsrecon.atomic import atomic_path, atomic_paths
from gsrecon.errors import InputError
from gsrecon.io.ply import WRITE_CHUNK_ROWS

GLB_MAGIC = b"glTF"
_GLB_HEADER = struct.Struct("<4sII")  # magic, version, total length
_CHUNK_HEADER = struct.Struct("<I4s")  # chunk length, chunk type
_JSON_CHUNK, _BIN_CHUNK = b"JSON", b"BIN\x00"
_POINTS = 0  # mesh primitive mode
_ARRAY_BUFFER = 34962  # bufferView target of vertex attributes
_COMPONENT_TYPES = {5120: "i1", 5121: "u1", 5122: "<i2", 5123: "<u2", 5125: "<u4", 5126: "<f4"}
_COMPONENT_NAMES = {
    5120: "signed byte",
    5121: "unsigned byte",
    5122: "signed short",
    5123: "unsigned short",
    5125: "unsigned int",
    5126: "float",
}
_WIDTHS = {"SCALAR": 1, "VEC2": 2, "VEC3": 3, "VEC4": 4}
_TYPES = {width: name for name, width in _WIDTHS.items()}
_NORMALIZED_MAX = {5120: 127, 5121: 255, 5122: 32767, 5123: 65535}


@dataclass(frozen=True)
class Attribute:
    """A vertex attribute to write: ``rows(start, stop)`` gives its values ``[stop - start, width]`` as ``dtype``
    (float32 or uint8); ``bounds`` are the accessor's (min, max), which glTF requires for ``POSITION``."""

    semantic: str
    dtype: str  # "<f4" | "u1"
    width: int  # 1, 3 or 4
    rows: Callable[[int, int], np.ndarray]
    normalized: bool = False
    bounds: tuple[list[float], list[float]] | None = None


def write_points(
    path: str | os.PathLike,
    count: int,
    attributes: Sequence[Attribute],
    primitive_extensions: Mapping[str, Any],
    extras: Mapping[str, Any],
) -> None:
    """Write a glTF asset of one node with one ``POINTS`` primitive of ``count`` points, each attribute in its own
    buffer view; ``primitive_extensions`` are named in ``extensionsUsed``. ``.glb``: one binary file; ``.gltf``: the
    JSON and a ``.bin`` of the same stem beside it. Attributes are converted ``WRITE_CHUNK_ROWS`` rows at a time.
    Files are written atomically (the ``.gltf`` after its ``.bin``)."""
    path = Path(path)
    views, offset = [], 0
    for attribute in attributes:
        size = count * attribute.width * np.dtype(attribute.dtype).itemsize
        views.append((offset, size))
        offset += -(-size // 4) * 4  # each view starts 4-byte aligned
    suffix = path.suffix.lower()
    if suffix not in (".glb", ".gltf"):
        raise InputError(f"{path}: a glTF file is named .glb (binary) or .gltf (with a .bin beside it)")
    bin_path = path.with_suffix(".bin")
    document = _document(count, attributes, views, offset, primitive_extensions, extras)
    if suffix == ".gltf":
        document["buffers"][0]["uri"] = urllib.parse.quote(bin_path.name)
        with atomic_paths(bin_path, path) as (bin_tmp, tmp):
            with open(bin_tmp, "wb") as f:
                _write_attributes(f, count, attributes)
            tmp.write_text(json.dumps(document, indent=1), encoding="utf-8")
    else:
        text = json.dumps(document, separators=(",", ":")).encode("utf-8")
        text += b" " * (-len(text) % 4)  # the JSON chunk is padded with spaces to 4 bytes
        total = _GLB_HEADER.size + 2 * _CHUNK_HEADER.size + len(text) + offset
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            f.write(_GLB_HEADER.pack(GLB_MAGIC, 2, total))
            f.write(_CHUNK_HEADER.pack(len(text), _JSON_CHUNK) + text)
            f.write(_CHUNK_HEADER.pack(offset, _BIN_CHUNK))
            _write_attributes(f, count, attributes)


def _document(
    count: int,
    attributes: Sequence[Attribute],
    views: list[tuple[int, int]],
    length: int,
    primitive_extensions: Mapping[str, Any],
    extras: Mapping[str, Any],
) -> dict[str, Any]:
    """The glTF JSON of :func:`write_points`, without the buffer's ``uri``."""
    accessors = []
    for index, attribute in enumerate(attributes):
        accessor = {
            "bufferView": index,
            "componentType": 5126 if attribute.dtype == "<f4" else 5121,
            "count": count,
            "type": _TYPES[attribute.width],
        }
        if attribute.normalized:
            accessor["normalized"] = True
        if attribute.bounds is not None:
            accessor["min"], accessor["max"] = attribute.bounds
        accessors.append(accessor)
    primitive = {
        "attributes": {attribute.semantic: index for index, attribute in enumerate(attributes)},
        "mode": _POINTS,
        "extensions": dict(primitive_extensions),
    }
    return {
        "asset": {"version": "2.0", "generator": "gsrecon", "extras": dict(extras)},
        "extensionsUsed": sorted(primitive_extensions),
        "scene": 0,
        "scenes": [{"nodes": [0]}],
        "nodes": [{"mesh": 0}],
        "meshes": [{"primitives": [primitive]}],
        "accessors": accessors,
        "bufferViews": [
            {"buffer": 0, "byteOffset": start, "byteLength": size, "target": _ARRAY_BUFFER} for start, size in views
        ],
        "buffers": [{"byteLength": length}],
    }


def _write_attributes(f: Any, count: int, attributes: Sequence[Attribute]) -> None:
    """Each attribute's values in turn, each padded with zeros to 4 bytes."""
    for attribute in attributes:
        size = 0
        for start in range(0, count, WRITE_CHUNK_ROWS):
            rows = attribute.rows(start, min(start + WRITE_CHUNK_ROWS, count))
            data = np.ascontiguousarray(rows, dtype=attribute.dtype).tobytes()
            f.write(data)
            size += len(data)
        f.write(b"\x00" * (-size % 4))


@dataclass
class PointPrimitive:
    """The one mesh primitive of a glTF file that carries ``extension``: its attributes and extension object,
    readable by :meth:`read` (``count``: the points of its ``POSITION``). ``document`` has passed the type checks of
    :func:`read_points`."""

    path: Path
    document: dict[str, Any]
    primitive: dict[str, Any]
    extension: dict[str, Any]
    buffers: list[memoryview | bytes | None] = field(repr=False)
    count: int

    @property
    def semantics(self) -> set[str]:
        """The attribute semantics the primitive names."""
        return set(self.primitive["attributes"])

    def read(self, semantic: str, width: int, component_types: Mapping[int, bool | None]) -> np.ndarray:
        """Attribute ``semantic`` as float32 ``[count, width]``, dequantised as glTF says for normalised integers.

        ``component_types`` maps each allowed component type to whether it must be normalised (None: either).
        Raises InputError naming the file and the attribute when it is missing, of another type or count, or
        reaches past its buffer; a non-finite value is refused by :meth:`finite`.
        """
        if semantic not in self.primitive["attributes"]:
            raise InputError(f"{self.path}: the splat primitive has no attribute '{semantic}'")
        accessor = _item(self.path, self.document, "accessors", self.primitive["attributes"][semantic], semantic)
        what = f"{self.path}: attribute '{semantic}'"
        kind, ctype, normalized = accessor["type"], accessor["componentType"], accessor.get("normalized", False)
        if _WIDTHS.get(kind) != width:
            raise InputError(f"{what} is {describe(kind)}; it must be {_TYPES[width]}")
        if ctype not in component_types or component_types[ctype] not in (None, normalized):
            allowed = ", ".join(
                f"{'normalized ' if norm else ''}{_COMPONENT_NAMES[t]}" for t, norm in component_types.items()
            )
            got = f"{'normalized ' if normalized else ''}{_COMPONENT_NAMES.get(ctype, ctype)}"
            raise InputError(f"{what} has component type {got}; it must be one of: {allowed}")
        if accessor["count"] != self.count:
            raise InputError(f"{what} has {accessor['count']} values, but POSITION has {self.count}")
        if "sparse" in accessor or "bufferView" not in accessor:
            raise InputError(f"{what} is a sparse accessor or has no buffer view; gsrecon reads plain ones")
        values = self._view(accessor, width, what)
        if normalized:
            return np.maximum(values.astype(np.float32) / _NORMALIZED_MAX[ctype], -1.0)
        return values.astype(np.float32)

    def finite(self, semantic: str, values: np.ndarray) -> np.ndarray:
        """``values`` of attribute ``semantic``, refused with an InputError if any is NaN or infinite."""
        bad = np.flatnonzero(~np.isfinite(values).all(axis=1))
        if bad.size:
            raise InputError(
                f"{self.path}: attribute '{semantic}' has NaN/inf values at {bad.size} points (first at point "
                f"{bad[0]}); the scene is corrupt and cannot be used"
            )
        return values

    def _view(self, accessor: dict[str, Any], width: int, what: str) -> np.ndarray:
        """The accessor's elements ``[count, width]`` in their stored type, after checking they lie in its view."""
        view = _item(self.path, self.document, "bufferViews", accessor["bufferView"], what)
        buffer_index = view["buffer"]
        data = self.buffers[buffer_index] if buffer_index < len(self.buffers) else None
        if data is None:
            raise InputError(f"{what}: its buffer view names buffer {buffer_index}, which the file does not hold")
        dtype = np.dtype(_COMPONENT_TYPES[accessor["componentType"]])
        element = dtype.itemsize * width
        stride = view.get("byteStride") or element
        view_start, view_length = view.get("byteOffset", 0), view["byteLength"]
        if view_start + view_length > len(data):
            raise InputError(
                f"{what}: its buffer view ends at byte {view_start + view_length} of buffer {buffer_index}, which "
                f"has {len(data)}; the file is truncated or corrupt"
            )
        start = accessor.get("byteOffset", 0)
        end = start + stride * (self.count - 1) + element
        if stride < element or end > view_length:
            raise InputError(
                f"{what} ends at byte {end} of its buffer view, which has {view_length} (stride {stride}); "
                "the file is corrupt"
            )
        offset = view_start + start
        return np.ndarray((self.count, width), dtype, buffer=data, offset=offset, strides=(stride, dtype.itemsize))


def read_points(path: str | os.PathLike, extension: str) -> PointPrimitive:
    """Read a ``.glb`` or ``.gltf`` file and find its one mesh primitive that carries ``extension``.

    Every member of the JSON that gsrecon reads is checked to have glTF's type first. Raises FileNotFoundError, or
    InputError naming ``path`` and what is wrong (a member by its JSON path, e.g.
    ``meshes[0].primitives[0].attributes.POSITION``): not glTF 2.0, an extension required that gsrecon does not
    implement (anything but ``extension``), no such primitive or more than one, a transform on the way from the
    scene to it, a mode other than POINTS, a buffer that is missing or too short.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    raw = _mapped(path)
    if raw[:4] == GLB_MAGIC:
        document, chunk = _parse_glb(path, raw)
    else:
        document, chunk = _parse_json(path, raw), None
    unknown = [name for name in document.get("extensionsRequired", []) if name != extension]
    if unknown:
        raise InputError(
            f"{path}: extensionsRequired names {', '.join(unknown)}, which gsrecon does not implement (it reads "
            f"{extension}); a glTF loader must refuse such a file"
        )
    primitive, mesh_index = _splat_primitive(path, document, extension)
    _check_placement(path, document, mesh_index)
    buffers = [_buffer(path, document, i, chunk) for i in range(len(document.get("buffers", [])))]
    if "POSITION" not in primitive["attributes"]:
        raise InputError(f"{path}: the splat primitive has no attribute 'POSITION'")
    count = _item(path, document, "accessors", primitive["attributes"]["POSITION"], "POSITION")["count"]
    if count < 1:
        raise InputError(f"{path}: attribute 'POSITION' has count {count}; there are no Gaussians to load")
    return PointPrimitive(path, document, primitive, primitive["extensions"][extension], buffers, count)


def describe(value: Any) -> str:
    """A JSON value as a message names it: a number, string or boolean as JSON writes it (cut at 40 characters),
    an array or object by its kind."""
    if isinstance(value, list):
        return f"an array of {len(value)} item{'s' * (len(value) != 1)}"
    if isinstance(value, dict):
        return "an object"
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


@dataclass(frozen=True)
class _Scalar:
    """A JSON number, string or boolean that ``test`` accepts (``expected``, ``plural``: what that is)."""

    expected: str
    plural: str
    test: Callable[[Any], bool]

    def check(self, path: Path, value: Any, where: str) -> None:
        if not self.test(value):
            raise _wrong_type(path, value, where, self.expected)


@dataclass(frozen=True)
class _Array:
    """A JSON array whose items are all ``item`` (exactly ``length`` of them, where given)."""

    item: _Scalar | _Object | _Array | _Map
    length: int | None = None

    def check(self, path: Path, value: Any, where: str) -> None:
        if not isinstance(value, list) or self.length not in (None, len(value)):
            expected = "an array" if self.length is None else f"an array of {self.length} {self.item.plural}"
            raise _wrong_type(path, value, where, expected)
        for index, item in enumerate(value):
            self.item.check(path, item, f"{where}[{index}]")


@dataclass(frozen=True)
class _Object:
    """A JSON object: its ``members`` checked where present (``required`` ones must be), any others not read."""

    members: Mapping[str, _Scalar | _Object | _Array | _Map] = field(default_factory=dict)
    required: tuple[str, ...] = ()

    def check(self, path: Path, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise _wrong_type(path, value, where, "an object")
        for key in self.required:
            if key not in value:
                raise InputError(f"{path}: {where or 'the JSON document'} has no member '{key}', which glTF requires")
        for key, member in self.members.items():
            if key in value:
                member.check(path, value[key], f"{where}.{key}" if where else key)


@dataclass(frozen=True)
class _Map:
    """A JSON object whose every member is ``item``, whatever its name (a primitive's attributes, extensions)."""

    item: _Scalar | _Object | _Array | _Map

    def check(self, path: Path, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise _wrong_type(path, value, where, "an object")
        for key, member in value.items():
            self.item.check(path, member, f"{where}.{key}")


def _wrong_type(path: Path, value: Any, where: str, expected: str) -> InputError:
    return InputError(f"{path}: {where or 'the JSON document'} is {describe(value)}; it must be {expected}")


_NATURAL = _Scalar("an integer >= 0", "integers >= 0", lambda v: type(v) is int and v >= 0)  # indices, bytes, counts
_NUMBER = _Scalar("a number", "numbers", lambda v: type(v) in (int, float))
_STRING = _Scalar("a string", "strings", lambda v: isinstance(v, str))
_BOOLEAN = _Scalar("true or false", "booleans", lambda v: isinstance(v, bool))
_TRANSFORM = {"matrix": 16, "translation": 3, "rotation": 4, "scale": 3}  # a node's members and their lengths
_IDENTITY = {"matrix": [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1], "translation": [0, 0, 0]}
_IDENTITY |= {"rotation": [0, 0, 0, 1], "scale": [1, 1, 1]}
_DOCUMENT = _Object(  # glTF 2.0's types of the members gsrecon reads (indices and byte counts are never negative)
    {
        "asset": _Object({"version": _STRING}, required=("version",)),
        "extensionsRequired": _Array(_STRING),
        "scene": _NATURAL,
        "scenes": _Array(_Object({"nodes": _Array(_NATURAL)})),
        "nodes": _Array(
            _Object(
                {"mesh": _NATURAL, "children": _Array(_NATURAL)}
                | {key: _Array(_NUMBER, length) for key, length in _TRANSFORM.items()}
            )
        ),
        "meshes": _Array(
            _Object(
                {
                    "primitives": _Array(
                        _Object(
                            {"attributes": _Map(_NATURAL), "mode": _NATURAL, "extensions": _Map(_Object())},
                            required=("attributes",),
                        )
                    )
                },
                required=("primitives",),
            )
        ),
        "accessors": _Array(
            _Object(
                {
                    "bufferView": _NATURAL,
                    "byteOffset": _NATURAL,
                    "componentType": _NATURAL,
                    "normalized": _BOOLEAN,
                    "count": _NATURAL,
                    "type": _STRING,
                },
                required=("componentType", "count", "type"),
            )
        ),
        "bufferViews": _Array(
            _Object(
                {"buffer": _NATURAL, "byteOffset": _NATURAL, "byteLength": _NATURAL, "byteStride": _NATURAL},
                required=("buffer", "byteLength"),
            )
        ),
        "buffers": _Array(_Object({"uri": _STRING, "byteLength": _NATURAL}, required=("byteLength",))),
    },
    required=("asset",),
)


def _mapped(path: Path) -> memoryview:
    """The bytes of the file ``path``, memory-mapped (read as they are used: no copy of a large scene)."""
    if path.stat().st_size == 0:
        raise InputError(f"{path}: the file is empty")
    with open(path, "rb") as f:
        return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))


def _parse_glb(path: Path, raw: memoryview) -> tuple[dict[str, Any], memoryview | None]:
    """The JSON and the binary chunk of a GLB file, after checking the header and chunk lengths against the file."""
    if len(raw) < _GLB_HEADER.size + _CHUNK_HEADER.size:
        raise InputError(f"{path}: a GLB file shorter than its headers; the file is truncated")
    _, version, total = _GLB_HEADER.unpack_from(raw)
    if version != 2:
        raise InputError(f"{path}: GLB version {version}; gsrecon reads glTF 2.0")
    if total > len(raw):
        raise InputError(f"{path}: the GLB header declares {total} bytes but the file has {len(raw)}; it is truncated")
    chunks: list[tuple[bytes, bytes]] = []
    offset = _GLB_HEADER.size
    while offset + _CHUNK_HEADER.size <= total:
        length, kind = _CHUNK_HEADER.unpack_from(raw, offset)
        offset += _CHUNK_HEADER.size
        if offset + length > total:
            raise InputError(f"{path}: a GLB chunk of {length} bytes runs past the end of the file; it is truncated")
        chunks.append((kind, raw[offset : offset + length]))
        offset += length
    if not chunks or chunks[0][0] != _JSON_CHUNK:
        raise InputError(f"{path}: the GLB file does not start with a JSON chunk")
    binary = next((data for kind, data in chunks[1:] if kind == _BIN_CHUNK), None)
    return _parse_json(path, chunks[0][1]), binary


def _parse_json(path: Path, text: memoryview) -> dict[str, Any]:
    """The glTF JSON document, refused unless every member gsrecon reads has glTF's type and the asset says
    version 2.x."""
    try:
        document = json.loads(bytes(text).decode("utf-8"))
    except RecursionError:
        raise InputError(f"{path}: not a glTF file (its JSON nests deeper than gsrecon reads)") from None
    except ValueError as e:  # not UTF-8, not JSON, or an integer of more digits than Python converts
        raise InputError(f"{path}: not a glTF file (its JSON cannot be read: {e})") from e
    _DOCUMENT.check(path, document, "")
    version = document["asset"]["version"]
    if not version.startswith("2."):
        raise InputError(f"{path}: not a glTF 2.0 file (asset.version is {describe(version)})")
    return document


def _splat_primitive(path: Path, document: dict[str, Any], extension: str) -> tuple[dict[str, Any], int]:
    """The one primitive carrying ``extension`` and the index of its mesh; refused unless it is a POINTS one."""
    found = [
        (primitive, mesh_index)
        for mesh_index, mesh in enumerate(document.get("meshes", []))
        for primitive in mesh["primitives"]
        if extension in primitive.get("extensions", {})
    ]
    if len(found) != 1:
        raise InputError(
            f"{path}: {len(found)} mesh primitives carry {extension}; gsrecon reads a file with exactly one"
        )
    primitive, mesh_index = found[0]
    mode = primitive.get("mode", 4)  # glTF's default: TRIANGLES
    if mode != _POINTS:
        raise InputError(f"{path}: the {extension} primitive has mode {mode}; it must be 0 (POINTS)")
    return primitive, mesh_index


def _check_placement(path: Path, document: dict[str, Any], mesh_index: int) -> None:
    """Refuse a scene that draws the mesh moved by a transform, on its own node or on any node above it, or draws it
    more than once (gsrecon reads the points as they are stored, once), and node trees glTF forbids (a node with
    two parents, a scene root that is a child). The scene is ``scene``, else the first of ``scenes``, else every
    node that is no node's child; nodes outside it are not drawn."""
    nodes, parents = document.get("nodes", []), {}
    for index, node in enumerate(nodes):
        for child in node.get("children", []):
            if child in parents:
                raise InputError(
                    f"{path}: node {child} is a child of node {parents[child]} and of node {index}; a glTF node has "
                    "one parent"
                )
            parents[child] = index
    if "scene" in document or document.get("scenes"):
        scene = document.get("scene", 0)
        roots, where = _item(path, document, "scenes", scene, "scene").get("nodes", []), f"scenes[{scene}].nodes"
    else:
        roots, where = [index for index in range(len(nodes)) if index not in parents], "nodes"
    if len(set(roots)) < len(roots):
        raise InputError(f"{path}: {where} names a node twice; a scene's root nodes are distinct")
    child = next((root for root in roots if root in parents), None)
    if child is not None:
        raise InputError(f"{path}: {where} names node {child}, a child of node {parents[child]}; it must be a root")
    pending = [(root, where, None) for root in reversed(roots)]  # (node, who names it, the first transform above it)
    placed = []
    while pending:  # depth first, without recursion: a chain of nodes may be as long as the file
        index, named_by, moved = pending.pop()
        node = _item(path, document, "nodes", index, named_by)
        transform = [key for key in _TRANSFORM if key in node and node[key] != _IDENTITY[key]]
        moved = moved or ((index, transform) if transform else None)
        if node.get("mesh") == mesh_index:
            placed.append((index, moved))
        pending += [(child, f"nodes[{index}].children", moved) for child in reversed(node.get("children", []))]
    if len(placed) > 1:
        raise InputError(
            f"{path}: the scene draws the splats {len(placed)} times (nodes {', '.join(str(i) for i, _ in placed)}); "
            "gsrecon reads a file that draws them once"
        )
    if placed and placed[0][1] is not None:
        index, (mover, transform) = placed[0]
        whose = f"node {index}, which" if mover == index else f"node {mover}, above node {index} which"
        raise InputError(
            f"{path}: {whose} holds the splats, moves them with a transform ({', '.join(transform)}); gsrecon "
            "reads splats stored in the file's own frame: bake the transform into them first"
        )


def _buffer(path: Path, document: dict[str, Any], index: int, chunk: memoryview | None) -> memoryview | bytes | None:
    """The bytes of buffer ``index``: the GLB binary chunk, a base64 ``data:`` URI, or a file beside ``path``."""
    buffer, where = document["buffers"][index], f"buffers[{index}].uri"
    uri = buffer.get("uri")
    if uri is None:
        data = chunk if index == 0 else None
    elif uri.startswith("data:"):
        header, _, payload = uri.partition(",")
        if not header.endswith(";base64"):
            raise InputError(f"{path}: {where} is a data URI that is not base64")
        try:
            data = base64.b64decode(payload, validate=True)
        except binascii.Error as e:
            raise InputError(f"{path}: {where} is a data URI whose base64 cannot be read ({e})") from None
    else:
        name = urllib.parse.unquote(uri)
        source = None if "://" in uri or "\x00" in name else (path.parent / name).resolve()
        if source is None or not source.is_relative_to(path.parent.resolve()):
            raise InputError(f"{path}: {where} is {describe(uri)}; gsrecon reads buffers in the file's own folder")
        try:
            data = _mapped(source) if source.is_file() else None
        except OSError as e:
            raise InputError(f"{path}: {where} names {describe(name)}, which cannot be read ({e.strerror})") from e
        if data is None:
            raise InputError(f"{path}: {where} names {name}, which is not there")
    length = buffer["byteLength"]
    if data is not None and length > len(data):
        raise InputError(f"{path}: buffer {index} declares {length} bytes but holds {len(data)}; it is truncated")
    return data


def _item(path: Path, document: dict[str, Any], kind: str, index: int, what: str) -> dict[str, Any]:
    """``document[kind][index]``, refused with an InputError naming ``what`` when there is no such item."""
    items = document.get(kind, [])
    if index >= len(items):
        raise InputError(f"{path}: {what} names {kind[:-1]} {index}, which the file does not have")
    return items[index]
