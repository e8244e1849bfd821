"""PlayCanvas SOG (Spatially Ordered Gaussians), ``meta.json`` version 2: quantised attributes in lossless WebP images.

The layout of developer.playcanvas.com/user-manual/gaussian-splatting/formats/sog, which the
PlayCanvas engine, SuperSplat and splat-transform read. Gaussian ``i`` (in Morton order, so that
neighbouring pixels hold neighbouring Gaussians) is pixel ``(i % W, i // W)`` of every per-Gaussian
image, ``W x H`` with ``W * H >= count``; values are stored in the PLY's axes and conventions:

- ``means_l.webp`` / ``means_u.webp`` (RGB): low / high byte of each coordinate's 16-bit position
  in ``[mins, maxs]`` after ``sign(x) * log(|x| + 1)``;
- ``scales.webp`` (RGB): each log scale's index into ``scales.codebook`` (256 floats);
- ``quats.webp`` (RGBA): the normalised quaternion (w, x, y, z) as smallest three, the other
  components ``q / sqrt(2) + 0.5`` in 8 bits each in index order and the alpha ``252 +`` the index
  of the largest;
- ``sh0.webp`` (RGBA): each DC coefficient's index into ``sh0.codebook`` and ``sigmoid(opacity)``
  in 8 bits;
- with SH degree 1-3, ``shN_labels.webp`` (RG: a 16-bit index into a palette of ``shN.count``
  rest-coefficient sets) and ``shN_centroids.webp`` (64 palette entries per row, ``K`` pixels each,
  whose RGB are the red, green and blue coefficients' indices into ``shN.codebook``).

A path ending in ``.sog`` (or any name other than ``meta.json``) gets the bundle: one ZIP archive
with the files at its root, stored uncompressed, written atomically. A path named ``meta.json``
gets the unbundled folder: the images beside it, each written atomically, ``meta.json`` last.

Lossy: positions to 16 bits of the log range; scales, DC colours and rest SH to 256-entry codebooks
(1-D k-means over all values of the attribute); the rest SH first to a palette of up to 65536 sets
(k-means, as many entries as the largest power of two <= N); quaternions and opacity to 8 bits.
Traded for speed: the palette comes from two-level k-means (coarse clusters, then fine ones inside
each), each level fitted on a seeded sample for a fixed number of iterations, not flat k-means.
"""

from __future__ import annotations

import io
import json
import math
import os
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from gsrecon.atomic import atomic_path
from gsrecon.errors import InputError
from gsrecon.export.base import ExportContext, ExportFormat
from gsrecon.export.compressed_ply import morton_order
from gsrecon.export.quantise import round_clamp, smallest_three
from gsrecon.model.ply import cpu_params
from gsrecon.params import check_params
from gsrecon.registry import EXPORT_REGISTRY
from gsrecon.sh import sh_degree_of

SOG_VERSION = 2
CODEBOOK_SIZE = 256
PALETTE_ENTRIES_PER_ROW = 64
_MAX_PALETTE_BITS = 16  # labels are 16-bit
_MAX_IMAGE_SIDE = 16383  # WebP's largest width or height
_CODEBOOK_BINS = 1024  # histogram that places the codebook's first entries
_CODEBOOK_FLOOR = 0.05  # added to each bin's count, as a fraction of the mean count
_CODEBOOK_ITERATIONS = 16
_KMEANS_ITERATIONS = 6
_FIT_ROWS_PER_CENTROID = 8  # each k-means level is fitted on a sample of at most this many rows per centroid
_ASSIGN_CHUNK_ROWS = 1 << 14  # rows compared with the centroids at once (bounded memory)
_SEED = 0
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed member times: the same scene gives the same bytes
_WEBP_OPTIONS = {"lossless": True, "quality": 70, "method": 4, "exact": True}  # exact: keep RGB under alpha 0


def save_sog(
    path: str | os.PathLike, params: Mapping[str, Tensor], *, antialiased: bool = False, order: Tensor | None = None
) -> None:
    """Write Gaussians as a SOG bundle, or unbundled for a path named ``meta.json`` (see the module docstring),
    in the storage order ``order`` [N] (row ``order[i]`` is pixel ``i``; None: Morton order).

    Raises InputError, before writing anything, for an empty scene or an SH degree above 3.
    """
    p = cpu_params(params)
    check_params(p)  # refuses an SH degree above 3, which SOG cannot hold
    n = p["means"].shape[0]
    if n == 0:
        raise InputError("the scene has no Gaussians (were all of them pruned?), so there is nothing to write to SOG")
    size = _image_size(n)
    order = morton_order(p["means"]) if order is None else order  # [N]
    files, meta = _encode(p, order, size)
    meta = {"version": SOG_VERSION, "count": n, "antialias": antialiased, **meta}
    files["meta.json"] = json.dumps(meta, separators=(",", ":")).encode()
    if Path(path).name == "meta.json":
        for name, data in files.items():  # meta.json last: it names only images already in place
            with atomic_path(Path(path).with_name(name)) as tmp:
                tmp.write_bytes(data)
        return
    with atomic_path(path) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as bundle:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, _ZIP_TIME)
            info.external_attr = 0o644 << 16  # rw-r--r-- when unzipped
            bundle.writestr(info, data)


