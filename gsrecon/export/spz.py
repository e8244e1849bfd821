"""Niantic SPZ, versions 2 and 3: the gzip-compressed versions that web viewers read (github.com/nianticlabs/spz).

An SPZ file is a gzip stream of a 16-byte little-endian header (magic 0x5053474e "NGSP", version,
number of Gaussians as uint32; SH degree, fractional bits, flags (0x1: antialiased), reserved as
uint8) followed by each attribute for all Gaussians in turn:

- positions: 3 x 24-bit signed fixed point with the header's fractional bits;
- alphas: ``sigmoid(opacity)`` in 8 bits;
- colours: the DC coefficient as ``sh0 * 0.15 + 0.5`` in 8 bits (0.15 instead of SH_C0 leaves room
  for colours outside [0, 1]);
- scales: log scales as ``(s + 10) * 16`` in 8 bits;
- rotations of the normalised quaternion (x, y, z, w): version 3 keeps the three smallest
  components (sign + 9-bit magnitude over sqrt(1/2) each, first in the highest bits) and the index
  of the largest (top 2 bits) in a little-endian uint32; version 2 keeps x, y, z of the quaternion
  with w >= 0 as ``q * 127.5 + 127.5`` in 8 bits;
- SH rest coefficients as ``v * 128 + 128`` in 8 bits, coefficient-major with the colour channel
  inner, on a 5-bit grid for degree 1 and a 4-bit grid above (the reference encoder's defaults).

SPZ stores right-up-back (RUB) axes and gsrecon right-down-front (RDF, OpenCV, as PLY files): the
writer turns the scene 180 degrees about x (y and z negate) and the reader turns it back, as the
reference library does when told the data is RDF. The writer uses 12 fractional bits like the
reference encoder, fewer when a coordinate would not fit in 24 bits (decoders read the field).
"""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
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
from gsrecon.io.ply import WRITE_CHUNK_ROWS
from gsrecon.model.ply import cpu_params
from gsrecon.params import check_params
from gsrecon.registry import EXPORT_REGISTRY
from gsrecon.sh import MAX_SH_DEGREE, axis_flip_sh_signs, num_sh_bases

SPZ_MAGIC = 0x5053474E
SPZ_VERSIONS = (2, 3)
FLAG_ANTIALIASED = 0x1
_HEADER = struct.Struct("<IIIBBBB")  # magic, version, points, SH degree, fractional bits, flags, reserved
_COLOR_SCALE = 0.15
_FRACTIONAL_BITS = 12
_RDF_TO_RUB = torch.tensor([1.0, -1.0, -1.0])  # 180 degrees about x; its own inverse
_MAX_DEFLATE_RATIO = 1032  # deflate never expands data by more than this when decompressing


def save_spz(
    path: str | os.PathLike, params: Mapping[str, Tensor], *, antialiased: bool = False, version: int = 3
) -> None:
    """Write Gaussians as an SPZ file of ``version`` 2 or 3 (layout in the module docstring), atomically.

    Raises ValueError for another version, or a coordinate beyond the 24-bit range (+-8388607).
    """
    if version not in SPZ_VERSIONS:
        raise ValueError(f"SPZ version must be one of {SPZ_VERSIONS}, got {version}")
    p = cpu_params(params)
    n, degree = p["means"].shape[0], check_params(p)
    bits = _fractional_bits(p["means"].double() * _RDF_TO_RUB)
    sh_signs = axis_flip_sh_signs(_RDF_TO_RUB, p["shN"].shape[1])[:, None]  # [K, 1]
    streams = [  # each attribute's bytes [M, ...] for Gaussians start:stop
        lambda a, b: _pack_positions(p["means"][a:b], bits),
        lambda a, b: round_clamp(torch.sigmoid(p["opacities"][a:b]) * 255, 255),
        lambda a, b: round_clamp(p["sh0"][a:b, 0] * (_COLOR_SCALE * 255) + 127.5, 255),
        lambda a, b: round_clamp((p["scales"][a:b] + 10) * 16, 255),
        lambda a, b: _pack_rotations(p["quats"][a:b], version),
        lambda a, b: _quantise_sh(p["shN"][a:b] * sh_signs),
    ]
    flags = FLAG_ANTIALIASED if antialiased else 0
    # Compressed chunk by chunk (bounded memory); the bytes equal gzip.compress(payload, 6, mtime=0)'s.
    gz = zlib.compressobj(level=6, wbits=31)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(gz.compress(_HEADER.pack(SPZ_MAGIC, version, n, degree, bits, flags, 0)))
        for stream in streams:
            for start in range(0, n, WRITE_CHUNK_ROWS):
                f.write(gz.compress(np.asarray(stream(start, start + WRITE_CHUNK_ROWS), dtype=np.uint8).tobytes()))
        f.write(gz.flush())


