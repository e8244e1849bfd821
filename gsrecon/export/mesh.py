"""A triangle mesh of the trained scene: TSDF fusion of the depth and colour rendered from the training views,
then marching cubes (scikit-image), with vertex colours; written as ``.ply``, ``.obj`` or ``.glb`` (trimesh).

Each training view is rendered with the renderer the scene was trained with; its median depth (where the
accumulated opacity crosses 1/2: a surface, where the expected depth blends the surfaces a pixel sees) is kept
where the render is opaque enough and nearer than twice the cameras' extent (as 2DGS bounds its TSDF), and fused
into a truncated signed distance volume over the voxels near the surface points (blocks of 8³ voxels). Marching
cubes extracts its zero level where views observed all eight corners of a cube.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from gsrecon.atomic import atomic_path
from gsrecon.cameras.lens import pinhole_project
from gsrecon.data.prefetch import available_host_bytes
from gsrecon.errors import InputError
from gsrecon.export.base import ExportContext, ExportFormat
from gsrecon.registry import EXPORT_REGISTRY
from gsrecon.render.colormap import DEPTH_KINDS

if TYPE_CHECKING:
    from gsrecon.data.pipeline import Batch
    from gsrecon.render.base import RenderOutput

MarchingCubes = Callable[..., tuple[Any, ...]]  # skimage.measure.marching_cubes

INSTALL_HINT = "pip install 'gsrecon[mesh]' (scikit-image and trimesh)"
BLOCK = 8  # voxels per side of the blocks the fusion touches
DENSE_BYTES = 10  # per voxel of the grid: marching cubes' signed distance (float32), masks and working copies
ACTIVE_BYTES = 64  # per voxel near the surface: its id, fused sums and weight, and building its list
MIN_VOXELS_ACROSS = 4  # a given voxel must fit this many times along the surface's longest side
MAX_VOXELS_ACROSS = 1 << 20  # and at most this many times (a finer grid is beyond any memory, or a typo)
CHUNK_VOXELS = 1 << 21  # voxels projected into a view at once (bounds the temporaries)


class SurfaceView(NamedTuple):
    """One training view's surface: what the fusion reads."""

    depth: Tensor  # [H, W] float32 camera z, 0 where the render is not opaque enough
    color: Tensor  # [H, W, 3] float32 in [0, 1], not premultiplied
    viewmat: Tensor  # [4, 4] world-to-camera
    K: Tensor  # [3, 3] pinhole intrinsics


class Mesh(NamedTuple):
    """A triangle mesh with vertex colours."""

    vertices: np.ndarray  # [V, 3] float32, world coordinates
    faces: np.ndarray  # [F, 3] int64, counter-clockwise seen from outside
    colors: np.ndarray  # [V, 3] uint8


