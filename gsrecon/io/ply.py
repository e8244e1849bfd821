"""PLY files, whatever their elements hold: the header checks every reader runs before trusting a file, reading,
and writing binary little-endian PLYs in bounded memory. The layouts live with their users: Gaussians in
`gsrecon.model.ply` and `gsrecon.export.compressed_ply`, point clouds (:func:`write_points_ply`) here."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from plyfile import PlyData, PlyElement, PlyParseError

from gsrecon.atomic import atomic_path
from gsrecon.errors import InputError

_MAX_HEADER_BYTES = 1 << 20  # a header longer than this is not a scene gsrecon reads
_TYPE_BYTES = {
    **dict.fromkeys(("char", "int8", "uchar", "uint8"), 1),
    **dict.fromkeys(("short", "int16", "ushort", "uint16"), 2),
    **dict.fromkeys(("int", "int32", "uint", "uint32", "float", "float32"), 4),
    **dict.fromkeys(("double", "float64"), 8),
}
_FORMATS = ("ascii", "binary_little_endian", "binary_big_endian")


@dataclass(frozen=True)
class PlyHeader:
    """What a PLY header declares: ``elements`` as (name, row count, minimum bytes per row) in file order."""

    fmt: str  # ascii | binary_little_endian | binary_big_endian
    elements: list[tuple[str, int, int]]
    comments: list[str]
    size: int  # bytes from the start of the file to the end of the ``end_header`` line


_PLY_TYPES = {"<f4": "float", "<u4": "uint", "|u1": "uchar", "<i4": "int"}
WRITE_CHUNK_ROWS = 1 << 16  # rows converted at once by `write_binary_ply` (bounded memory)


def write_binary_ply(
    path: str | os.PathLike,
    elements: list[tuple[str, np.dtype, int, Callable[[int, int], np.ndarray]]],
    comments: list[str],
) -> None:
    """Write a binary little-endian PLY, each element's rows produced ``WRITE_CHUNK_ROWS`` at a time.

    ``elements`` are ``(name, structured dtype, row count, rows(start, stop))``: the dtype names the
    properties, ``rows`` returns rows ``start:stop`` as a native little-endian ``[stop - start, P]``
    array of their (common) type. The bytes are those plyfile writes for the whole arrays, without
    ever holding a whole element in memory.
    """
    header = ["ply", "format binary_little_endian 1.0", *(f"comment {c}" for c in comments)]
    for name, dtype, count, _ in elements:
        header.append(f"element {name} {count}")
        header += [f"property {_PLY_TYPES[field.str]} {prop}" for prop, (field, _) in dtype.fields.items()]
    header.append("end_header")
    with open(path, "wb") as f:
        f.write(("\n".join(header) + "\n").encode("ascii"))
        for _, _, count, rows in elements:
            for start in range(0, count, WRITE_CHUNK_ROWS):
                f.write(np.ascontiguousarray(rows(start, min(start + WRITE_CHUNK_ROWS, count))).tobytes())


def read_ply(path: Path) -> PlyData:
    """Read a PLY file with a ``vertex`` element, after checking that its header fits the file size.

    Raises FileNotFoundError or ValueError naming ``path`` (see `load_ply`).
    """
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    check_ply_size(path, read_ply_header(path))
    try:
        ply = PlyData.read(str(path))
    except (PlyParseError, ValueError, EOFError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not a readable PLY file ({e})") from e
    if "vertex" not in ply:
        raise InputError(f"{path}: no 'vertex' element; not a 3DGS scene")
    return ply


def read_ply_header(path: Path) -> PlyHeader:
    """Parse the header of the PLY file ``path``, reading at most its first MiB.

    Raises ValueError naming ``path`` when the header is missing or malformed.
    """
    with open(path, "rb") as f:
        head = f.read(_MAX_HEADER_BYTES)
    match = re.search(rb"^end_header\r?\n", head, re.MULTILINE)
    if not head.startswith(b"ply") or match is None:
        raise InputError(f"{path}: not a readable PLY file (no 'ply ... end_header' header in its first MiB)")
    fmt, comments = "", []
    elements: list[tuple[str, int, list[int]]] = []  # name, rows, bytes of each property in a binary row
    for number, line in enumerate(head[: match.start()].decode("latin-1").splitlines()[1:], start=2):
        words = line.split()
        if words[:1] == ["comment"]:
            comments.append(line.strip()[len("comment") :].strip())
        elif words[:1] == ["format"] and len(words) == 3 and words[1] in _FORMATS:
            fmt = words[1]
        elif words[:1] == ["element"] and len(words) == 3 and words[2].isdigit():
            elements.append((words[1], int(words[2]), []))
        elif words[:1] == ["property"] and elements and (size := _property_bytes(words)) is not None:
            elements[-1][2].append(size)
        elif words and words[0] != "obj_info":
            raise InputError(f"{path}: not a readable PLY file (header line {number} '{line.strip()}' is not valid)")
    if not fmt:
        raise InputError(f"{path}: not a readable PLY file (no valid 'format' line in its header)")
    rows = [(name, count, 2 * len(sizes) if fmt == "ascii" else sum(sizes)) for name, count, sizes in elements]
    return PlyHeader(fmt, rows, comments, match.end())  # ascii: each value is at least a digit and a separator


def check_ply_size(path: Path, header: PlyHeader) -> None:
    """Refuse a PLY whose header declares more rows than the bytes after it can hold (before reading them)."""
    have = path.stat().st_size - header.size
    slack = 1 if header.fmt == "ascii" else 0  # the last ascii row may end without a separator
    need = 0
    for name, count, row_bytes in header.elements:
        need += count * row_bytes
        if need > have + slack:
            raise InputError(
                f"{path}: the header declares {count} '{name}' rows, more than the {have} bytes after it can "
                "hold; the file is truncated or its header is corrupt"
            )


def finite_column(path: Path, name: str, values: np.ndarray) -> np.ndarray:
    """``values`` as float32, refused with a ValueError naming ``path`` and property ``name`` if any is NaN or inf."""
    column = np.asarray(values, dtype=np.float32)
    bad = np.flatnonzero(~np.isfinite(column))
    if bad.size:
        raise InputError(
            f"{path}: property '{name}' has {bad.size} NaN/inf values (first at row {bad[0]}); "
            "the scene is corrupt (a diverged run?) and cannot be used"
        )
    return column


def write_points_ply(path: str | Path, points: np.ndarray, colors: np.ndarray) -> None:
    """Write points ``[P, 3]`` and uint8 colours ``[P, 3]`` as a binary PLY (``x y z`` float32, ``red green blue``
    uchar: the layout of nerfstudio's ``sparse_pc.ply`` and 3DGS's ``points3D.ply``), atomically."""
    vertices = np.empty(
        len(points), dtype=[(axis, "<f4") for axis in "xyz"] + [(c, "u1") for c in ("red", "green", "blue")]
    )
    for i, axis in enumerate("xyz"):
        vertices[axis] = points[:, i]
    for i, channel in enumerate(("red", "green", "blue")):
        vertices[channel] = colors[:, i]
    ply = PlyData([PlyElement.describe(vertices, "vertex")], text=False, byte_order="<")
    with atomic_path(path) as tmp:
        ply.write(str(tmp))


def _property_bytes(words: list[str]) -> int | None:
    """Least bytes a binary row spends on the property declared by ``words``; None if the declaration is invalid."""
    if len(words) == 3 and words[1] in _TYPE_BYTES:
        return _TYPE_BYTES[words[1]]
    if len(words) == 5 and words[1] == "list" and words[2] in _TYPE_BYTES and words[3] in _TYPE_BYTES:
        return _TYPE_BYTES[words[2]]  # an empty list is just its length
    return None