@EXPORT_REGISTRY.register("spz")
class SpzFormat(ExportFormat):
    """Niantic SPZ version 3, gzip-compressed."""

    suffixes = (".spz",)

    def write(self, path: Path, params: Mapping[str, Tensor], *, antialiased: bool, context: ExportContext) -> None:
        save_spz(path, params, antialiased=antialiased)


def _pack_positions(means: Tensor, bits: int) -> np.ndarray:
    """Positions [N, 3] (RDF) as SPZ's 24-bit fixed point in RUB axes, bytes [N, 3, 3]."""
    fixed = _round_half_away(means.double() * _RDF_TO_RUB * 2**bits).to(torch.int32).numpy().astype("<i4")
    return fixed.view(np.uint8).reshape(-1, 3, 4)[:, :, :3]  # two's complement: a little-endian int32's low 3 bytes


def load_spz(path: str | os.PathLike) -> tuple[dict[str, Tensor], bool]:
    """Decode an SPZ file of version 2 or 3: gsrecon's pre-activation parameters and the antialiased flag.

    Raises FileNotFoundError, or ValueError naming ``path`` when it is not a readable SPZ file of
    these versions (including a header that claims more Gaussians than the file can hold).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    with open(path, "rb") as f:
        start = f.read(4)
    if start == b"NGSP":
        raise InputError(f"{path}: SPZ version 4 (zstd) is not supported; re-save it as version 3")
    if start[:2] != b"\x1f\x8b":
        raise InputError(f"{path}: not an SPZ file (not gzip-compressed)")
    try:
        with gzip.open(path, "rb") as f:
            header = f.read(_HEADER.size)
            if len(header) < _HEADER.size:
                raise InputError(f"{path}: truncated: {len(header)} of the {_HEADER.size} header bytes")
            magic, version, n, degree, bits, flags, _ = _HEADER.unpack(header)
            num_rest = num_sh_bases(min(degree, MAX_SH_DEGREE)) - 1
            sizes = [9 * n, n, 3 * n, 3 * n, (3 if version == 2 else 4) * n, 3 * num_rest * n]
            _check_header(path, magic, version, n, degree, bits, sum(sizes))
            payload = _read_at_most(f, sum(sizes))
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(f"{path}: not a readable SPZ file ({e})") from e
    if len(payload) < sum(sizes):
        raise InputError(f"{path}: truncated: {len(payload)} of the {sum(sizes)} data bytes its header declares")
    offsets = np.cumsum([0, *sizes])
    raw = [torch.from_numpy(np.frombuffer(payload, np.uint8, s, o).astype(np.int64)) for s, o in zip(sizes, offsets)]
    positions, alphas, colors, scales, rotations, sh = raw
    fixed = positions.reshape(n, 3, 3)
    fixed = fixed[..., 0] | (fixed[..., 1] << 8) | (fixed[..., 2] << 16)  # [N, 3]
    fixed = fixed - ((fixed & 0x800000) << 1)  # 24-bit two's complement: bit 23 weighs -2^23
    params = {
        "means": (fixed.double() * 2.0**-bits * _RDF_TO_RUB).float(),
        "scales": scales.reshape(n, 3).float() / 16 - 10,
        "quats": _unpack_rotations(rotations, n, version),
        "opacities": byte_logit(alphas),
        "sh0": ((colors.reshape(n, 1, 3).double() / 255 - 0.5) / _COLOR_SCALE).float(),
        "shN": (sh.reshape(n, num_rest, 3).float() - 128) / 128 * axis_flip_sh_signs(_RDF_TO_RUB, num_rest)[:, None],
    }
    return params, bool(flags & FLAG_ANTIALIASED)


def _check_header(path: Path, magic: int, version: int, n: int, degree: int, bits: int, data_bytes: int) -> None:
    """Refuse a header that is not SPZ 2 / 3 or declares more data than the compressed file can hold."""
    if magic != SPZ_MAGIC:
        raise InputError(f"{path}: not an SPZ file (magic {magic:#010x}, expected {SPZ_MAGIC:#010x})")
    if version not in SPZ_VERSIONS:
        raise InputError(f"{path}: SPZ version {version} is not supported (only {SPZ_VERSIONS})")
    if degree > MAX_SH_DEGREE or bits > 23:
        raise InputError(f"{path}: SH degree {degree} (max {MAX_SH_DEGREE}) or fractional bits {bits} (max 23)")
    if n == 0:
        raise InputError(f"{path}: the header declares 0 Gaussians; there is nothing to load")
    if data_bytes > path.stat().st_size * _MAX_DEFLATE_RATIO:
        raise InputError(
            f"{path}: the header declares {n} Gaussians, more than a {path.stat().st_size}-byte file can hold; "
            "the file is corrupt"
        )


def _read_at_most(f: gzip.GzipFile, size: int) -> bytes:
    """Up to ``size`` bytes from ``f``, read in blocks so that no buffer of ``size`` is reserved up front."""
    data = bytearray()
    while len(data) < size and (block := f.read(min(size - len(data), 1 << 24))):
        data += block
    return bytes(data)


def _fractional_bits(means: Tensor) -> int:
    """The most fractional bits, up to the reference's 12, at which every coordinate fits 24-bit fixed point."""
    largest = float(means.abs().max()) if means.numel() else 0.0
    for bits in range(_FRACTIONAL_BITS, -1, -1):
        if _round_half_away(torch.tensor(largest * 2.0**bits)) <= 2**23 - 1:
            return bits
    raise InputError(f"SPZ stores coordinates as 24-bit integers: |coordinate| {largest:g} exceeds {2**23 - 1}")