@EXPORT_REGISTRY.register("mesh")
class MeshFormat(ExportFormat):
    """Triangle mesh with vertex colours (TSDF fusion of the training views' median depth, marching cubes)."""

    suffixes = (".ply", ".obj", ".glb")
    needs = ("train_batches", "render")

    @dataclass
    class Config:
        voxel: float = 0.0  # voxel size in scene units; 0: the longest side of the surface's bounding box / 256
        max_depth: float = 0.0  # depth beyond this is not fused; 0: twice the cameras' extent (3DGS's, as 2DGS)
        truncation: float = 3.0  # the signed distance is truncated at this many voxels
        min_alpha: float = 0.5  # depth is fused only where the render's accumulated opacity reaches this
        depth: str = "median"  # median (the surface) | expected (the renderer's blended depth)
        keep_parts: int = 0  # > 0: keep only this many largest connected parts (by triangle count)

        def __post_init__(self) -> None:
            if not (math.isfinite(self.voxel) and self.voxel >= 0.0):
                raise ValueError(f"voxel={self.voxel!r} must be a size >= 0 (0: from the scene's extent)")
            if not (math.isfinite(self.max_depth) and self.max_depth >= 0.0):
                raise ValueError(f"max_depth={self.max_depth!r} must be a depth >= 0 (0: from the cameras' extent)")
            if not self.truncation >= 1.0:
                raise ValueError(f"truncation={self.truncation!r} must be >= 1 voxel")
            if not 0.0 < self.min_alpha <= 1.0:
                raise ValueError(f"min_alpha={self.min_alpha!r} must be in (0, 1]")
            if self.depth not in DEPTH_KINDS:
                raise ValueError(f"depth={self.depth!r} must be one of {', '.join(DEPTH_KINDS)}")
            if self.keep_parts < 0:
                raise ValueError(f"keep_parts={self.keep_parts!r} must be >= 0 (0 keeps every part)")

    def __init__(self, cfg: MeshFormat.Config | None = None) -> None:
        self.cfg = cfg if cfg is not None else MeshFormat.Config()

    def write(self, path: Path, params: Mapping[str, Tensor], *, antialiased: bool, context: ExportContext) -> None:
        suffix = path.suffix.lower()
        if suffix not in self.suffixes:
            raise InputError(f"{path}: a mesh is written as {', '.join(self.suffixes)}, not '{path.suffix}'")
        marching_cubes, trimesh = _libraries()
        views = [surface_view(context.render, batch, self.cfg) for batch in context.train_batches()]
        if not views:
            raise InputError("nothing to mesh from: the scene has no training views (its capture's cameras)")
        max_depth = self.cfg.max_depth or 2.0 * camera_extent(views)
        views = [view._replace(depth=torch.where(view.depth <= max_depth, view.depth, 0.0)) for view in views]
        mesh = fuse(views, self.cfg, marching_cubes)
        if self.cfg.keep_parts:
            mesh = keep_largest_parts(mesh, self.cfg.keep_parts)
        with atomic_path(path) as tmp:
            trimesh.Trimesh(mesh.vertices, mesh.faces, vertex_colors=mesh.colors, process=False).export(
                tmp, file_type=suffix[1:]
            )


def _libraries() -> tuple[MarchingCubes, ModuleType]:
    """scikit-image's marching cubes and the trimesh module, or an InputError naming the install command."""
    try:
        import trimesh
        from skimage.measure import marching_cubes
    except ImportError as exc:
        raise InputError(f"the mesh export needs {exc.name}: {INSTALL_HINT}") from None
    return marching_cubes, trimesh


@torch.no_grad()
def surface_view(render: Callable[[Batch], RenderOutput], batch: Batch, cfg: MeshFormat.Config) -> SurfaceView:
    """The first view of ``batch`` rendered by ``render``: its depth (``cfg.depth``) where opaque, and colour."""
    if batch.cameras.model.kind != "pinhole":
        raise InputError(
            "the mesh export fuses pinhole views; these are seen through a fisheye lens: train with "
            "data.fisheye=undistort"
        )
    out = render(batch)
    depth = out.median_depth if cfg.depth == "median" else out.depth
    if depth is None:
        raise InputError(
            "the renderer gave no median depth (a plugin renderer without renderer.median_depth): export with "
            "depth=expected"
        )
    alpha = out.alpha[0].float()  # [H, W, 1]
    depth = torch.where(alpha[..., 0] >= cfg.min_alpha, depth[0, ..., 0].float(), 0.0)  # [H, W]
    background = batch.backgrounds[0].float()  # [3]
    color = ((out.image[0].float() - (1.0 - alpha) * background) / alpha.clamp_min(1e-6)).clamp(0.0, 1.0)
    camera = batch.cameras[0]
    return SurfaceView(depth.cpu(), color.cpu(), camera.viewmats[0].float().cpu(), camera.Ks[0].float().cpu())


def camera_extent(views: list[SurfaceView]) -> float:
    """The radius of the views' camera centres around their mean, times 1.1 (3DGS's scene extent)."""
    centres = torch.stack([-view.viewmat[:3, :3].T @ view.viewmat[:3, 3] for view in views])  # [V, 3]
    return max((centres - centres.mean(0)).norm(dim=-1).max().item(), 1e-6) * 1.1


