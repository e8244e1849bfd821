"""PlayCanvas streamed SOG: levels of detail in chunks under ``lod-meta.json`` (version 1), the layout the PlayCanvas
engine streams and ``splat-transform`` writes.

A site folder holds ``lod-meta.json``, one unbundled SOG (``meta.json`` and WebP images, :mod:`gsrecon.export.sog`)
per chunk in ``{level}_{i}/``, and ``env/`` for the environment. ``lod-meta.json`` holds ``counts`` (Gaussians per
level), ``lodLevels``, ``filenames`` (the chunks' ``meta.json``) and ``tree``: a binary tree over the centres of
every level's Gaussians. On a merged block run the top of the tree splits the set of the blocks' cells in halves
(in block order) until each node holds one cell, so that each cell is a subtree. A node of one cell is split at the
median of the widest axis while it holds more than ``chunk_count`` thousand Gaussians, or is wider than
``chunk_extent`` and holds more than ``chunk_min`` thousand (and always more than 256). Each node has ``bound``
(``min``, ``max``: the box around its Gaussians' one-sigma ellipsoids); a leaf has ``lods``: per level, the chunk
(``file``) and the run of its rows (``offset``, ``count``) holding the leaf's Gaussians of that level. A level's
leaves fill its chunks in turn; a chunk is closed once it holds more than ``chunk_count`` thousand, or before a leaf
of another cell (no chunk holds two cells' Gaussians). Within a chunk, each leaf's rows are in Morton order.

The environment (``env/meta.json``, always loaded) is the finest level's Gaussians farther from the centre of the
cameras than ``env_threshold`` times the cameras' radius (sky, far background); the coarser levels leave theirs
out. ``lod-meta.json`` is written last: a site interrupted while writing has none, so no viewer loads half of it.

The folder is the user's: before the first chunk, :data:`SITE_MARKER` lists what the site writes there (with what
a site it replaces wrote), and ``--overwrite`` removes only what that list or a previous ``lod-meta.json`` names,
after every check has passed; a path the new site needs that neither names is refused, never written into.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gsrecon.atomic import atomic_path, write_json
from gsrecon.errors import InputError
from gsrecon.export.compressed_ply import morton_order
from gsrecon.export.sog import save_sog
from gsrecon.geometry import quat_to_rotmat
from gsrecon.model.ply import cpu_params, save_ply
from gsrecon.records import ListOf, MayLack, read_record

META_NAME = "lod-meta.json"
LOD_META_VERSION = 1
ENV_DIR = "env"
LEVELS_PLY_DIR = "levels"  # lod.levels_ply: each level's Gaussians as level_<k>.ply in this folder
SITE_MARKER = ".gsrecon-site"  # JSON: the paths the site in the folder writes; `--overwrite` removes only those
BTREE_LEAF = 256  # a node of at most this many centres is never split (splat-transform's BTree leaf)
_SIGNIFICANT_DIGITS = 7  # lod-meta.json's numbers, as splat-transform writes them (about float32's precision)
_FOLDER = rf"\d+_\d+|{ENV_DIR}"  # a chunk's folder ({level}_{i}) or the environment's
_LEVEL_PLY = rf"{LEVELS_PLY_DIR}/level_\d+\.ply"
_MARKER_SCHEMA = {"gsrecon_site": int, "outputs": ListOf(re.compile(rf"{_FOLDER}|{_LEVEL_PLY}"))}
_META_SCHEMA = {
    "filenames": ListOf(re.compile(rf"({_FOLDER})/meta\.json")),
    MayLack("environment"): re.compile(rf"{ENV_DIR}/meta\.json"),
}
_BLOCK_ROWS = 1 << 16

LevelLoader = Callable[[], dict[str, Tensor]]
CellOf = Callable[[Tensor], Tensor]  # centres [N, 3] -> int64 [N]: the block cell holding each


@dataclass
class LodSiteConfig:
    """``--format lod`` options (``lod.<key>=value``); the chunk sizes are splat-transform's defaults."""

    chunk_count: int = 512  # thousands of Gaussians per chunk (splat-transform --lod-chunk-count)
    chunk_extent: float = 16.0  # a chunk's widest side in scene units (--lod-chunk-extent)
    chunk_min: int = 8  # thousands of Gaussians below which a wide chunk is not split (--lod-chunk-min)
    env_threshold: float = 8.0  # environment: farther than this × the cameras' radius from their centre; inf: none
    levels_ply: bool = False  # also write each level as levels/level_<k>.ply (e.g. for splat-transform -l)

    def __post_init__(self) -> None:
        if self.chunk_count < 1:
            raise ValueError(f"lod.chunk_count={self.chunk_count} must be >= 1 (thousands of Gaussians per chunk)")
        if not (math.isfinite(self.chunk_extent) and self.chunk_extent > 0):
            raise ValueError(f"lod.chunk_extent={self.chunk_extent!r} must be a size > 0 in scene units")
        if self.chunk_min < 0:
            raise ValueError(f"lod.chunk_min={self.chunk_min} must be >= 0 (thousands of Gaussians)")
        if math.isnan(self.env_threshold) or self.env_threshold < 0:
            raise ValueError(
                f"lod.env_threshold={self.env_threshold!r} must be >= 0 (multiples of the cameras' radius; inf: "
                f"no environment)"
            )