@EXPORT_REGISTRY.register("sog")
class SogFormat(ExportFormat):
    """PlayCanvas SOG (SuperSplat, Spark): lossless WebP images + meta.json, zipped (named meta.json: a folder)."""

    suffixes = (".sog", "meta.json")

    def write(self, path: Path, params: Mapping[str, Tensor], *, antialiased: bool, context: ExportContext) -> None:
        save_sog(path, params, antialiased=antialiased)


def _image_size(n: int) -> tuple[int, int]:
    """Width and height (multiples of 4, as the reference's) of an image with a pixel for each of ``n`` Gaussians."""
    width = math.ceil(math.sqrt(n) / 4) * 4
    height = math.ceil(n / width / 4) * 4
    if max(width, height) > _MAX_IMAGE_SIDE:
        raise InputError(f"SOG images are at most {_MAX_IMAGE_SIDE} pixels wide, too few for {n} Gaussians")
    return width, height


def _encode(p: Mapping[str, Tensor], order: Tensor, size: tuple[int, int]) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The WebP images of Gaussians ``p`` taken in the storage order ``order`` [N], by file name, and their
    ``meta.json`` entries. Pixels are made a block of rows at a time: float64 temporaries of whole columns
    would take 24-32 bytes per Gaussian each."""
    lo, hi = _log_position_bounds(p["means"])  # [3], [3]
    span = torch.where(hi > lo, hi - lo, 1.0)

    def means_bytes(ids: Tensor) -> Tensor:  # [M, 6]: low bytes, then high bytes of the 16-bit positions
        fixed = round_clamp((_log_position(p["means"][ids]) - lo) / span * 65535, 65535)
        return torch.cat([fixed & 255, fixed >> 8], dim=1)

    def quat_bytes(ids: Tensor) -> Tensor:  # [M, 4]
        largest, rest = smallest_three(torch.nn.functional.normalize(p["quats"][ids].double(), dim=1))
        return torch.cat([round_clamp((rest / math.sqrt(2) + 0.5) * 255, 255), 252 + largest[:, None]], dim=1)

    scales_codebook, scales_edges = _codebook(p["scales"])
    sh0_codebook, sh0_edges = _codebook(p["sh0"])

    def sh0_alpha_bytes(ids: Tensor) -> Tensor:  # [M, 4]
        alpha = round_clamp(torch.sigmoid(p["opacities"][ids].double()) * 255, 255)
        return torch.cat([_entries(p["sh0"][ids, 0], sh0_edges), alpha[:, None]], dim=1)

    means = _rows_in_order(order, 6, means_bytes)  # [N, 6]
    files = {
        "means_l.webp": _webp(means[:, :3], size),
        "means_u.webp": _webp(means[:, 3:], size),
        "scales.webp": _webp(_rows_in_order(order, 3, lambda ids: _entries(p["scales"][ids], scales_edges)), size),
        "quats.webp": _webp(_rows_in_order(order, 4, quat_bytes), size),
        "sh0.webp": _webp(_rows_in_order(order, 4, sh0_alpha_bytes), size),
    }
    meta: dict[str, Any] = {
        "means": {"mins": lo.tolist(), "maxs": hi.tolist(), "files": ["means_l.webp", "means_u.webp"]},
        "scales": {"codebook": scales_codebook, "files": ["scales.webp"]},
        "quats": {"files": ["quats.webp"]},
        "sh0": {"codebook": sh0_codebook, "files": ["sh0.webp"]},
    }
    if p["shN"].shape[1]:
        sh_files, meta["shN"] = _encode_rest_sh(p["shN"], order, size)
        files.update(sh_files)
    return files, meta


def _rows_in_order(order: Tensor, columns: int, encode: Callable[[Tensor], Tensor]) -> Tensor:
    """uint8 [N, columns]: row ``i`` is ``encode(order[i:i+1])``, computed for a block of ids at a time."""
    out = torch.empty(order.shape[0], columns, dtype=torch.uint8)
    for start in range(0, order.shape[0], _ASSIGN_CHUNK_ROWS):
        ids = order[start : start + _ASSIGN_CHUNK_ROWS]
        out[start : start + len(ids)] = encode(ids)
    return out


def _log_position(means: Tensor) -> Tensor:
    """``sign(x) * log(|x| + 1)`` of positions [M, 3], in float64."""
    means = means.double()
    return torch.sign(means) * torch.log1p(means.abs())


def _log_position_bounds(means: Tensor) -> tuple[Tensor, Tensor]:
    """Per-axis least and greatest `_log_position` [3] of positions [N, 3], a block of rows at a time."""
    lo = torch.full((3,), math.inf, dtype=torch.float64)
    hi = torch.full((3,), -math.inf, dtype=torch.float64)
    for block in means.split(_ASSIGN_CHUNK_ROWS):
        logs = _log_position(block)
        lo, hi = torch.minimum(lo, logs.amin(dim=0)), torch.maximum(hi, logs.amax(dim=0))
    return lo, hi


def _encode_rest_sh(rest: Tensor, order: Tensor, size: tuple[int, int]) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The palette and label images of rest SH coefficients [N, K, 3] (K > 0) taken in the storage order
    ``order`` [N], and their ``meta.json`` entry."""
    num_rest = rest.shape[1]
    palette, labels = _sh_palette(rest, order)  # [P, K, 3], [N]
    codebook, edges = _codebook(palette)
    entries = _entries(palette, edges)  # [P, K, 3]
    rows = math.ceil(palette.shape[0] / PALETTE_ENTRIES_PER_ROW)
    entries = torch.cat([entries, entries.new_zeros(rows * PALETTE_ENTRIES_PER_ROW - palette.shape[0], num_rest, 3)])
    files = {
        "shN_centroids.webp": _webp(entries.reshape(-1, 3), (PALETTE_ENTRIES_PER_ROW * num_rest, rows)),
        "shN_labels.webp": _webp(torch.stack([labels & 255, labels >> 8, torch.zeros_like(labels)], dim=1), size),
    }
    meta = {
        "count": palette.shape[0],
        "bands": sh_degree_of(num_rest),
        "codebook": codebook,
        "files": list(files),
    }
    return files, meta


