"""Block training's plan: the capture's ground plane, a grid of cells on it, and what each block trains on.

The ground plane is perpendicular to the up direction of the cameras (the mean of their images' up axes); its
first axis follows the cameras' longest spread. The plane is cut into ``rows × cols`` cells at quantiles of the
SfM points (or of the cameras), column by column, so that each cell holds about as many; the outer cells reach
to infinity, so the cells tile the plane. A block is its cell grown by ``overlap`` of its size on every side: it
trains on the points inside the grown cell, on the cameras inside it, and on the cameras elsewhere whose images the
grown cell fills enough of (the position- and visibility-based selection of VastGaussian, Lin et al. 2024). The
merge keeps each block's Gaussians inside its own cell, so every Gaussian of the merged scene comes from one block.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gsrecon.cameras.lens import pinhole_project
from gsrecon.data.scene import Frame, Scene
from gsrecon.errors import InputError
from gsrecon.geometry import camera_centers

BALANCES = ("auto", "points", "cameras")
_COVERAGE_BINS = (32, 24)  # image bins the visibility test counts (x, y)
_BOX_SAMPLES = (9, 9, 5)  # samples of a grown cell's box along u, v and up, whose projections outline it


@dataclass
class PartitionConfig:
    """``partition:`` of a run: block training (off with one block, the default)."""

    blocks: Any = 1  # the number of blocks (1: off; the grid's shape follows the capture's), or a grid [rows, cols]
    overlap: float = 0.2  # each block's cell grown by this fraction of its size on every side
    balance: str = "auto"  # cells hold about as many: points | cameras | auto (points when the capture has them)
    # A camera outside a block's grown cell trains that block when the grown cell fills this fraction of its image
    visibility: float = 0.25
    merge_steps: int = 0  # > 0: fine-tune the merged scene on every camera for this many steps (no densification)
    only: int | None = None  # train this block only (a job array's task); `gsrecon merge --exp-dir` merges them
    block: int | None = None  # set by gsrecon in each block's own config.yaml: the run trains this block

    def __post_init__(self) -> None:
        self.grid_request()  # refuses a bad `blocks`
        if not (math.isfinite(self.overlap) and self.overlap >= 0):
            raise ValueError(f"partition.overlap must be a finite number >= 0, got {self.overlap!r}")
        if self.balance not in BALANCES:
            raise ValueError(f"partition.balance must be one of {', '.join(BALANCES)}, got '{self.balance}'")
        if not 0 < self.visibility <= 1:
            raise ValueError(f"partition.visibility must be in (0, 1], got {self.visibility!r}")
        if self.merge_steps < 0:
            raise ValueError(f"partition.merge_steps must be >= 0, got {self.merge_steps}")
        for key in ("only", "block"):
            value = getattr(self, key)
            if value is not None and not 0 <= value < self.num_blocks:
                raise ValueError(f"partition.{key} must be a block index in 0..{self.num_blocks - 1}, got {value}")

    def grid_request(self) -> tuple[int, int] | int:
        """``blocks`` as asked: a number of blocks, or a grid (rows, cols)."""
        value = self.blocks
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        is_pair = isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2
        if is_pair and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in value):
            return int(value[0]), int(value[1])
        raise ValueError(f"partition.blocks must be a number of blocks >= 1 or a grid [rows, cols], got {value!r}")

    @property
    def num_blocks(self) -> int:
        request = self.grid_request()
        return request if isinstance(request, int) else request[0] * request[1]

    @property
    def enabled(self) -> bool:
        """More than one block: ``gsrecon train`` trains the blocks and merges them."""
        return self.num_blocks > 1


@dataclass(frozen=True)
class GroundFrame:
    """Coordinates on the capture's ground plane: ``origin`` [3], unit ``up`` [3], unit horizontal ``axes`` [2, 3]
    (u along the cameras' longest spread, v = up × u)."""

    origin: Tensor
    up: Tensor
    axes: Tensor

    def coords(self, points: Tensor) -> Tensor:
        """Ground coordinates (u, v) [N, 2] of world ``points`` [N, 3]."""
        return (points.double() - self.origin) @ self.axes.T

    def heights(self, points: Tensor) -> Tensor:
        """Heights above the origin along ``up``, [N], of world ``points`` [N, 3]."""
        return (points.double() - self.origin) @ self.up

    def world(self, uvh: Tensor) -> Tensor:
        """World points [N, 3] at ground coordinates and heights ``uvh`` [N, 3]."""
        return self.origin + uvh[:, :2] @ self.axes + uvh[:, 2:] * self.up


def ground_frame(viewmats: Tensor) -> GroundFrame:
    """The ground plane of cameras with world-to-camera ``viewmats`` [F, 4, 4] (OpenCV: image up is -y, forward z).

    Up is the normal of the plane the cameras spread over where they spread over one (an aerial grid, an orbit;
    pointing the way the images' up axes and against their viewing directions), else the mean of the images' up
    axes, made perpendicular to the path where the cameras follow one (along a street: a path is level)."""
    viewmats = viewmats.double()
    centers = camera_centers(viewmats)  # [F, 3]
    origin = centers.mean(0)
    image_up = -viewmats[:, 1, :3].mean(0)  # the cameras' -y axes in world coordinates, averaged
    hint = image_up - viewmats[:, 2, :3].mean(0)  # ... and against their viewing directions
    up = image_up
    if len(centers) >= 3:
        singular, spread = torch.linalg.svd(centers - origin, full_matrices=False)[1:]  # [3], [3, 3]
        if singular[1] > 0.25 * singular[0] and singular[2] < 0.5 * singular[1]:
            up = spread[2] if spread[2] @ hint >= 0 else -spread[2]
        elif singular[1] <= 0.25 * singular[0]:
            up = image_up - (image_up @ spread[0]) * spread[0]
    if up.norm() < 0.3:  # images rolled every way along a path: against the viewing directions
        up = hint if hint.norm() > 1e-6 else torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    up = up / up.norm()
    flat = (centers - origin) - ((centers - origin) @ up)[:, None] * up  # [F, 3] on the plane
    u = torch.linalg.svd(flat).Vh[0] if flat.norm() > 1e-9 else torch.zeros(3, dtype=torch.float64)
    if u.norm() < 0.5:  # one camera, or all at one place: any horizontal axis
        u = torch.linalg.cross(up, torch.eye(3, dtype=up.dtype)[int(up.abs().argmin())])
    u = u - (u @ up) * up
    u = u / u.norm()
    return GroundFrame(origin, up, torch.stack([u, torch.linalg.cross(up, u)]))


@dataclass(frozen=True)
class Cell:
    """A rectangle of the ground plane, ``lo <= (u, v) < hi``; a side may be infinite."""

    lo: tuple[float, float]
    hi: tuple[float, float]

    def contains(self, uv: Tensor) -> Tensor:
        """[N] bool: which ground points ``uv`` [N, 2] lie in the cell."""
        lo, hi = torch.tensor(self.lo, dtype=uv.dtype), torch.tensor(self.hi, dtype=uv.dtype)
        return ((uv >= lo) & (uv < hi)).all(-1)

    def bounded(self, lo: Sequence[float], hi: Sequence[float]) -> Cell:
        """The cell with its infinite sides at the bounds ``lo``, ``hi`` (u, v) of the capture."""
        return Cell(
            tuple(max(a, b) for a, b in zip(self.lo, lo, strict=True)),
            tuple(min(a, b) for a, b in zip(self.hi, hi, strict=True)),
        )

    def grown(self, overlap: float, lo: Sequence[float], hi: Sequence[float]) -> Cell:
        """The cell grown by ``overlap`` of its size (measured within the bounds ``lo``, ``hi``) on every side."""
        inner = self.bounded(lo, hi)
        margin = [overlap * max(b - a, 0.0) for a, b in zip(inner.lo, inner.hi, strict=True)]
        return Cell(
            tuple(a - m for a, m in zip(self.lo, margin, strict=True)),
            tuple(b + m for b, m in zip(self.hi, margin, strict=True)),
        )

    def to_json(self) -> list[list[float | None]]:
        """[[u_lo, u_hi], [v_lo, v_hi]], null for an infinite side."""
        return [[_finite_or_none(self.lo[k]), _finite_or_none(self.hi[k])] for k in range(2)]

    @classmethod
    def from_json(cls, sides: Sequence[Sequence[float | None]]) -> Cell:
        """The cell written by :meth:`to_json`."""
        (u_lo, u_hi), (v_lo, v_hi) = sides
        return cls((_or_inf(u_lo, -1), _or_inf(v_lo, -1)), (_or_inf(u_hi, 1), _or_inf(v_hi, 1)))


@dataclass
class Block:
    """One block of a partition: its cell, the grown cell it trains on, and what it trains on."""

    index: int
    cell: Cell
    grown: Cell
    train: list[str]  # names of the training cameras
    test: list[str]  # names of the test views (chosen as the training cameras are)
    points: Tensor  # [P_b] int64 rows of the capture's points inside the grown cell
    joined: dict[str, str]  # camera name -> why it is in the block: "inside" or "sees 31 %"

    def describe(self) -> str:
        """One line: what the block took and why."""
        seeing = sum(1 for name in self.train if self.joined[name] != "inside")
        return (
            f"block {self.index}: {len(self.train)} training cameras ({len(self.train) - seeing} inside the grown "
            f"cell, {seeing} seeing enough of it), {len(self.test)} test views, {len(self.points)} points inside "
            f"the grown cell; cell u {_span(self.cell, 0)}, v {_span(self.cell, 1)}"
        )


@dataclass
class Partition:
    """A capture split into blocks over its ground plane."""

    ground: GroundFrame
    grid: tuple[int, int]  # rows (along v) × cols (along u); blocks are listed column by column
    balance: str  # what the cells were balanced by: points | cameras
    bounds: tuple[tuple[float, float], tuple[float, float]]  # (lo, hi) of what the capture shows, on the ground plane
    heights: tuple[float, float] | None  # the height range of the capture's points (None without points)
    blocks: list[Block]

    def cell_index(self, points: Tensor) -> Tensor:
        """[N] int64: the block whose cell holds each world point of ``points`` [N, 3]."""
        return cell_index(self.ground, [block.cell for block in self.blocks], points)  # blocks are in index order

    def to_json(self) -> dict[str, Any]:
        """The plan as written to ``partition.json``."""
        return {
            "grid": list(self.grid),
            "heights": None if self.heights is None else list(self.heights),
            "balance": self.balance,
            "ground": {name: getattr(self.ground, name).tolist() for name in ("origin", "up", "axes")},
            "blocks": [
                {
                    "index": b.index,
                    "cell": b.cell.to_json(),
                    "grown_cell": b.grown.to_json(),
                    "train": b.train,
                    "test": b.test,
                    "points": len(b.points),
                    "joined": b.joined,
                }
                for b in self.blocks
            ],
        }


def cell_index(ground: GroundFrame, cells: Sequence[Cell], points: Tensor) -> Tensor:
    """[N] int64: the position in ``cells`` (on the plane ``ground``) of the cell holding each world point of
    ``points`` [N, 3]; -1 where none does."""
    uv = ground.coords(points)
    index = torch.full((len(points),), -1, dtype=torch.int64)
    for position, cell in enumerate(cells):
        index[cell.contains(uv)] = position
    return index


def plan_cells(plan: Mapping[str, Any]) -> tuple[GroundFrame, list[Cell]]:
    """The ground plane and the blocks' cells (in block order) of a plan as ``partition.json`` holds it
    (:meth:`Partition.to_json`)."""
    ground = GroundFrame(
        *(torch.tensor(plan["ground"][name], dtype=torch.float64) for name in ("origin", "up", "axes"))
    )
    blocks = sorted(plan["blocks"], key=lambda block: block["index"])
    return ground, [Cell.from_json(block["cell"]) for block in blocks]


def plan_partition(scene: Scene, cfg: PartitionConfig) -> Partition:
    """Split ``scene`` into ``cfg.blocks`` blocks; raises InputError where a block would have nothing to train on."""
    frames = scene.train + scene.test
    request = cfg.grid_request()
    if cfg.num_blocks > len(scene.train):
        raise InputError(
            f"partition.blocks={cfg.blocks}: {cfg.num_blocks} blocks but the capture has only {len(scene.train)} "
            "training cameras; use fewer blocks"
        )
    ground = ground_frame(torch.stack([f.viewmat for f in frames]))
    cameras = ground.coords(torch.stack([f.camera_center for f in frames]))  # [F, 2]
    points = ground.coords(scene.points) if len(scene.points) else torch.zeros(0, 2, dtype=torch.float64)
    lo, hi = _bounds(cameras, points)
    balance = cfg.balance if cfg.balance != "auto" else ("points" if len(points) else "cameras")
    if balance == "points" and not len(points):
        raise InputError("partition.balance=points: the capture has no points; use partition.balance=cameras")
    values = points if balance == "points" else cameras[: len(scene.train)]
    grid = request if isinstance(request, tuple) else _grid_shape(request, (hi[0] - lo[0], hi[1] - lo[1]))
    cells = _split_cells(values, *grid)
    heights = ground.heights(scene.points) if len(scene.points) else torch.zeros(0, dtype=torch.float64)
    blocks = []
    for index, cell in enumerate(cells):
        grown = cell.grown(cfg.overlap, lo, hi)
        rows = torch.nonzero(grown.contains(points)).flatten() if len(points) else torch.zeros(0, dtype=torch.int64)
        box = cell_box(grown.bounded(lo, hi), _height_range(heights[rows])) if len(rows) else None
        joined = _choose_cameras(frames, cameras, grown, box, ground, cfg.visibility)
        train = [f.name for f in scene.train if f.name in joined]
        block = Block(index, cell, grown, train, [f.name for f in scene.test if f.name in joined], rows, joined)
        _check_block(block, grid, bool(len(points)))
        blocks.append(block)
    height_range = _height_range(heights) if len(heights) else None
    return Partition(ground, grid, balance, (tuple(lo), tuple(hi)), height_range, blocks)


def block_scene(scene: Scene, block: Block) -> Scene:
    """The part of ``scene`` ``block`` trains on: its cameras and test views, and its points (with their tracks and
    keypoints)."""
    train, test = set(block.train), set(block.test)
    new_row = torch.full((len(scene.points),), -1, dtype=torch.int64)
    new_row[block.points] = torch.arange(len(block.points))
    observed, keypoints = {}, {}
    for name, rows in scene.observed.items():
        if name in train:
            kept = new_row[rows]
            observed[name] = kept[kept >= 0]
            if name in scene.keypoints:
                keypoints[name] = scene.keypoints[name][kept >= 0]
    hint = "block training: triangulate the capture first (gsrecon data triangulate), so that its blocks share points"
    return dataclasses.replace(
        scene,
        train=[f for f in scene.train if f.name in train],
        test=[f for f in scene.test if f.name in test],
        points=scene.points[block.points],
        colors=scene.colors[block.points],
        extent=scene.extent,  # the capture's: its scale sets the learning rates and densification, as in one run
        observed=observed,
        keypoints=keypoints,
        triangulate=None,
        posed_capture=None,
        points_hint=scene.points_hint if len(scene.points) else hint,
    )


def image_coverage(frame: Frame, ground: GroundFrame, box: tuple[Tensor, Tensor]) -> float:
    """The fraction of ``frame``'s image that a box of the ground frame fills (``box``: (u, v, height) lo [3] and
    hi [3]): the image bins inside the outline of the box's projection. Projects through ``K`` as a pinhole (a
    fisheye frame's outline is approximate)."""
    lo, hi = box
    axes = [torch.linspace(float(lo[k]), float(hi[k]), n, dtype=torch.float64) for k, n in enumerate(_BOX_SAMPLES)]
    samples = ground.world(torch.cartesian_prod(*axes))  # [S, 3]
    viewmat, K = frame.viewmat.double(), frame.K.double()
    camera = samples @ viewmat[:3, :3].T + viewmat[:3, 3]  # [S, 3]
    camera = camera[camera[:, 2] > 1e-6]
    if len(camera) < 3:
        return 0.0
    projection = pinhole_project(camera[:, 0], camera[:, 1], camera[:, 2], K)
    pixels = torch.stack([projection.pixel_x, projection.pixel_y], dim=-1)  # [S', 2]
    outline = _convex_hull(pixels.numpy())
    if len(outline) < 3:
        return 0.0
    bx, by = _COVERAGE_BINS
    xs = (np.arange(bx) + 0.5) * frame.width / bx
    ys = (np.arange(by) + 0.5) * frame.height / by
    centres = np.stack(np.meshgrid(xs, ys), -1).reshape(-1, 2)  # [B, 2]
    edges = np.roll(outline, -1, axis=0) - outline  # [V, 2], counter-clockwise
    to_centre = centres[:, None, :] - outline[None]  # [B, V, 2]
    cross = edges[None, :, 0] * to_centre[..., 1] - edges[None, :, 1] * to_centre[..., 0]  # [B, V]
    return float((cross >= 0).all(-1).mean())


def _choose_cameras(
    frames: list[Frame],
    cameras: Tensor,
    grown: Cell,
    box: tuple[Tensor, Tensor] | None,
    ground: GroundFrame,
    visibility: float,
) -> dict[str, str]:
    """Camera name -> why it joins the block: its centre (``cameras`` [F, 2] ground coordinates) inside ``grown``,
    or (with a ``box``: the grown cell's box from its points) its image filled at least ``visibility`` by the box."""
    inside = grown.contains(cameras)
    joined = {}
    for frame, is_inside in zip(frames, inside.tolist(), strict=True):
        if is_inside:
            joined[frame.name] = "inside"
        elif box is not None and (coverage := image_coverage(frame, ground, box)) >= visibility:
            joined[frame.name] = f"sees {100 * coverage:.0f} %"
    return joined


def cell_box(cell: Cell, heights: tuple[float, float]) -> tuple[Tensor, Tensor]:
    """The box (u, v, height) lo [3], hi [3] over a bounded ``cell`` between ``heights`` (low, high)."""
    return (
        torch.tensor([cell.lo[0], cell.lo[1], heights[0]], dtype=torch.float64),
        torch.tensor([cell.hi[0], cell.hi[1], heights[1]], dtype=torch.float64),
    )


def _height_range(heights: Tensor) -> tuple[float, float]:
    """(low, high) of points' ``heights`` [P]: their 2nd and 98th percentile (a few stray points do not count)."""
    low, high = torch.quantile(heights, torch.tensor([0.02, 0.98], dtype=heights.dtype)).tolist()
    return low, high


def _bounds(cameras: Tensor, points: Tensor) -> tuple[list[float], list[float]]:
    """(lo, hi) (u, v) of what the capture shows: the 1st to 99th percentile of its points, or without points its
    cameras (the size a cell's overlap is measured by, and the grid's shape)."""
    if not len(points):
        return cameras.min(0).values.tolist(), cameras.max(0).values.tolist()
    lo, hi = torch.quantile(points, torch.tensor([0.01, 0.99], dtype=points.dtype), dim=0)
    return lo.tolist(), hi.tolist()


def _grid_shape(num_blocks: int, size: tuple[float, float]) -> tuple[int, int]:
    """(rows, cols) with rows × cols = ``num_blocks`` whose cells are closest to square on a capture of ``size``
    (u, v)."""
    pairs = [(num_blocks // cols, cols) for cols in range(1, num_blocks + 1) if num_blocks % cols == 0]
    width, depth = max(size[0], 1e-9), max(size[1], 1e-9)
    return min(pairs, key=lambda rc: abs(math.log((width / rc[1]) / (depth / rc[0]))))


def _split_cells(values: Tensor, rows: int, cols: int) -> list[Cell]:
    """Cells of a rows × cols grid holding about as many of ``values`` [N, 2] (ground coordinates) each: columns cut
    at quantiles of u, then each column at quantiles of v of its own values; listed column by column."""
    u_cuts = _cuts(values[:, 0], cols)
    cells = []
    for j in range(cols):
        in_column = values[(values[:, 0] >= u_cuts[j]) & (values[:, 0] < u_cuts[j + 1]), 1]
        v_cuts = _cuts(in_column if len(in_column) else values[:, 1], rows)
        cells += [Cell((u_cuts[j], v_cuts[i]), (u_cuts[j + 1], v_cuts[i + 1])) for i in range(rows)]
    return cells


def _cuts(values: Tensor, parts: int) -> list[float]:
    """-inf, the ``parts`` - 1 inner quantiles of ``values`` [N], +inf."""
    inner = torch.quantile(values, torch.arange(1, parts, dtype=values.dtype) / parts).tolist() if parts > 1 else []
    return [-math.inf, *inner, math.inf]


def _check_block(block: Block, grid: tuple[int, int], has_points: bool) -> None:
    """Refuse a block with nothing to train on, saying how to partition instead."""
    missing = "training cameras" if not block.train else ("points" if has_points and not len(block.points) else "")
    if missing:
        raise InputError(
            f"partition.blocks: block {block.index} of the {grid[0]}×{grid[1]} grid (cell u {_span(block.cell, 0)}, "
            f"v {_span(block.cell, 1)}) has no {missing}; use fewer blocks or a larger partition.overlap"
        )


def _span(cell: Cell, axis: int) -> str:
    return f"[{cell.lo[axis]:.3g}, {cell.hi[axis]:.3g})"


def _or_inf(value: float | None, sign: int) -> float:
    """``value``, or infinity of ``sign`` for None (an infinite side in ``partition.json``)."""
    return sign * math.inf if value is None else float(value)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _convex_hull(points: np.ndarray) -> np.ndarray:
    """The convex hull [V, 2] of ``points`` [N, 2], counter-clockwise (Andrew's monotone chain)."""
    order = np.lexsort((points[:, 1], points[:, 0]))
    unique = points[order]

    def half(sequence: np.ndarray) -> list[np.ndarray]:
        chain: list[np.ndarray] = []
        for p in sequence:
            while len(chain) >= 2:
                a, b = chain[-2], chain[-1]
                if (b[0] - a[0]) * (p[1] - a[1]) - (b[1] - a[1]) * (p[0] - a[0]) > 0:
                    break
                chain.pop()
            chain.append(p)
        return chain

    lower, upper = half(unique), half(unique[::-1])
    return np.array(lower[:-1] + upper[:-1])