def backproject(view: SurfaceView) -> Tensor:
    """World points [P, 3] of the view's pixels with a depth (at the pixel centres)."""
    ys, xs = torch.nonzero(view.depth > 0, as_tuple=True)  # [P] each
    z = view.depth[ys, xs]
    K = view.K
    x = (xs.float() + 0.5 - K[0, 2]) / K[0, 0] * z
    y = (ys.float() + 0.5 - K[1, 2]) / K[1, 1] * z
    cam = torch.stack([x, y, z], dim=-1)  # [P, 3]
    rot, trans = view.viewmat[:3, :3], view.viewmat[:3, 3]
    return (cam - trans) @ rot  # R^T (p - t)


class Grid(NamedTuple):
    """A voxel grid: the centre of voxel ``(i, j, k)`` is ``origin + voxel * (i, j, k)``."""

    origin: Tensor  # [3]
    voxel: float
    dims: tuple[int, int, int]

    @property
    def size(self) -> int:
        return self.dims[0] * self.dims[1] * self.dims[2]


def plan_grid(views: list[SurfaceView], cfg: MeshFormat.Config) -> Grid:
    """The grid over the views' surface points (0.1 % outliers on each side of each axis left out), with
    ``cfg.voxel`` or the longest side / 256; an InputError when nothing is opaque, the voxel is larger than the
    scene or far too small for it, or the grid would not fit."""
    points = [backproject(view) for view in views]
    points = torch.cat(points) if points else torch.zeros(0, 3)
    if len(points) == 0:
        raise InputError(
            f"nothing to mesh: no training view renders a pixel with opacity >= {cfg.min_alpha} (an empty scene?)"
        )
    sample = points[torch.randperm(len(points), generator=torch.Generator().manual_seed(0))[: 1 << 20]]
    low, high = torch.quantile(sample, 0.001, dim=0), torch.quantile(sample, 0.999, dim=0)  # [3] each
    side = float((high - low).max())
    if cfg.voxel * MIN_VOXELS_ACROSS > side:
        raise InputError(
            f"voxel={cfg.voxel:g}: the voxel is larger than the scene, whose surface spans {side:.3g} scene units "
            f"(fewer than {MIN_VOXELS_ACROSS} voxels); give a voxel of at most {side / MIN_VOXELS_ACROSS:.3g}, or "
            f"none (the longest side / 256: {side / 256:.3g})"
        )
    if cfg.voxel and side > cfg.voxel * MAX_VOXELS_ACROSS:
        raise InputError(
            f"voxel={cfg.voxel:g}: the voxel is too small for the scene, whose surface spans {side:.3g} scene units "
            f"(more than {MAX_VOXELS_ACROSS} voxels); give a voxel of at least {side / MAX_VOXELS_ACROSS:.3g}, or "
            f"none (the longest side / 256: {side / 256:.3g})"
        )
    voxel = cfg.voxel or side / 256 or 1e-3
    margin = (cfg.truncation + 1) * voxel
    low, high = low - margin, high + margin
    dims = tuple(int(d) for d in torch.ceil((high - low) / voxel).long() + 1)
    grid = Grid(low, voxel, dims)
    check_memory(grid, grid.size * DENSE_BYTES)
    return grid


def check_memory(grid: Grid, needed: int) -> None:
    """An InputError saying how much memory the grid needs when ``needed`` bytes exceed what is free."""
    free = available_host_bytes()
    if needed > free:
        raise InputError(
            f"voxel={grid.voxel:.4g} makes a {'x'.join(map(str, grid.dims))} grid, which needs {needed / 2**30:.1f} "
            f"GiB of memory; {free / 2**30:.1f} GiB are free: give a larger voxel (e.g. --voxel "
            f"{grid.voxel * math.sqrt(needed / free) * 1.1:.3g})"
        )