def _round_half_away(x: Tensor) -> Tensor:
    """Round to the nearest integer, halves away from zero (C++ ``std::round``, which the reference uses)."""
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


def _pack_rotations(quats: Tensor, version: int) -> np.ndarray:
    """Rotations [N, 4] (w, x, y, z) as SPZ bytes [N, 4] (version 3) or [N, 3] (version 2), in RUB axes."""
    q = torch.nn.functional.normalize(quats.double(), dim=1)[:, [1, 2, 3, 0]]  # [N, 4] x, y, z, w
    q[:, :3] *= _RDF_TO_RUB  # the same 180-degree turn about x, applied to the rotation
    if version == 2:
        q = q * torch.where(q[:, 3:] < 0, -1.0, 1.0)  # w >= 0
        return round_clamp(q[:, :3] * 127.5 + 127.5, 255).numpy()
    largest, rest = smallest_three(q)
    magnitude = torch.floor(rest.abs() / math.sqrt(0.5) * 511 + 0.5).clamp(max=511).long()
    fields = ((rest < 0).long() << 9) | magnitude  # [N, 3] sign bit above a 9-bit magnitude
    words = pack_2_10_10_10(largest, fields).numpy().astype("<u4")
    return words.view(np.uint8).reshape(-1, 4)


def _unpack_rotations(raw: Tensor, n: int, version: int) -> Tensor:
    """Inverse of `_pack_rotations`: unit quaternions [N, 4] (w, x, y, z) in RDF axes."""
    if version == 2:
        xyz = raw.reshape(n, 3).double() / 127.5 - 1
        q = torch.cat([xyz, (1 - xyz.square().sum(dim=1, keepdim=True)).clamp_min(0).sqrt()], dim=1)
    else:
        b = raw.reshape(n, 4)
        largest, fields = unpack_2_10_10_10(b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16) | (b[:, 3] << 24))
        rest = math.sqrt(0.5) * (fields & 511) / 511 * (1 - 2 * (fields >> 9))  # [N, 3]
        q = from_smallest_three(largest, rest)
    q = q.float()
    q[:, :3] *= _RDF_TO_RUB
    return q[:, [3, 0, 1, 2]].contiguous()


def _quantise_sh(rest: Tensor) -> np.ndarray:
    """Rest SH coefficients [N, K, 3] as bytes ``v * 128 + 128`` on the reference's 5-bit (degree 1) / 4-bit grid."""
    q = _round_half_away(rest.double() * 128) + 128  # [N, K, 3]
    bucket = torch.full((rest.shape[1], 1), 16.0)
    bucket[:3] = 8.0  # the 3 degree-1 coefficients keep 5 bits, the others 4
    q = torch.floor((q + bucket / 2) / bucket) * bucket  # the bucket's start, as the reference's integer division
    return q.clamp(0, 255).numpy()
