"""SuperSplat / PlayCanvas compressed PLY: Gaussians quantised in chunks of 256 (16 bytes each, plus SH).

The layout PlayCanvas splat-transform writes and the PlayCanvas engine and SuperSplat read, binary
little-endian, with the render mode in the header comments as in `gsrecon.model.ply`:

- ``element chunk C`` (C = ceil(N / 256)), 18 float32 each: the bounds over the chunk's Gaussians of
  the position (``min_x min_y min_z max_x max_y max_z``), of the log scale (``min_scale_x`` ..
  ``max_scale_z``, clamped to [-20, 20]) and of the DC colour ``0.5 + SH_C0 * sh0`` (``min_r`` .. ``max_b``);
- ``element vertex N``, 4 uint32 each, values normalised to their chunk's bounds:
  ``packed_position`` and ``packed_scale`` (x, y, z in 11, 10, 11 bits, x highest),
  ``packed_rotation`` (the normalised quaternion (w, x, y, z) as smallest three: the index of the
  largest component in the top 2 bits, the others as ``q * sqrt(1/2) + 0.5`` in 10 bits each),
  ``packed_color`` (r, g, b and ``sigmoid(opacity)`` in 8 bits each, r highest);
- ``element sh N`` when the SH degree is above 0: uchar ``f_rest_*`` in the reference PLY order,
  ``trunc((v / 8 + 0.5) * 256)`` clipped to [0, 255].

Gaussians are stored in Morton order so that the 256 of a chunk are close together in space.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch
from plyfile import PlyData
from torch import Tensor

from gsrecon.atomic import atomic_path
from gsrecon.errors import InputError
from gsrecon.export.base import ExportContext, ExportFormat
from gsrecon.export.quantise import (
    byte_logit,
    from_smallest_three,
    pack_2_10_10_10,
    round_clamp,
    smallest_three,
    unpack_2_10_10_10,
)
from gsrecon.io.ply import finite_column, read_ply, write_binary_ply
from gsrecon.model.ply import cpu_params, num_rest_coeffs, render_mode_comments
from gsrecon.params import PARAM_NAMES
from gsrecon.registry import EXPORT_REGISTRY
from gsrecon.sh import rgb_to_sh, sh_to_rgb

CHUNK_SIZE = 256
_BOUNDS = {"position": ("x", "y", "z"), "scale": ("scale_x", "scale_y", "scale_z"), "color": ("r", "g", "b")}
CHUNK_PROPERTIES = [f"{end}_{axis}" for axes in _BOUNDS.values() for end in ("min", "max") for axis in axes]
VERTEX_PROPERTIES = ["packed_position", "packed_rotation", "packed_scale", "packed_color"]
_SCALE_LIMIT = 20.0  # log-scale bounds are clamped to +-this (splat-transform: "sometimes values are at infinity")
_MORTON_BITS = 21  # per axis: three interleaved fit a 63-bit code
_ENCODE_ROWS = 1 << 16  # Gaussians encoded at once (a multiple of CHUNK_SIZE): bounded memory at millions


def save_compressed_ply(path: str | os.PathLike, params: Mapping[str, Tensor], *, antialiased: bool = False) -> None:
    """Write Gaussians as a compressed PLY (layout in the module docstring), atomically."""
    p = cpu_params(params)
    order = morton_order(p["means"])  # [N]
    n, num_rest = p["shN"].shape[:2]
    chunk_columns = torch.empty(math.ceil(n / CHUNK_SIZE), len(CHUNK_PROPERTIES))  # [C, 18]
    vertex_columns = np.empty((n, len(VERTEX_PROPERTIES)), np.uint32)  # [N, 4]
    for start in range(0, n, _ENCODE_ROWS):  # bounded memory at millions of Gaussians
        block = {key: p[key][order[start : start + _ENCODE_ROWS]] for key in PARAM_NAMES if key != "shN"}
        chunks, vertices = _encode_block(block)
        chunk_columns[start // CHUNK_SIZE : start // CHUNK_SIZE + len(chunks)] = chunks
        vertex_columns[start : start + len(vertices)] = vertices

    def sh_rows(start: int, stop: int) -> np.ndarray:  # [stop - start, 3K] quantised f_rest_*, channel-major
        rest_sh = p["shN"][order[start:stop]].transpose(1, 2).reshape(stop - start, 3 * num_rest)
        return torch.trunc((rest_sh / 8 + 0.5) * 256).clamp(0, 255).to(torch.uint8).numpy()

    elements = [
        _element("chunk", CHUNK_PROPERTIES, chunk_columns.numpy(), "<f4"),
        _element("vertex", VERTEX_PROPERTIES, vertex_columns, "<u4"),
    ]
    if num_rest:
        names = [f"f_rest_{i}" for i in range(3 * num_rest)]
        elements.append(("sh", np.dtype([(name, "u1") for name in names]), n, sh_rows))
    with atomic_path(path) as tmp:
        write_binary_ply(tmp, elements, render_mode_comments(antialiased))


@EXPORT_REGISTRY.register("compressed_ply")
class CompressedPlyFormat(ExportFormat):
    """SuperSplat / PlayCanvas compressed PLY: 16 bytes per Gaussian plus 8-bit SH."""

    suffixes = (".compressed.ply",)

    def write(self, path: Path, params: Mapping[str, Tensor], *, antialiased: bool, context: ExportContext) -> None:
        save_compressed_ply(path, params, antialiased=antialiased)


def _encode_block(p: Mapping[str, Tensor]) -> tuple[Tensor, np.ndarray]:
    """The chunk rows [c, 18] and packed vertex rows [m, 4] of Gaussians ``p`` (m rows, in storage order,
    starting at a chunk boundary)."""
    colors = sh_to_rgb(p["sh0"][:, 0])  # [M, 3]
    bounds = {
        "position": _chunk_bounds(p["means"]),
        "scale": tuple(b.clamp(-_SCALE_LIMIT, _SCALE_LIMIT) for b in _chunk_bounds(p["scales"])),
        "color": _chunk_bounds(colors),
    }
    alpha = round_clamp(torch.sigmoid(p["opacities"]) * 255, 255)  # [M]
    rgb = round_clamp(_normalise(colors, *bounds["color"]) * 255, 255)  # [M, 3]
    largest, rest = smallest_three(torch.nn.functional.normalize(p["quats"], dim=1))
    packed = {
        "packed_position": _pack_11_10_11(_normalise(p["means"], *bounds["position"])),
        "packed_rotation": pack_2_10_10_10(largest, round_clamp((rest * math.sqrt(0.5) + 0.5) * 1023, 1023)),
        "packed_scale": _pack_11_10_11(_normalise(p["scales"], *bounds["scale"])),
        "packed_color": (rgb[:, 0] << 24) | (rgb[:, 1] << 16) | (rgb[:, 2] << 8) | alpha,
    }
    chunk_columns = torch.cat([torch.cat(bounds[name], dim=1) for name in _BOUNDS], dim=1)  # [c, 18]
    return chunk_columns, torch.stack(list(packed.values()), dim=1).to(torch.int32).numpy().view(np.uint32)


def load_compressed_ply(path: str | os.PathLike) -> dict[str, Tensor]:
    """Decode a compressed PLY into gsrecon's pre-activation parameters (in the file's order).

    Reads chunk elements with or without the colour bounds, as the PlayCanvas reader does.
    Raises FileNotFoundError, or ValueError naming ``path`` when the file is not a compressed PLY.
    """
    path = Path(path)
    ply = read_ply(path)
    names = {e.name: {prop.name for prop in e.properties} for e in ply.elements}
    required = {"chunk": CHUNK_PROPERTIES[:12], "vertex": VERTEX_PROPERTIES}
    for element, props in required.items():
        if element not in names or not set(props) <= names[element]:
            raise InputError(f"{path}: not a compressed PLY (needs element '{element}' with properties {props})")
    n, num_chunks = ply["vertex"].count, ply["chunk"].count
    if n == 0 or num_chunks != math.ceil(n / CHUNK_SIZE):
        raise InputError(f"{path}: {num_chunks} chunks for {n} Gaussians; expected ceil(N / {CHUNK_SIZE}) and N > 0")
    chunk = {name: torch.from_numpy(finite_column(path, name, ply["chunk"][name])) for name in names["chunk"]}
    per_gaussian = {name: values.repeat_interleave(CHUNK_SIZE)[:n] for name, values in chunk.items()}  # [N] each

    def bounded(kind: str, t: Tensor) -> Tensor:  # [N, 3] from fractions [N, 3] of the chunk's bounds
        lo = torch.stack([per_gaussian[f"min_{axis}"] for axis in _BOUNDS[kind]], dim=1)
        hi = torch.stack([per_gaussian[f"max_{axis}"] for axis in _BOUNDS[kind]], dim=1)
        return lo * (1 - t) + hi * t

    vertex = {name: torch.from_numpy(ply["vertex"][name].astype(np.int64)) for name in VERTEX_PROPERTIES}
    color = vertex["packed_color"]
    rgb = torch.stack([(color >> shift) & 255 for shift in (24, 16, 8)], dim=1).double() / 255  # [N, 3]
    largest, fields = unpack_2_10_10_10(vertex["packed_rotation"])
    return {
        "means": bounded("position", _unpack_11_10_11(vertex["packed_position"])),
        "scales": bounded("scale", _unpack_11_10_11(vertex["packed_scale"])),
        "quats": from_smallest_three(largest, (fields.double() / 1023 - 0.5) / math.sqrt(0.5)),
        "opacities": byte_logit(color & 255),
        "sh0": rgb_to_sh(bounded("color", rgb) if "min_r" in chunk else rgb).float()[:, None, :],
        "shN": _load_rest_sh(path, ply, n),
    }


def morton_order(means: Tensor) -> Tensor:
    """Indices [N] that sort points [N, 3] along a Z-order (Morton) curve through their bounding box."""
    lo, hi = means.min(dim=0).values, means.max(dim=0).values
    top = (1 << _MORTON_BITS) - 1
    code = torch.zeros(means.shape[0], dtype=torch.long)  # [N]
    for start in range(0, means.shape[0], _ENCODE_ROWS):  # bounded memory at millions of Gaussians
        rows = means[start : start + _ENCODE_ROWS]
        cells = ((rows - lo) / (hi - lo).clamp_min(1e-12) * top).long().clamp(0, top)  # [M, 3]
        for bit in range(_MORTON_BITS):  # interleave: bit b of axis a goes to bit 3b + a of the code
            for axis in range(3):
                code[start : start + _ENCODE_ROWS] |= ((cells[:, axis] >> bit) & 1) << (3 * bit + axis)
    return torch.argsort(code, stable=True)


def _chunk_bounds(values: Tensor) -> tuple[Tensor, Tensor]:
    """Per-chunk minimum and maximum [C, 3] of ``values`` [N, 3]."""
    n = values.shape[0]
    padded = torch.cat([values, values[-1:].expand((-n) % CHUNK_SIZE, -1)])  # the last chunk repeats its last row
    chunks = padded.reshape(-1, CHUNK_SIZE, values.shape[1])  # [C, 256, 3]
    return chunks.amin(dim=1), chunks.amax(dim=1)


def _normalise(values: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """``values`` [N, 3] as fractions of their chunk's bounds ``lo``, ``hi`` [C, 3], as the reference encoder does."""
    n = values.shape[0]
    lo, hi = lo.repeat_interleave(CHUNK_SIZE, dim=0)[:n], hi.repeat_interleave(CHUNK_SIZE, dim=0)[:n]
    span = hi - lo
    t = torch.where(span < 1e-5, 0.0, (values - lo) / torch.where(span < 1e-5, 1.0, span))
    return torch.where(values <= lo, 0.0, torch.where(values >= hi, 1.0, t))