@dataclass(frozen=True)
class CameraRegion:
    """Where the cameras are: the centre of their positions and the largest distance of one from it."""

    center: tuple[float, float, float]
    radius: float

    @classmethod
    def of(cls, centers: Tensor) -> CameraRegion:
        """The region of camera positions ``centers`` [F, 3]."""
        center = centers.double().mean(dim=0)
        radius = float((centers.double() - center).norm(dim=1).max())
        return cls(tuple(center.tolist()), radius)  # type: ignore[arg-type]


def _joined(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The Gaussians of ``a`` and then ``b``; the one of lower SH degree gets zero coefficients up to the other's."""
    rest = max(a["shN"].shape[1], b["shN"].shape[1])

    def padded(shN: Tensor) -> Tensor:  # [N, K, 3] -> [N, rest, 3]
        return torch.cat([shN, shN.new_zeros(len(shN), rest - shN.shape[1], 3)], dim=1)

    return {
        key: torch.cat([a[key], b[key]]) if key != "shN" else torch.cat([padded(a[key]), padded(b[key])]) for key in a
    }


def write_lod_site(
    out: str | Path,
    levels: Sequence[LevelLoader],
    cfg: LodSiteConfig,
    region: CameraRegion | None,
    *,
    sky: Mapping[str, Tensor] | None = None,
    cells: CellOf | None = None,
    antialiased: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write the levels (finest first; each loaded when needed, one at a time) as a streamed SOG site whose
    ``lod-meta.json`` is ``out`` (see the module docstring); ``region`` None: no environment from the levels; ``cells``
    maps centres to the block cells that become subtrees (None: no cells); ``sky``: Gaussians (pre-activation
    parameters) that join the environment, as a trained sky on a far sphere. Returns the written ``lod-meta.json``
    content.

    Raises InputError for ``out`` not named lod-meta.json, a folder that holds files already unless ``overwrite``
    (which removes what a previous site wrote: its ``lod-meta.json`` first, then its chunks), a damaged record of a
    previous site, a path the site needs that holds what no previous site wrote, or levels it cannot hold (all
    before anything is removed or written)."""
    out = check_site_path(out, overwrite)
    folder = out.parent
    previous = _previous_outputs(folder)
    centres, extents, owners, kept, env = [], [], [], [], None
    for level, load in enumerate(levels):
        p = cpu_params(load())
        far = _far(p["means"], region, cfg.env_threshold)  # [N]
        if level == 0 and bool(far.any()):
            env = {key: value[far] for key, value in p.items()}
        near = torch.nonzero(~far).squeeze(1)  # [M]
        if len(near) == 0:
            raise InputError(
                f"lod.env_threshold={cfg.env_threshold}: level {level} has no Gaussians inside the environment "
                "threshold; raise it"
            )
        centres.append(p["means"][near].numpy())
        if cells is not None:
            owners.append(cells(p["means"][near]).int().numpy())  # [M]
        extents.append(_half_extents(p["quats"][near], p["scales"][near]).numpy())
        kept.append(near)
        del p
    offsets = np.cumsum([0, *(len(c) for c in centres)])  # level k's flat indices: offsets[k] .. offsets[k+1]
    points, halves = np.concatenate(centres), np.concatenate(extents)
    owned = np.concatenate(owners) if owners else None  # the cell of each centre (None: one cell)
    del centres, extents, owners
    bin_size, bin_min = cfg.chunk_count * 1024, cfg.chunk_min * 1024
    files: dict[int, list[list[np.ndarray]]] = {}  # level -> chunks -> the leaves' flat indices
    chunk_cell: dict[int, int] = {}  # level -> the cell its last chunk holds
    filenames: list[str] = []

    def leaf(indices: np.ndarray, cell: int) -> dict[str, Any]:
        level_of = np.searchsorted(offsets, indices, side="right") - 1
        lo, hi = (points[indices] - halves[indices]).min(axis=0), (points[indices] + halves[indices]).max(axis=0)
        lods: dict[str, dict[str, int]] = {}
        for level in np.unique(level_of).tolist():
            members = indices[level_of == level]
            chunks = files.setdefault(level, [[]])
            if chunks[-1] and chunk_cell[level] != cell:
                chunks.append([])
            chunk_cell[level] = cell
            filename = f"{level}_{len(chunks) - 1}/meta.json"
            if filename not in filenames:
                filenames.append(filename)
            filled = sum(len(part) for part in chunks[-1])
            lods[str(level)] = {"file": filenames.index(filename), "offset": filled, "count": len(members)}
            chunks[-1].append(members)
            if filled + len(members) > bin_size:
                chunks.append([])
        return {"bound": {"min": lo.tolist(), "max": hi.tolist()}, "lods": lods}

    def build(indices: np.ndarray, cell: int) -> dict[str, Any]:
        lo, hi = _box(points, indices)
        axis = int(np.argmax(hi - lo))
        count = len(indices)
        wide = float(hi[axis] - lo[axis]) > cfg.chunk_extent and count > bin_min
        if count <= BTREE_LEAF or not (count > bin_size or wide):
            return leaf(indices, cell)
        mid = count >> 1
        split = np.argpartition(points[indices, axis], mid)
        return _parent(build(indices[split[:mid]], cell), build(indices[split[mid:]], cell))

    def build_cells(indices: np.ndarray, among: list[int]) -> dict[str, Any]:
        if len(among) == 1:
            return build(indices, among[0])
        first = np.isin(owned[indices], among[: len(among) // 2])  # [len(indices)]; two cells or more: owned is set
        return _parent(build_cells(indices[first], among[: len(among) // 2]),
                       build_cells(indices[~first], among[len(among) // 2 :]))  # fmt: skip

    tree = build_cells(np.arange(len(points)), [0] if owned is None else np.unique(owned).tolist())
    if sky is not None:
        env = cpu_params(sky) if env is None else _joined(env, cpu_params(sky))
    outputs = [name.split("/")[0] for name in filenames] + ([ENV_DIR] if env is not None else [])
    outputs += [f"{LEVELS_PLY_DIR}/level_{level}.ply" for level in range(len(levels))] if cfg.levels_ply else []
    _check_in_the_way(folder, outputs, previous)
    write_json(folder / SITE_MARKER, {"gsrecon_site": 1, "outputs": sorted({*previous, *outputs})})
    _remove_site(folder, previous)
    for level, load in enumerate(levels):
        p = cpu_params(load())
        if cfg.levels_ply:
            save_ply(folder / LEVELS_PLY_DIR / f"level_{level}.ply", p, antialiased=antialiased)
        for index, chunk in enumerate(files.get(level, [])):
            if not chunk:
                continue
            rows = np.concatenate([part[morton_order(torch.from_numpy(points[part])).numpy()] for part in chunk])
            local = kept[level][torch.from_numpy(rows - offsets[level])]  # [C]: rows of the level's Gaussians
            save_sog(
                folder / f"{level}_{index}" / "meta.json",
                {key: value[local] for key, value in p.items()},
                antialiased=antialiased,
                order=torch.arange(len(local)),
            )
        del p
    if env is not None:
        save_sog(folder / ENV_DIR / "meta.json", env, antialiased=antialiased)
    counts = [int(offsets[k + 1] - offsets[k]) for k in range(len(levels))]
    meta = {
        "version": LOD_META_VERSION,
        "asset": {
            "generator": "gsrecon",
            "chunkGaussians": bin_size,
            "chunkExtent": cfg.chunk_extent,
            "chunkMinGaussians": bin_min,
        },
        "count": sum(counts),
        "counts": counts,
        "lodLevels": len(levels),
        "lodErrors": False,
        **({"environment": f"{ENV_DIR}/meta.json"} if env is not None else {}),
        "filenames": filenames,
        "tree": _rounded(tree),
    }
    with atomic_path(out) as tmp:  # last: only now is the site whole
        tmp.write_text(json.dumps(meta, separators=(",", ":")))
    write_json(folder / SITE_MARKER, {"gsrecon_site": 1, "outputs": sorted(set(outputs))})
    return meta


def check_site_path(out: str | Path, overwrite: bool) -> Path:
    """``out`` as a Path; raises InputError for one not named lod-meta.json or that is a folder, in a folder that
    holds files already unless ``overwrite``, or in one whose previous site's records are damaged."""
    out = Path(out)
    if out.name != META_NAME:
        raise InputError(f"--format lod writes a site folder's {META_NAME}: --out must end in {META_NAME}, got {out}")
    if out.is_dir():
        raise InputError(f"--out {out} is a folder; move it away or choose another --out")
    if out.parent.is_dir() and any(out.parent.iterdir()) and not overwrite:
        raise InputError(f"{out.parent} already holds files; pass --overwrite to replace the site there")
    _previous_outputs(out.parent)
    return out


def _previous_outputs(folder: Path) -> list[str]:
    """What sites gsrecon wrote in ``folder`` put there (paths relative to it): what its :data:`SITE_MARKER` lists,
    and the chunks and environment a ``lod-meta.json`` there names. Raises RecordError for a damaged one."""
    fix = f"move the site in {folder} away, or choose another --out"
    listed: list[str] = []
    if (folder / SITE_MARKER).is_file():
        listed += read_record(folder / SITE_MARKER, _MARKER_SCHEMA, fix)["outputs"]
    if (folder / META_NAME).is_file():
        meta = read_record(folder / META_NAME, _META_SCHEMA, fix)
        named = [*meta["filenames"], *([meta["environment"]] if "environment" in meta else [])]
        listed += [name.split("/")[0] for name in named]
    return list(dict.fromkeys(listed))


def _check_in_the_way(folder: Path, outputs: Sequence[str], previous: Sequence[str]) -> None:
    """Refuse a path the site writes (``outputs``, relative to ``folder``) that holds something no previous site
    wrote (``previous``), or that a previous site wrote as another kind (a file where it wrote a folder)."""
    for name in [*outputs, *previous]:
        path = folder / name
        is_file = name.startswith(f"{LEVELS_PLY_DIR}/")  # a level's PLY; the others are folders
        if not (path.exists() or path.is_symlink()):
            continue
        if name not in previous:
            raise InputError(
                f"{path} is in the way: no site gsrecon wrote in {folder} holds it; move it away, or choose another "
                "--out"
            )
        if not path.is_symlink() and path.is_file() != is_file:
            kind = "a file" if is_file else "a folder"
            raise InputError(f"{path} is not {kind} as the site gsrecon wrote there had; move it away")
    if (folder / LEVELS_PLY_DIR).is_file() and any(name.startswith(f"{LEVELS_PLY_DIR}/") for name in outputs):
        raise InputError(f"{folder / LEVELS_PLY_DIR} is a file where the site writes its level PLYs; move it away")


def _remove_site(folder: Path, previous: Sequence[str]) -> None:
    """Remove what a previous site wrote in ``folder`` (``previous``, checked by :func:`_check_in_the_way`):
    ``lod-meta.json`` first (no viewer loads it from then on), then its chunks, environment and level PLYs (a
    symbolic link: the link, not what it points to); the folder of the level PLYs goes where nothing else is in it."""
    (folder / META_NAME).unlink(missing_ok=True)
    for name in previous:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    levels = folder / LEVELS_PLY_DIR
    wrote_levels = any(name.startswith(f"{LEVELS_PLY_DIR}/") for name in previous)
    if wrote_levels and levels.is_dir() and not levels.is_symlink() and not any(levels.iterdir()):
        levels.rmdir()


def _far(means: Tensor, region: CameraRegion | None, threshold: float) -> Tensor:
    """bool [N]: the points ``means`` [N, 3] farther than ``threshold`` × the region's radius from its centre."""
    if region is None or math.isinf(threshold):
        return torch.zeros(len(means), dtype=torch.bool)
    center = torch.tensor(region.center, dtype=torch.float64)
    # A block of rows at a time, as everything per Gaussian here: whole-scene temporaries would outgrow the scene.
    return torch.cat([(rows.double() - center).norm(dim=1) > threshold * region.radius for rows in _blocks(means)])


def _half_extents(quats: Tensor, scales: Tensor) -> Tensor:
    """Half sides [N, 3] of the axis-aligned boxes around Gaussians' one-sigma ellipsoids (log ``scales`` [N, 3])."""
    pairs = zip(_blocks(quats), _blocks(scales))
    return torch.cat([(quat_to_rotmat(q).abs() @ torch.exp(s)[:, :, None]).squeeze(2) for q, s in pairs])


def _parent(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """The tree node over the nodes ``first`` and ``second``."""
    bound = {
        "min": np.minimum(first["bound"]["min"], second["bound"]["min"]).tolist(),
        "max": np.maximum(first["bound"]["max"], second["bound"]["max"]).tolist(),
    }
    return {"bound": bound, "children": [first, second]}


def _box(points: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least and greatest coordinates [3] of the rows ``indices`` of ``points`` [T, 3], a block at a time."""
    lo, hi = np.full(3, np.inf, np.float32), np.full(3, -np.inf, np.float32)
    for start in range(0, len(indices), _BLOCK_ROWS):
        block = points[indices[start : start + _BLOCK_ROWS]]
        lo, hi = np.minimum(lo, block.min(axis=0)), np.maximum(hi, block.max(axis=0))
    return lo, hi


def _blocks(rows: Tensor) -> tuple[Tensor, ...]:
    """``rows`` split into blocks of :data:`_BLOCK_ROWS`."""
    return rows.split(_BLOCK_ROWS)


def _rounded(value: Any) -> Any:
    """``value`` with every float rounded to :data:`_SIGNIFICANT_DIGITS` significant digits."""
    if isinstance(value, float):
        return float(f"{value:.{_SIGNIFICANT_DIGITS}g}")
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_rounded(item) for item in value]
    return value