def _webp(pixels: Tensor, size: tuple[int, int]) -> bytes:
    """A lossless WebP of ``size`` (width, height) whose first pixels, row by row, are ``pixels`` [M, 3 or 4]."""
    width, height = size
    image = np.zeros((width * height, pixels.shape[1]), np.uint8)
    image[: pixels.shape[0]] = pixels.numpy()
    out = io.BytesIO()
    Image.fromarray(image.reshape(height, width, -1)).save(out, "WEBP", **_WEBP_OPTIONS)
    return out.getvalue()


def _codebook(values: Tensor) -> tuple[list[float], Tensor]:
    """A sorted 256-entry codebook for all of ``values`` and the midpoints between its distinct entries
    [<= 255] (for `_entries`).

    The entries are the distinct values when there are at most 256 (exact), else 1-D k-means
    centroids started at the point density ``count^(1/3)`` of a histogram (Lloyd-Max's optimum for
    many entries), each bin's count raised by a small floor so that sparse tails keep entries;
    unused entries repeat the last.
    """
    ordered = values.reshape(-1).double().sort().values  # [M]
    centroids = torch.unique_consecutive(ordered)
    if centroids.shape[0] > CODEBOOK_SIZE:
        lo, hi = ordered[0].item(), ordered[-1].item()
        counts = torch.histc(ordered, _CODEBOOK_BINS, lo, hi) + _CODEBOOK_FLOOR * ordered.shape[0] / _CODEBOOK_BINS
        density = counts.pow(1 / 3).cumsum(0)  # [B]
        bins = torch.searchsorted(density, (torch.arange(CODEBOOK_SIZE) + 0.5) / CODEBOOK_SIZE * density[-1])
        centroids = torch.unique(lo + (bins.clamp(max=_CODEBOOK_BINS - 1) + 0.5) * (hi - lo) / _CODEBOOK_BINS)
        prefix = torch.cat([ordered.new_zeros(1), ordered.cumsum(0)])  # [M + 1]
        for _ in range(_CODEBOOK_ITERATIONS):  # each centroid's cluster is a run of the sorted values
            ends = torch.searchsorted(ordered, (centroids[1:] + centroids[:-1]) / 2)  # [C - 1]
            bounds = torch.cat([ends.new_zeros(1), ends, ends.new_full((1,), ordered.shape[0])])  # [C + 1]
            counts = bounds[1:] - bounds[:-1]
            means = (prefix[bounds[1:]] - prefix[bounds[:-1]]) / counts.clamp_min(1)
            centroids = torch.where(counts > 0, means, centroids).sort().values
    padding = CODEBOOK_SIZE - centroids.shape[0]
    return [*centroids.tolist(), *[centroids[-1].item()] * padding], (centroids[1:] + centroids[:-1]) / 2