def _pack_11_10_11(t: Tensor) -> Tensor:
    """Fractions [N, 3] in [0, 1] as one uint32 (int64) [N]: x in the top 11 bits, y in 10, z in the low 11."""
    return (
        (round_clamp(t[:, 0] * 2047, 2047) << 21)
        | (round_clamp(t[:, 1] * 1023, 1023) << 11)
        | round_clamp(t[:, 2] * 2047, 2047)
    )


def _unpack_11_10_11(words: Tensor) -> Tensor:
    """Inverse of `_pack_11_10_11`: fractions [N, 3]."""
    return torch.stack([((words >> 21) & 2047) / 2047, ((words >> 11) & 1023) / 1023, (words & 2047) / 2047], dim=1)


def _load_rest_sh(path: Path, ply: PlyData, n: int) -> Tensor:
    """The rest SH coefficients [N, K, 3] of the ``sh`` element (K = 0 without one)."""
    if "sh" not in ply:
        return torch.zeros(n, 0, 3)
    sh = ply["sh"]
    num_rest = num_rest_coeffs(path, {prop.name for prop in sh.properties})
    if sh.count != n:
        raise InputError(f"{path}: element 'sh' has {sh.count} rows for {n} Gaussians")
    raw = torch.from_numpy(np.stack([sh[f"f_rest_{i}"] for i in range(3 * num_rest)], axis=1).astype(np.float64))
    level = torch.where(raw == 0, 0.0, torch.where(raw == 255, 1.0, (raw + 0.5) / 256))  # [N, 3K]
    return ((level - 0.5) * 8).float().reshape(n, 3, num_rest).transpose(1, 2).contiguous()


def _element(
    name: str, properties: list[str], columns: np.ndarray, dtype: str
) -> tuple[str, np.dtype, int, Callable[[int, int], np.ndarray]]:
    """A `write_binary_ply` element with one ``dtype`` property per column of ``columns`` [rows, properties]."""
    return name, np.dtype([(prop, dtype) for prop in properties]), columns.shape[0], lambda a, b: columns[a:b]