def flat_ids(ijk: Tensor, dims: tuple[int, int, int] | Tensor) -> Tensor:
    """Row-major flat ids [M] of cell indices ``ijk`` [M, 3] in a grid of ``dims`` cells."""
    return (ijk[:, 0] * dims[1] + ijk[:, 1]) * dims[2] + ijk[:, 2]


def cell_indices(ids: Tensor, dims: tuple[int, int, int] | Tensor) -> Tensor:
    """The cell indices [M, 3] of row-major flat ids ``ids`` [M] (the inverse of `flat_ids`)."""
    return torch.stack([ids // (dims[1] * dims[2]), ids // dims[2] % dims[1], ids % dims[2]], dim=-1)


def active_voxels(views: list[SurfaceView], grid: Grid, truncation: float) -> Tensor:
    """Flat ids of the voxels in the blocks of ``BLOCK``³ voxels within ``truncation`` voxels of the surface points,
    sorted, [M]."""
    block_dims = torch.tensor([math.ceil(d / BLOCK) for d in grid.dims])  # [3]
    reach = math.ceil((truncation + 1) / BLOCK)  # blocks this far around a point's hold its truncation band
    offsets = torch.stack(torch.meshgrid(*[torch.arange(-reach, reach + 1)] * 3, indexing="ij"), -1).reshape(-1, 3)
    blocks = set()
    for view in views:
        cells = torch.floor((backproject(view) - grid.origin) / (grid.voxel * BLOCK)).long()  # [P, 3]
        cells = torch.unique(cells, dim=0)
        cells = (cells[:, None, :] + offsets[None]).reshape(-1, 3)
        inside = ((cells >= 0) & (cells < block_dims)).all(-1)
        blocks.update(torch.unique(flat_ids(cells[inside], block_dims)).tolist())
    blocks = cell_indices(torch.tensor(sorted(blocks), dtype=torch.long), block_dims)  # [B, 3]
    local = torch.stack(torch.meshgrid(*[torch.arange(BLOCK)] * 3, indexing="ij"), -1).reshape(-1, 3)  # [512, 3]
    ijk = (blocks[:, None, :] * BLOCK + local[None]).reshape(-1, 3)  # [B * 512, 3]
    ijk = ijk[(ijk < torch.tensor(grid.dims)).all(-1)]
    return torch.sort(flat_ids(ijk, grid.dims))[0]


def fuse(views: list[SurfaceView], cfg: MeshFormat.Config, marching_cubes: MarchingCubes) -> Mesh:
    """TSDF fusion of ``views`` over the voxels near their surface points, then marching cubes at 0 where some view
    observed a voxel; colours are the fused colours of the vertices' nearest voxels."""
    grid = plan_grid(views, cfg)
    ids = active_voxels(views, grid, cfg.truncation)  # [M]
    check_memory(grid, grid.size * DENSE_BYTES + len(ids) * ACTIVE_BYTES)
    truncation = cfg.truncation * grid.voxel
    sdf_sum, weight, color_sum = torch.zeros(len(ids)), torch.zeros(len(ids)), torch.zeros(len(ids), 3)
    for start in range(0, len(ids), CHUNK_VOXELS):
        chunk = slice(start, start + CHUNK_VOXELS)
        centres = grid.origin + grid.voxel * cell_indices(ids[chunk], grid.dims).float()  # [m, 3]
        for view in views:
            update, sdf, color = integrate(view, centres, truncation)
            sdf_sum[chunk] += sdf
            weight[chunk] += update.float()
            color_sum[chunk] += color
    observed = weight > 0
    volume = np.ones(grid.dims, dtype=np.float32)
    volume.reshape(-1)[ids[observed].numpy()] = (sdf_sum[observed] / weight[observed]).numpy()
    seen = np.zeros(grid.dims, dtype=bool)
    seen.reshape(-1)[ids[observed].numpy()] = True
    if not ((volume < 0) & seen).any() or not ((volume > 0) & seen).any():
        raise InputError("nothing to mesh: the fused depth crosses no surface (an empty scene?)")
    vertices, faces, _, _ = marching_cubes(volume, level=0.0, spacing=(grid.voxel,) * 3, mask=observed_cubes(seen))
    nearest = torch.from_numpy(np.rint(vertices / grid.voxel).astype(np.int64))  # [V, 3] voxel indices
    nearest_ids = flat_ids(nearest, grid.dims)
    slot = torch.searchsorted(ids, nearest_ids).clamp_max(len(ids) - 1)
    found = (ids[slot] == nearest_ids) & observed[slot]
    colors = torch.where(found[:, None], color_sum[slot] / weight[slot].clamp_min(1.0)[:, None], 0.5)
    return Mesh(
        (vertices + grid.origin.numpy()).astype(np.float32),
        faces.astype(np.int64),
        (colors.clamp(0, 1) * 255 + 0.5).to(torch.uint8).numpy(),
    )


def integrate(view: SurfaceView, centres: Tensor, truncation: float) -> tuple[Tensor, Tensor, Tensor]:
    """What ``view`` says of the voxels at ``centres`` [m, 3]: whether it observes each, within ``truncation``
    behind its surface or anywhere in front (bool [m]), the truncated signed distance along the camera's z in
    units of ``truncation`` (positive in front, at most 1; [m]) and the pixel's colour ([m, 3]), 0 where not."""
    height, width = view.depth.shape
    cam = centres @ view.viewmat[:3, :3].T + view.viewmat[:3, 3]  # [m, 3]
    z = cam[:, 2]
    front = z > 1e-6
    _, _, px, py = pinhole_project(cam[:, 0], cam[:, 1], torch.where(front, z, 1.0), view.K)
    col, row = torch.floor(px).long(), torch.floor(py).long()
    inside = front & (col >= 0) & (col < width) & (row >= 0) & (row < height)
    pixel = torch.where(inside, row * width + col, 0)
    depth = view.depth.reshape(-1)[pixel]  # [m]
    distance = depth - z  # > 0 in front of the surface
    update = inside & (depth > 0) & (distance >= -truncation)
    sdf = torch.where(update, (distance / truncation).clamp_max(1.0), 0.0)
    return update, sdf, torch.where(update[:, None], view.color.reshape(-1, 3)[pixel], 0.0)


def observed_cubes(seen: np.ndarray) -> np.ndarray:
    """Per voxel, whether the cube it is the last corner of (scikit-image's mask) has all eight corners ``seen``: the
    cubes marching cubes may cross (one with an unobserved corner would close the truncation band behind the
    surface), same shape."""
    cubes = np.zeros_like(seen)
    inner = seen[:-1, :-1, :-1].copy()
    for di, dj, dk in np.ndindex(2, 2, 2):
        inner &= seen[di : di + seen.shape[0] - 1, dj : dj + seen.shape[1] - 1, dk : dk + seen.shape[2] - 1]
    cubes[1:, 1:, 1:] = inner
    return cubes


def keep_largest_parts(mesh: Mesh, parts: int) -> Mesh:
    """The ``parts`` connected parts of ``mesh`` (triangles sharing vertices) with the most triangles."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = len(mesh.vertices)
    edges = np.concatenate([mesh.faces[:, [0, 1]], mesh.faces[:, [1, 2]]])  # [2F, 2]
    graph = coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    face_labels = labels[mesh.faces[:, 0]]  # [F]
    sizes = np.bincount(face_labels)
    kept = np.argsort(-sizes, kind="stable")[:parts]
    keep_faces = np.isin(face_labels, kept)
    faces = mesh.faces[keep_faces]
    used = np.unique(faces)
    remap = np.full(n, -1, dtype=np.int64)
    remap[used] = np.arange(len(used))
    return Mesh(mesh.vertices[used], remap[faces], mesh.colors[used])