def _entries(values: Tensor, edges: Tensor) -> Tensor:
    """Index of each value's nearest codebook entry (uint8, same shape), given `_codebook`'s ``edges``."""
    # A block of rows at a time, as uint8: float64 and int64 copies of millions of values would be 16 bytes each.
    return torch.cat([torch.bucketize(b.double(), edges).to(torch.uint8) for b in values.split(_ASSIGN_CHUNK_ROWS)])


def _sh_palette(rest: Tensor, order: Tensor) -> tuple[Tensor, Tensor]:
    """A palette [P, K, 3] for the rest SH coefficients [N, K, 3] and each Gaussian's entry [N], Gaussians
    taken in the storage order ``order`` [N].

    P is the largest power of two <= N (at most 65536), as the reference writes: ``sqrt(P)`` coarse
    clusters of ``sqrt(P)`` fine ones (powers of two); entries a small cluster leaves unused repeat its centroid.
    """
    n = rest.shape[0]

    def rows(ids: Tensor) -> Tensor:  # [M, 3K]: the coefficients of storage rows ``ids``, gathered when needed
        return rest[order[ids]].reshape(len(ids), -1)

    bits = min(_MAX_PALETTE_BITS, n.bit_length() - 1)
    num_fine, num_coarse = 1 << (bits // 2), 1 << (bits - bits // 2)
    generator = torch.Generator().manual_seed(_SEED)
    coarse = _kmeans(rows(_sample(n, num_coarse, generator)), num_coarse, generator)  # [C, 3K]
    coarse_labels = torch.cat([_nearest(rows(ids), coarse) for ids in torch.arange(n).split(_ASSIGN_CHUNK_ROWS)])
    palette = coarse.repeat_interleave(num_fine, dim=0)  # [C * F, 3K]
    labels = torch.empty(n, dtype=torch.long)
    members_of = torch.argsort(coarse_labels, stable=True).split(torch.bincount(coarse_labels).tolist())
    for cluster, members in enumerate(members_of):
        if members.numel():
            x = rows(members)  # [M, 3K]
            fine = _kmeans(x[_sample(len(members), num_fine, generator)], num_fine, generator)  # [<= F, 3K]
            palette[cluster * num_fine : cluster * num_fine + fine.shape[0]] = fine
            labels[members] = cluster * num_fine + _nearest(x, fine)
    return palette.reshape(palette.shape[0], -1, 3), labels


def _sample(count: int, k: int, generator: torch.Generator) -> Tensor:
    """Ids [<= _FIT_ROWS_PER_CENTROID * k] of a seeded sample of ``count`` rows, to fit ``k`` centroids on."""
    return torch.randperm(count, generator=generator)[: _FIT_ROWS_PER_CENTROID * k]


def _kmeans(sample: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """Up to ``k`` centroids [k', D] of the rows ``sample`` [M, D] (fewer when fewer rows are distinct).

    Lloyd's algorithm for a fixed number of iterations, started from distinct rows; a centroid left
    without rows stays where it is.
    """
    distinct = torch.unique(sample, dim=0)
    centroids = distinct[torch.randperm(distinct.shape[0], generator=generator)[:k]]
    for _ in range(_KMEANS_ITERATIONS):
        labels = _nearest(sample, centroids)
        counts = torch.bincount(labels, minlength=centroids.shape[0])[:, None]  # [k', 1]
        sums = torch.zeros_like(centroids).index_add_(0, labels, sample)
        centroids = torch.where(counts > 0, sums / counts.clamp_min(1), centroids)
    return centroids


def _nearest(x: Tensor, centroids: Tensor) -> Tensor:
    """Index [M] of the centroid [K, D] nearest to each row of ``x`` [M, D], computed a chunk of rows at a time."""
    half_norms = centroids.square().sum(dim=1) / 2  # [K]
    return torch.cat([(half_norms - rows @ centroids.T).argmin(dim=1) for rows in x.split(_ASSIGN_CHUNK_ROWS)])
