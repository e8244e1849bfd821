"""Pure-PyTorch 3D Gaussian Splatting renderer (CPU or GPU), the reference renderer of gsrecon.

It implements the forward model of 3DGS as gsplat 1.5 does (pinhole EWA splatting, in classic
mode or with the "antialiased" opacity compensation of Mip-Splatting) and is differentiable end
to end. Compositing runs on screen tiles: each tile composites, sorted by depth, only the
Gaussians whose alpha can reach 1/255 in it, so no ``N x H x W`` tensor is ever built and the
image does not depend on the tile size. Compositing has a hand-written backward (`_BlendTiles`); everything else is
differentiated by autograd.

The implementation is tuned for one CPU core (the training engine where no GPU is available):
tensors are processed in cache-sized chunks, gathers are 1-D ``index_select`` calls, and masks
use ``threshold``/``sign`` rather than comparisons, all several times faster than the obvious
alternatives on CPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from gsrecon.cameras import Cameras
from gsrecon.cameras.lens import fisheye_project, pinhole_project
from gsrecon.geometry import camera_centers, quat_scale_to_factor
from gsrecon.params import PARAM_NAMES
from gsrecon.registry import RENDERER_REGISTRY
from gsrecon.render.base import Renderer, RendererConfig, RenderOutput
from gsrecon.sh import num_sh_bases, sh_to_color

ALPHA_MIN = 1.0 / 255.0  # a Gaussian with alpha below this is skipped at a pixel
TRANSMITTANCE_MIN = 1e-4  # a pixel stops before the Gaussian that would take T to or below this
BBOX_SIGMAS = 3.33  # bounding boxes never extend past this many standard deviations
CLAMP_MARGIN = 0.15  # J's x / z and y / z are clamped this fraction of the image's size past its edges
N_FEATURES = 5  # composited per Gaussian: r, g, b, depth, 1 (the last accumulates alpha)
DEPTH_FEATURE = 3  # the depth's place among the composited features
MEDIAN_TRANSMITTANCE = 0.5  # the median depth is the depth of the Gaussian that takes T across this
_SKIP = 1e4  # quadratic offset of padding slots: exp(-1e4) is exactly 0
_TINY = 1e-30  # floor of the undilated covariance determinant (degenerate Gaussians get opacity ~0)
_LOG2_E = 1.0 / math.log(2.0)
INTERSECT_CHUNK = 1 << 16  # visible Gaussians whose candidate tiles `intersect_tiles` lists at once


class Projection(NamedTuple):
    """Screen-space Gaussians for ``C`` cameras (see `project_gaussians`)."""

    means2d: Tensor  # [C, N, 2] pixel coordinates of the centres
    conics: Tensor  # [C, N, 3] inverse 2D covariance (xx, xy, yy)
    depths: Tensor  # [C, N] camera-space z
    radii: Tensor  # [C, N, 2] int32 bounding-box half extents in pixels, 0 = culled
    log_opacities: Tensor  # [C, N] ln(opacity) as composited in each camera (with compensation)


def project_gaussians(
    means: Tensor,  # [N, 3]
    factors: Tensor,  # [N, 3, 3] covariance factors (`quat_scale_to_factor`)
    log_opacities: Tensor,  # [N] ln of the activated opacities
    cameras: Cameras,  # C cameras, pinhole or fisheye
    cfg: RendererConfig,  # near_plane, far_plane, eps2d, antialiased
) -> Projection:
    """EWA projection of 3D Gaussians into pinhole (or fisheye) cameras, with culling.

    The 2D covariance is ``J W Sigma W^T J^T + eps2d * I`` with the perspective Jacobian ``J``
    evaluated at the centre, its x/z and y/z clamped to the image plus ``CLAMP_MARGIN`` of its size on each side
    (1.3x the half field of view of a centred camera, as gsplat and 3DGS do). The bounding box is opacity-aware
    as in gsplat 1.5: per axis, ``ceil(e * sqrt(cov_ii))`` with ``e = min(3.33, sqrt(2 ln(255 * opacity)))``,
    which encloses every pixel where the Gaussian's alpha reaches 1/255. Radii are 0 for Gaussians outside
    (near_plane, far_plane), with opacity < 1/255, or whose box misses the image.

    ``cfg.antialiased`` scales each opacity by ``sqrt(det(cov2d) / det(cov2d + eps2d * I))`` (gsplat's
    "antialiased" mode), so that the dilation does not make small Gaussians brighter; the box and
    the 1/255 test use the compensated opacity, as in gsplat.

    Through fisheye cameras (``cameras.model``) the centre and the Jacobian are the lens model's
    (`gsrecon.cameras.lens`), with no clamp, and Gaussians past the angle where the model folds back are culled.
    """
    width, height, eps2d = cameras.width, cameras.height, cfg.eps2d
    rot = cameras.viewmats[:, :3, :3]  # [C, 3, 3]
    means_c = _camera_space(means, cameras)  # [C, N, 3]
    in_depth = (means_c[..., 2] > cfg.near_plane) & (means_c[..., 2] < cfg.far_plane)  # [C, N]
    if cameras.model.kind == "pinhole":
        means2d, jr_x, jr_y = _pinhole_jacobian(means_c, in_depth, cameras)
    else:  # "fisheye"
        lens = fisheye_project(means_c, cameras.Ks, cameras.model.coeffs, cfg.near_plane)
        means2d, in_depth = lens.means2d, in_depth & lens.in_lens
        # Rows of J @ R_cam: the Jacobian of pixel coordinates w.r.t. world position.
        jr_x, jr_y = torch.matmul(lens.jacobian_u, rot), torch.matmul(lens.jacobian_v, rot)  # [C, N, 3] each
    b = torch.matmul(torch.stack([jr_x, jr_y], dim=-2), factors)  # [C, N, 2, 3], cov2d = b b^T
    raw_xx = (b[..., 0, :] * b[..., 0, :]).sum(-1)  # [C, N], before the dilation
    cov_xy = (b[..., 0, :] * b[..., 1, :]).sum(-1)
    raw_yy = (b[..., 1, :] * b[..., 1, :]).sum(-1)
    cov_xx, cov_yy = raw_xx + eps2d, raw_yy + eps2d
    det = cov_xx * cov_yy - cov_xy * cov_xy
    valid = in_depth & (det > 0)
    det = torch.where(valid, det, torch.ones_like(det))
    conics = torch.stack([cov_yy / det, -cov_xy / det, cov_xx / det], dim=-1)  # [C, N, 3]
    log_ops = log_opacities.expand_as(det)  # [C, N]
    if cfg.antialiased:
        det_orig = raw_xx * raw_yy - cov_xy * cov_xy
        det_orig = torch.where(valid, det_orig, torch.ones_like(det_orig)).clamp_min(_TINY)
        log_ops = log_ops + 0.5 * (torch.log(det_orig) - torch.log(det))

    with torch.no_grad():
        ops = log_ops.detach().exp()  # [C, N]
        # No gradient through the opacity here: a pixel outside the box fails compositing's alpha >= 1/255 anyway.
        extent = torch.sqrt(2.0 * torch.log(ops * 255.0).clamp_min(0.0)).clamp_max(BBOX_SIGMAS)
        radii = torch.stack(
            [torch.ceil(extent * cov_xx.sqrt()), torch.ceil(extent * cov_yy.sqrt())], dim=-1
        )  # [C, N, 2]
        m = means2d.detach()
        inside = (
            (m[..., 0] + radii[..., 0] > 0)
            & (m[..., 0] - radii[..., 0] < width)
            & (m[..., 1] + radii[..., 1] > 0)
            & (m[..., 1] - radii[..., 1] < height)
        )
        visible = valid & inside & (ops >= ALPHA_MIN) & (radii > 0).any(-1)
        radii = torch.where(visible[..., None], radii, 0.0).int()
    return Projection(means2d, conics, means_c[..., 2], radii, log_ops)


def _camera_space(means: Tensor, cameras: Cameras) -> Tensor:
    """The centres ``means`` [N, 3] in each camera's frame, [C, N, 3]."""
    rot, trans = cameras.viewmats[:, :3, :3], cameras.viewmats[:, :3, 3]  # [C, 3, 3], [C, 3]
    return torch.matmul(means, rot.transpose(1, 2)) + trans[:, None, :]


class _PinholeCoords(NamedTuple):
    """Pinhole coordinates of camera-space centres, for ``C`` cameras of ``N`` centres."""

    means2d: Tensor  # [C, N, 2] pixel coordinates
    z: Tensor  # [C, N] camera z, 1 where culled (keeps culled Gaussians finite)
    u_clamped: Tensor  # [C, N] x / z clamped to 1.3x the half field of view (as gsplat and 3DGS clamp J's)
    v_clamped: Tensor  # [C, N] y / z, likewise


def _pinhole_coords(
    means_c: Tensor,  # [C, N, 3] camera-space centres
    in_depth: Tensor,  # [C, N] bool
    cameras: Cameras,  # C pinhole cameras
) -> _PinholeCoords:
    """The centres' pixel coordinates, and x / z, y / z clamped to the image plus ``CLAMP_MARGIN`` of its size."""
    Ks, width, height = cameras.Ks, cameras.width, cameras.height
    x, y, z = means_c.unbind(-1)  # [C, N] each
    z = torch.where(in_depth, z, torch.ones_like(z))
    u, v, pixel_x, pixel_y = pinhole_project(x, y, z, Ks)
    means2d = torch.stack([pixel_x, pixel_y], dim=-1)  # [C, N, 2]
    fx, fy = Ks[:, 0, 0, None], Ks[:, 1, 1, None]  # [C, 1]
    cx, cy = Ks[:, 0, 2, None], Ks[:, 1, 2, None]
    margin_x, margin_y = CLAMP_MARGIN * width / fx, CLAMP_MARGIN * height / fy  # 0.3 * tan(fov / 2)
    u_clamped = torch.clamp(u, -(cx / fx + margin_x), (width - cx) / fx + margin_x)
    v_clamped = torch.clamp(v, -(cy / fy + margin_y), (height - cy) / fy + margin_y)
    return _PinholeCoords(means2d, z, u_clamped, v_clamped)


def _pinhole_jacobian(
    means_c: Tensor,  # [C, N, 3] camera-space centres
    in_depth: Tensor,  # [C, N] bool
    cameras: Cameras,  # C pinhole cameras
) -> tuple[Tensor, Tensor, Tensor]:
    """Pinhole centres [C, N, 2] and the rows of ``J @ R`` [C, N, 3] each, J evaluated at the clamped x/z, y/z."""
    means2d, z, u, v = _pinhole_coords(means_c, in_depth, cameras)
    rot, Ks = cameras.viewmats[:, :3, :3], cameras.Ks  # [C, 3, 3] each
    fx, fy = Ks[:, 0, 0, None], Ks[:, 1, 1, None]  # [C, 1]
    jr_x = (fx / z)[..., None] * (rot[:, None, 0, :] - u[..., None] * rot[:, None, 2, :])
    jr_y = (fy / z)[..., None] * (rot[:, None, 1, :] - v[..., None] * rot[:, None, 2, :])
    return means2d, jr_x, jr_y


@torch.no_grad()
def cull_gaussians(
    means: Tensor,  # [N, 3]
    log_scales: Tensor,  # [N, 3]
    log_opacities: Tensor,  # [N] ln of the activated opacities
    cameras: Cameras,  # C cameras; a fisheye's view is only bounded by depth here
    cfg: RendererConfig,  # near_plane, far_plane, eps2d
) -> Tensor:
    """Ids of the Gaussians that may be visible in at least one camera, sorted, [M].

    A superset of those `project_gaussians` gives non-zero radii: it drops Gaussians with
    opacity below 1/255 (compensation only lowers it), outside (near_plane, far_plane), or whose
    centre lies farther outside the image than an upper bound of their box, ``3.33 * sqrt(cov_ii)``
    with ``cov_xx <= (fx / z)^2 (1 + u^2) max_scale^2 + eps2d`` (the rows of ``J R`` have that
    norm, the covariance factor has spectral norm ``max_scale``). It costs a few passes over the
    means and scales, instead of the full projection and colour evaluation. Through fisheye lenses only
    the depth and opacity bounds apply.
    """
    means_c = _camera_space(means, cameras)  # [C, N, 3]
    keep = (means_c[..., 2] > cfg.near_plane) & (means_c[..., 2] < cfg.far_plane)  # [C, N]
    if cameras.model.kind == "pinhole":
        keep &= _near_pinhole_image(means_c, keep, log_scales, cameras, cfg.eps2d)
    return (keep.any(dim=0) & (log_opacities >= math.log(ALPHA_MIN) - 1e-5)).nonzero().squeeze(1)  # [M]


def _near_pinhole_image(
    means_c: Tensor,  # [C, N, 3] camera-space centres
    in_depth: Tensor,  # [C, N] bool
    log_scales: Tensor,  # [N, 3]
    cameras: Cameras,  # C pinhole cameras
    eps2d: float,
) -> Tensor:
    """Whether each centre lies within an upper bound of its box of the pinhole image (see `cull_gaussians`), [C, N]."""
    means2d, z, u_c, v_c = _pinhole_coords(means_c, in_depth, cameras)
    fx, fy = cameras.Ks[:, 0, 0, None], cameras.Ks[:, 1, 1, None]  # [C, 1]
    width, height = cameras.width, cameras.height
    max_scale = log_scales.amax(dim=-1).exp()  # [N]
    # 1% and one pixel of slack absorb rounding differences from the exact projection.
    rx = 1.01 * BBOX_SIGMAS * torch.sqrt((fx / z * max_scale) ** 2 * (1 + u_c * u_c) + eps2d) + 1.0
    ry = 1.01 * BBOX_SIGMAS * torch.sqrt((fy / z * max_scale) ** 2 * (1 + v_c * v_c) + eps2d) + 1.0
    px, py = means2d.unbind(-1)  # [C, N] each
    return (px + rx > 0) & (px - rx < width) & (py + ry > 0) & (py - ry < height)


def shade_gaussians(
    rows: Sequence[Tensor],
    cameras: Cameras,  # C cameras
    sh_degree: int,
    cfg: RendererConfig,
) -> tuple[Tensor, ...]:
    """The `Projection` fields, then the colours [C, M, 3], of the Gaussians whose parameter rows are ``rows``.

    ``rows`` are M rows of each parameter, in `PARAM_NAMES` order: means [M, 3], log scales [M, 3],
    quats [M, 4], opacity logits [M], sh0 [M, 1, 3] and shN [M, K, 3]. Every output is [C, M, ...].
    """
    means, log_scales, quats, logits, sh0, shN = rows
    log_opacities = F.logsigmoid(logits)  # [M]
    factors = quat_scale_to_factor(quats, torch.exp(log_scales))  # [M, 3, 3]
    proj = project_gaussians(means, factors, log_opacities, cameras, cfg)
    dirs = F.normalize(means[None] - camera_centers(cameras.viewmats)[:, None], dim=-1)  # [C, M, 3]
    coeffs = torch.cat([sh0, shN[:, : num_sh_bases(sh_degree) - 1]], dim=1)  # [M, K', 3]
    return (*proj, sh_to_color(sh_degree, dirs, coeffs[None]))


class _RowChunks(torch.autograd.Function):
    """``fn`` of the rows ``ids`` of ``tensors`` and of ``shared`` as a whole, ``chunk`` rows at a time; its outputs
    [C, M, ...] joined on dim 1.

    ``fn`` maps a list of row blocks (one per tensor) and ``shared`` (the cameras) to a tuple of [C, m, ...]
    tensors computed row by row. Forward keeps only the inputs; backward recomputes ``fn`` chunk by chunk, so
    memory is bounded by one chunk's intermediates instead of all rows', and the gradients are those of ``fn`` on
    all rows (``shared``'s summed over the chunks).
    """

    @staticmethod
    def forward(ctx, fn, ids, chunk, shared, *tensors):
        outputs: tuple[Tensor, ...] = ()
        for start in range(0, len(ids), chunk):  # each chunk straight into its place: no list of parts to join
            part = fn([t.index_select(0, ids[start : start + chunk]) for t in tensors], shared)
            outputs = outputs or tuple(p.new_empty(p.shape[0], len(ids), *p.shape[2:]) for p in part)
            for output, piece in zip(outputs, part):
                output[:, start : start + chunk] = piece
        ctx.fn, ctx.chunk = fn, chunk
        ctx.save_for_backward(ids, shared, *tensors)
        ctx.mark_non_differentiable(*(o for o in outputs if not o.is_floating_point()))
        return outputs

    @staticmethod
    def backward(ctx, *grad_outputs):
        ids, shared, *tensors = ctx.saved_tensors
        shared_wanted, wanted = ctx.needs_input_grad[3], ctx.needs_input_grad[4:]
        grads = [t.new_zeros(t.shape) if need else None for t, need in zip(tensors, wanted)]  # [N, ...] each
        shared_grad = torch.zeros_like(shared) if shared_wanted else None
        shared = shared.detach().requires_grad_(shared_wanted)
        start = 0
        for rows in ids.split(ctx.chunk):
            blocks = [t.detach().index_select(0, rows).requires_grad_(need) for t, need in zip(tensors, wanted)]
            with torch.enable_grad():
                outputs = ctx.fn(blocks, shared)
            pairs = [(o, g[:, start : start + len(rows)]) for o, g in zip(outputs, grad_outputs) if o.requires_grad]
            inputs = [b for b in blocks if b.requires_grad] + ([shared] if shared_wanted else [])
            block_grads = torch.autograd.grad(
                [o for o, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True, materialize_grads=True
            )
            for grad, block_grad in zip((g for g in grads if g is not None), block_grads):
                grad.index_copy_(0, rows, block_grad)
            if shared_wanted:
                shared_grad += block_grads[-1]
            start += len(rows)
        return None, None, None, shared_grad, *grads


class TileIntersections(NamedTuple):
    """(tile, Gaussian) pairs, grouped by tile and sorted front to back within each tile."""

    gauss_ids: Tensor  # [P] flat camera * N + gaussian index
    tile_ids: Tensor  # [P] flat camera * tiles_per_image + tile index, non-decreasing
    tile_offsets: Tensor  # [C * tiles_per_image] first pair of each tile
    tile_counts: Tensor  # [C * tiles_per_image] number of pairs of each tile


def _min_sigma_over_tiles(x0: Tensor, y0: Tensor, x1: Tensor, y1: Tensor, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Minimum of ``sigma(dx, dy) = (a dx^2 + 2 b dx dy + c dy^2) / 2`` over ``[x0, x1] x [y0, y1]``.

    All arguments are [P]: the rectangle is a tile's pixel centres relative to a Gaussian's
    centre, ``(a, b, c)`` its conic. Returns [P].
    """
    edges = []
    for x in x0, x1:  # vertical edges: best dy for this dx
        dy = torch.minimum(torch.maximum(b * x / -c, y0), y1)
        edges.append((a * x * x + c * dy * dy) * 0.5 + b * x * dy)
    for y in y0, y1:  # horizontal edges: best dx for this dy
        dx = torch.minimum(torch.maximum(b * y / -a, x0), x1)
        edges.append((a * dx * dx + c * y * y) * 0.5 + b * dx * y)
    sigma = torch.minimum(torch.minimum(edges[0], edges[1]), torch.minimum(edges[2], edges[3]))
    inside = (x0 <= 0) & (x1 >= 0) & (y0 <= 0) & (y1 >= 0)
    return sigma.masked_fill_(inside, 0.0)


@torch.no_grad()
def intersect_tiles(
    means2d: Tensor,  # [C, N, 2]
    conics: Tensor,  # [C, N, 3]
    log_opacities: Tensor,  # [C, N]
    radii: Tensor,  # [C, N, 2]
    depths: Tensor,  # [C, N]
    tile_size: int,
    tiles_x: int,
    tiles_y: int,
) -> TileIntersections:
    """List, for every tile of every camera, the visible Gaussians that reach alpha 1/255 in it.

    Candidates are the tiles overlapping a Gaussian's bounding box; of those, tiles where the
    Gaussian's alpha stays below 1/255 at every pixel centre (the ellipse misses the tile) are
    dropped, which does not change the image. Within a tile, pairs are sorted by depth (as
    float32; ties keep Gaussian order).
    """
    n_cams, n = depths.shape
    vis = (radii > 0).any(-1).flatten().nonzero().squeeze(1)  # [V] flat ids
    # The candidates of INTERSECT_CHUNK Gaussians at a time: their temporaries are several times the pairs kept.
    pairs = [
        _reached_tiles(ids, means2d, conics, log_opacities, radii, tile_size, tiles_x, tiles_y)
        for ids in vis.split(INTERSECT_CHUNK)
    ]
    flat_ids = torch.cat([ids for ids, _ in pairs])  # [P]
    tiles_per_image = tiles_x * tiles_y
    tile_ids = torch.div(flat_ids, n, rounding_mode="floor") * tiles_per_image + torch.cat([t for _, t in pairs])
    # Bits of positive float32 depths sort like the depths: one integer sort orders both keys.
    depth_bits = depths.detach().float().reshape(-1).index_select(0, flat_ids).view(torch.int32).long()
    order = torch.sort(tile_ids * 2**32 + depth_bits, stable=True)[1]
    tile_ids = tile_ids.index_select(0, order)
    tile_counts = torch.bincount(tile_ids, minlength=n_cams * tiles_per_image)
    return TileIntersections(
        gauss_ids=flat_ids.index_select(0, order),
        tile_ids=tile_ids,
        tile_offsets=torch.cumsum(tile_counts, 0) - tile_counts,
        tile_counts=tile_counts,
    )


def _reached_tiles(
    vis: Tensor,  # [V] flat camera * N + gaussian ids of visible Gaussians
    means2d: Tensor,  # [C, N, 2]
    conics: Tensor,  # [C, N, 3]
    log_opacities: Tensor,  # [C, N]
    radii: Tensor,  # [C, N, 2]
    tile_size: int,
    tiles_x: int,
    tiles_y: int,
) -> tuple[Tensor, Tensor]:
    """The (flat id, tile index in its image) pairs of `intersect_tiles` for the Gaussians ``vis``, [P] each,
    in the order of ``vis`` and, per Gaussian, row by row through its bounding box."""
    device = vis.device
    # Per visible Gaussian, 1-D contiguous columns: ops on strided columns are slow on CPU.
    cx, cy = (v.detach().reshape(-1).index_select(0, vis) for v in means2d.unbind(-1))  # [V]
    rx, ry = (v.reshape(-1).index_select(0, vis).to(cx.dtype) for v in radii.unbind(-1))
    lo_x = torch.floor((cx - rx) / tile_size).clamp_(0, tiles_x)
    lo_y = torch.floor((cy - ry) / tile_size).clamp_(0, tiles_y)
    width = torch.ceil((cx + rx) / tile_size).clamp_(0, tiles_x) - lo_x
    height = torch.ceil((cy + ry) / tile_size).clamp_(0, tiles_y) - lo_y
    counts = (width * height).long()  # [V]
    # Enumerate candidate tiles in float arithmetic (exact for these small integers; fast on CPU).
    src = torch.repeat_interleave(torch.arange(len(vis), device=device), counts)  # [P0]
    first = torch.cumsum(counts, 0) - counts
    local = (torch.arange(len(src), device=device) - first.index_select(0, src)).to(cx.dtype)
    width = width.index_select(0, src)
    row = torch.floor(local / width)
    tile_x = lo_x.index_select(0, src) + local - row * width  # [P0]
    tile_y = lo_y.index_select(0, src) + row

    flat_ids = vis.index_select(0, src)
    x0 = tile_x * tile_size + 0.5 - cx.index_select(0, src)
    y0 = tile_y * tile_size + 0.5 - cy.index_select(0, src)
    a, b, c = (v.detach().reshape(-1).index_select(0, flat_ids) for v in conics.unbind(-1))
    min_sigma = _min_sigma_over_tiles(x0, y0, x0 + (tile_size - 1), y0 + (tile_size - 1), a, b, c)
    log_alpha_max = log_opacities.detach().reshape(-1).index_select(0, flat_ids) - min_sigma
    # The small margin guarantees that no pair whose alpha reaches 1/255 is dropped.
    reach = (log_alpha_max >= math.log(ALPHA_MIN) - 1e-4).nonzero().squeeze(1)
    tiles = tile_y.index_select(0, reach).long() * tiles_x + tile_x.index_select(0, reach).long()
    return flat_ids.index_select(0, reach), tiles


class _Chunk(NamedTuple):
    """Tiles ``tile_start : tile_start + n_tiles`` of a `_Layout`, each with ``n_slots`` slots, composited
    ``segment_slots`` slots at a time front to back (fewer than ``n_slots`` only for a tile too long for one go)."""

    tile_start: int
    n_tiles: int
    n_slots: int
    slot_start: int  # first slot of the chunk in the flat slot list
    segment_slots: int

    def segments(self) -> list[tuple[int, int]]:
        """``(first, end)`` slot ranges of the segments, front to back."""
        return [(k, min(k + self.segment_slots, self.n_slots)) for k in range(0, self.n_slots, self.segment_slots)]


class _Layout(NamedTuple):
    """Non-empty tiles in chunks; every tile of a chunk is padded to the chunk's longest list."""

    tiles: Tensor  # [T] tile ids, in chunk order
    slot_gauss: Tensor  # [E] flat Gaussian id of each slot (tile-major, front to back); 0 if padding
    slot_tile: Tensor  # [E] tile id of each slot
    padding: Tensor  # [E] bool, True for padding slots
    chunks: list[_Chunk]


def _plan_layout(isect: TileIntersections, tile_pixels: int, max_elements: int) -> _Layout:
    """Group non-empty tiles (longest lists first) into chunks of at most ``max_elements``
    slot-pixel entries, or one tile where a single tile exceeds that (composited in segments of that size)."""
    counts, tiles = torch.sort(isect.tile_counts, descending=True, stable=True)
    n_nonempty = int((counts > 0).sum())
    counts_list = counts[:n_nonempty].tolist()
    chunks, slots_per_tile = [], []
    start, n_slots = 0, 0
    while start < n_nonempty:
        k = counts_list[start]  # the longest list of the chunk
        n_tiles = min(n_nonempty - start, max(1, max_elements // (k * tile_pixels)))
        chunks.append(_Chunk(start, n_tiles, k, n_slots, min(k, max(1, max_elements // tile_pixels))))
        slots_per_tile += [k] * n_tiles
        start += n_tiles
        n_slots += n_tiles * k
    tiles = tiles[:n_nonempty]
    device = tiles.device
    slots_per_tile = torch.tensor(slots_per_tile, dtype=torch.long, device=device)
    tile_of_slot = torch.repeat_interleave(tiles, slots_per_tile)  # [E]
    first_slot = torch.cumsum(slots_per_tile, 0) - slots_per_tile
    rank = torch.arange(n_slots, device=device) - torch.repeat_interleave(first_slot, slots_per_tile)
    padding = rank >= isect.tile_counts.index_select(0, tile_of_slot)
    pair = (isect.tile_offsets.index_select(0, tile_of_slot) + rank).masked_fill_(padding, 0)
    return _Layout(tiles, isect.gauss_ids.index_select(0, pair), tile_of_slot, padding, chunks)


def _pixel_basis(tile_size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Monomials ``[1, x, y, x^2, xy, y^2]`` of a tile's pixel centres, relative to the tile
    centre (small values keep the expanded quadratic accurate in float32), [6, S]."""
    c = torch.arange(tile_size, dtype=dtype, device=device) + 0.5 - tile_size / 2
    y, x = torch.meshgrid(c, c, indexing="ij")
    x, y = x.flatten(), y.flatten()
    return torch.stack([torch.ones_like(x), x, y, x * x, x * y, y * y])


def _slot_quadratics(
    means2d: Tensor,  # [C, N, 2]
    conics: Tensor,  # [C, N, 3]
    log_opacities: Tensor,  # [C, N]
    layout: _Layout,
    tile_size: int,
    tiles_x: int,
    tiles_y: int,
) -> Tensor:
    """Per slot, coefficients ``q`` with ``-ln(alpha) = q . basis`` at its tile's pixels, [E, 6].

    ``q . basis`` at a pixel is ``sigma - ln(opacity)`` with ``sigma = d^T conic d / 2`` and
    ``d`` the offset of the pixel centre from the Gaussian centre (see `_pixel_basis`); padding
    slots get a huge offset so that their alpha is exactly 0. Gathers are 1-D ``index_select``
    calls, several times faster than row gathers on CPU.
    """
    n_cams = means2d.shape[0]
    g, dtype = layout.slot_gauss, means2d.dtype
    tile = torch.arange(tiles_x * tiles_y, device=means2d.device)
    centre_x = ((tile % tiles_x).to(dtype) * tile_size + tile_size / 2).repeat(n_cams)  # [C * tiles]
    centre_y = ((tile // tiles_x).to(dtype) * tile_size + tile_size / 2).repeat(n_cams)
    mx, my = (v.reshape(-1).index_select(0, g) for v in means2d.unbind(-1))  # [E] each
    mx = mx - centre_x.index_select(0, layout.slot_tile)  # relative to the tile centre
    my = my - centre_y.index_select(0, layout.slot_tile)
    a, b, c = (v.reshape(-1).index_select(0, g) for v in conics.unbind(-1))
    log_op = log_opacities.reshape(-1).index_select(0, g)
    ax_by = a * mx + b * my
    bx_cy = b * mx + c * my
    q0 = 0.5 * (ax_by * mx + bx_cy * my) - log_op + layout.padding.to(dtype) * _SKIP
    return torch.stack([q0, -ax_by, -bx_cy, 0.5 * a, b, 0.5 * c], dim=-1)


def _slot_features(colors: Tensor, depths: Tensor, layout: _Layout) -> Tensor:
    """Per slot, the composited features ``[r, g, b, depth, 1]``, [E, 5]."""
    g = layout.slot_gauss
    columns = [v.reshape(-1).index_select(0, g) for v in (*colors.unbind(-1), depths)]
    return torch.stack([*columns, torch.ones_like(columns[0])], dim=-1)


def _blend(
    quads: Tensor, log2_basis: Tensor, alpha_max: float, trans_start: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Alpha, 1 - alpha and blend weights of a chunk of tiles, each [T, K, S], and the transmittance
    in front of every slot and after the last, [T, K + 1, S].

    Args:
        quads: [T, K, 6] quadratic coefficients, slots sorted front to back.
        log2_basis: [6, S] pixel monomials times ``-log2(e)``, so ``alpha = 2^(quads @ log2_basis)``.
        trans_start: [T, S] transmittance in front of the first slot (None: 1, the front of the list).

    Alpha is 0 where below 1/255 (skipped). Weights are ``alpha_i * prod_{j<i} (1 - alpha_j)``,
    and 0 from the slot that would take the transmittance to 1e-4 or below onwards. Masks are
    built with threshold/sign rather than comparisons, which are several times slower on CPU.
    """
    alpha = torch.matmul(quads, log2_basis).exp2_().clamp_max_(alpha_max)
    F.threshold_(alpha, ALPHA_MIN, 0.0)
    t, k, s = alpha.shape
    one_minus = torch.empty((t, k + 1, s), dtype=alpha.dtype, device=alpha.device)
    one_minus[:, 0] = 1.0 if trans_start is None else trans_start
    torch.sub(1.0, alpha, out=one_minus[:, 1:])
    trans = torch.cumprod(one_minus, dim=1)  # [T, K + 1, S]: trans[:, i] is T before slot i
    weights = alpha * trans[:, :-1]
    weights.mul_(F.threshold(trans[:, 1:], TRANSMITTANCE_MIN, 0.0).sign_())
    return alpha, one_minus[:, 1:], weights, trans


class _BlendTiles(torch.autograd.Function):
    """Front-to-back compositing of slot features over the tiles of a `_Layout`.

    Forward: ``out[tile, :, pixel] = sum_i w_i f_i`` over the tile's slots and, with ``median_depth``, the median
    depth ``median[tile, 0, pixel]``: the depth of the slot across which the transmittance falls from above 1/2 to
    1/2 or below, 0 where it stays above (not differentiable; without ``median_depth``, ``median`` is
    [T, 0, S]). Backward uses
    ``d out / d ln(alpha_i) = w_i f_i - alpha_i / (1 - alpha_i) * sum_{j>i} w_j f_j``, which
    never divides by a transmittance, so gradients stay finite at the 0.99 clamp and the cutoff.
    With ``keep=True`` the per-pixel alphas and weights are kept for backward; otherwise backward
    recomputes them chunk by chunk, so memory stays bounded by one chunk. A chunk composited in
    segments stops after the segment that takes every pixel's transmittance to 1e-4 or below: the
    slots behind it have weight 0 and gradient 0, as gsplat's early termination.
    """

    @staticmethod
    def forward(ctx, quads, feats, chunks, basis, alpha_max, keep, median_depth):
        # quads [E, 6], feats [E, F] per slot; basis [6, S] -> out [T, F, S], median [T, 1 or 0, S]
        log2_basis = basis * -_LOG2_E
        n_tiles = sum(ch.n_tiles for ch in chunks)
        out = feats.new_empty(n_tiles, feats.shape[1], basis.shape[1])
        median = feats.new_zeros(n_tiles, int(median_depth), basis.shape[1])
        composited, kept = [], []  # per chunk: (first, end, transmittance in front) of each segment composited
        for ch in chunks:
            q, f, t0, _ = _chunk_views(quads, feats, ch)
            target, segments, kept_segments = out[t0 : t0 + ch.n_tiles], [], []
            trans = None
            for first, end in ch.segments():
                segments.append((first, end, trans))
                alpha, _, weights, trans_all = _blend(q[:, first:end], log2_basis, alpha_max, trans)
                trans = trans_all[:, -1]
                if first == 0:
                    torch.matmul(f[:, :end].transpose(1, 2), weights, out=target)
                else:
                    target.add_(torch.matmul(f[:, first:end].transpose(1, 2), weights))
                if median_depth:
                    crossing = (trans_all[:, :-1] > MEDIAN_TRANSMITTANCE) & (trans_all[:, 1:] <= MEDIAN_TRANSMITTANCE)
                    depths = f[:, first:end, DEPTH_FEATURE : DEPTH_FEATURE + 1].transpose(1, 2)  # [T, 1, K]
                    median[t0 : t0 + ch.n_tiles].add_(torch.matmul(depths, crossing.to(f.dtype)))
                if keep:
                    kept_segments.append((alpha, weights))
                if end < ch.n_slots and float(trans.max()) <= TRANSMITTANCE_MIN:
                    break  # every pixel is opaque: the slots behind weigh 0
            composited.append(segments)
            if keep:
                kept.append(kept_segments)
        ctx.save_for_backward(quads, feats, basis)
        ctx.chunks, ctx.alpha_max, ctx.composited, ctx.kept = chunks, alpha_max, composited, kept
        ctx.mark_non_differentiable(median)
        return out, median

    @staticmethod
    def backward(ctx, grad_out, grad_median):
        quads, feats, basis = ctx.saved_tensors
        log2_basis = basis * -_LOG2_E
        grad_out = grad_out.contiguous()
        grad_q, grad_f = torch.empty_like(quads), torch.empty_like(feats)
        for c, (ch, segments) in enumerate(zip(ctx.chunks, ctx.composited)):
            kept_segments = ctx.kept[c] if ctx.kept else None  # None once a first backward freed them: recomputed
            q, f, t0, s0 = _chunk_views(quads, feats, ch)
            s1 = s0 + ch.n_tiles * ch.n_slots
            gq = grad_q[s0:s1].view(ch.n_tiles, ch.n_slots, -1)
            gf = grad_f[s0:s1].view(ch.n_tiles, ch.n_slots, -1)
            g = grad_out[t0 : t0 + ch.n_tiles]  # [T, F, S]
            composited_end = segments[-1][1]
            gq[:, composited_end:], gf[:, composited_end:] = 0.0, 0.0  # behind opaque pixels: no gradient
            later = None  # [T, 1, S]: sum of w_j (f_j . g) over the segments behind
            for i in reversed(range(len(segments))):
                first, end, trans_start = segments[i]
                if kept_segments is not None:
                    alpha, weights = kept_segments[i]
                    one_minus = 1.0 - alpha
                else:
                    alpha, one_minus, weights, _ = _blend(q[:, first:end], log2_basis, ctx.alpha_max, trans_start)
                contrib = weights * torch.matmul(f[:, first:end], g)  # [T, K, S]: w_i (f_i . g)
                behind = torch.cumsum(contrib, dim=1)
                total = behind[:, -1:]
                behind = total - behind  # sum over slots j > i of this segment
                if later is not None:
                    behind.add_(later)
                later = total if later is None else total + later
                unclamped = F.threshold_(ctx.alpha_max - alpha, 0.0, 0.0).sign_()  # clamped: no grad
                behind.mul_(alpha.div(one_minus))
                grad_log_alpha = contrib.sub_(behind).mul_(unclamped)  # [T, K, S]
                # ln(alpha) = -q . basis; the transposed products are the fast ones on CPU.
                rows = grad_log_alpha.view(-1, basis.shape[1])
                gq[:, first:end] = torch.matmul(basis, rows.T).T.neg_().view(ch.n_tiles, end - first, -1)
                gf[:, first:end] = torch.matmul(g, weights.transpose(1, 2)).transpose(1, 2)
        ctx.kept = None
        return grad_q, grad_f, None, None, None, None, None


def _chunk_views(quads: Tensor, feats: Tensor, ch: _Chunk) -> tuple[Tensor, Tensor, int, int]:
    """``[T, K, 6]`` and ``[T, K, F]`` views of a chunk's slots, and its first tile and slot."""
    s1 = ch.slot_start + ch.n_tiles * ch.n_slots
    q = quads[ch.slot_start : s1].view(ch.n_tiles, ch.n_slots, -1)
    f = feats[ch.slot_start : s1].view(ch.n_tiles, ch.n_slots, -1)
    return q, f, ch.tile_start, ch.slot_start


def rasterize_tiles(
    means2d: Tensor,  # [C, N, 2]
    conics: Tensor,  # [C, N, 3]
    log_opacities: Tensor,  # [C, N]
    colors: Tensor,  # [C, N, 3]
    depths: Tensor,  # [C, N]
    radii: Tensor,  # [C, N, 2]
    width: int,
    height: int,
    tile_size: int,
    alpha_max: float,
    max_chunk_elements: int,
    max_kept_elements: int,
    median_depth: bool = False,
) -> Tensor:
    """Composite visible Gaussians front to back into ``[C, H, W, 5]`` (``[C, H, W, 6]`` with ``median_depth``).

    The first five channels are ``sum_i w_i f_i`` for ``f = [r, g, b, depth, 1]``: premultiplied colour,
    accumulated depth and alpha (``1 - T``), without background; the sixth is the median depth (see `_BlendTiles`).
    """
    n_cams = depths.shape[0]
    tiles_x, tiles_y = math.ceil(width / tile_size), math.ceil(height / tile_size)
    isect = intersect_tiles(means2d, conics, log_opacities, radii, depths, tile_size, tiles_x, tiles_y)
    layout = _plan_layout(isect, tile_size * tile_size, max_chunk_elements)
    del isect  # its pair lists (16 bytes a pair) are not needed while compositing
    quads = _slot_quadratics(means2d, conics, log_opacities, layout, tile_size, tiles_x, tiles_y)
    feats = _slot_features(colors, depths, layout)  # [E, 5]
    basis = _pixel_basis(tile_size, quads.dtype, quads.device)  # [6, S]
    keep = (
        torch.is_grad_enabled()
        and (quads.requires_grad or feats.requires_grad)
        and quads.shape[0] * basis.shape[1] <= max_kept_elements
    )
    blended, median = _BlendTiles.apply(quads, feats, layout.chunks, basis, alpha_max, keep, median_depth)
    if median_depth:
        blended = torch.cat([blended, median], dim=1)  # [T, 6, S]
    n_channels = blended.shape[1]

    n_tiles = n_cams * tiles_x * tiles_y
    out = blended.new_zeros(n_tiles, n_channels, tile_size * tile_size)
    out = out.index_copy(0, layout.tiles, blended)  # empty tiles stay 0
    out = out.reshape(n_cams, tiles_y, tiles_x, n_channels, tile_size, tile_size)
    out = out.permute(0, 1, 4, 2, 5, 3).reshape(n_cams, tiles_y * tile_size, tiles_x * tile_size, -1)
    return out[:, :height, :width]


@RENDERER_REGISTRY.register("torch")
class TorchRenderer(Renderer):
    """Reference 3DGS renderer in pure PyTorch; see the module docstring."""

    @dataclass
    class Config(RendererConfig):
        tile_size: int = 8  # px; compositing works on tile_size x tile_size pixel blocks
        alpha_max: float = 0.99  # per-Gaussian alpha clamp (3DGS: 0.99; gsplat 1.5: 0.999)
        max_chunk_elements: int = 1 << 16  # (slot x pixel) entries composited at once (cache-sized)
        # Up to this many (slot x pixel) entries per render, forward keeps alphas and weights for
        # backward (8 bytes each); above it, backward recomputes them (slower, bounded memory).
        max_kept_elements: int = 1 << 24
        # Up to max_kept_gaussians rendered Gaussians, projection and colours run on all of them at once and
        # forward keeps their intermediates for backward (~0.6 kB each); above it, they run max_chunk_gaussians
        # at a time and backward recomputes them chunk by chunk (a second projection, bounded memory).
        max_chunk_gaussians: int = 1 << 16
        max_kept_gaussians: int = 1 << 18
        # Before projecting, drop the Gaussians that cannot be visible (`cull_gaussians`): same
        # image and gradients, cost proportional to the visible ones at millions of Gaussians.
        cull: bool = True

        def __post_init__(self) -> None:
            super().__post_init__()
            if not ALPHA_MIN < self.alpha_max < 1.0:
                raise ValueError(f"renderer alpha_max={self.alpha_max} must be in (1/255, 1)")
            if self.max_chunk_elements < 1:
                raise ValueError(f"renderer max_chunk_elements={self.max_chunk_elements} must be >= 1")
            if self.max_kept_elements < 0:
                raise ValueError(f"renderer max_kept_elements={self.max_kept_elements} must be >= 0")
            if self.max_chunk_gaussians < 1:
                raise ValueError(f"renderer max_chunk_gaussians={self.max_chunk_gaussians} must be >= 1")
            if self.max_kept_gaussians < 0:
                raise ValueError(f"renderer max_kept_gaussians={self.max_kept_gaussians} must be >= 0")

    def __init__(self, cfg: TorchRenderer.Config | None = None) -> None:
        self.cfg = cfg if cfg is not None else TorchRenderer.Config()

    def _render(
        self, params: Mapping[str, Tensor], cameras: Cameras, sh_degree: int, backgrounds: Tensor
    ) -> RenderOutput:
        cfg = self.cfg
        viewmats, width, height = cameras.viewmats, cameras.width, cameras.height
        n_cams, n = viewmats.shape[0], params["means"].shape[0]
        rows = [params[key] for key in PARAM_NAMES]
        ids = None  # [M] ids of the Gaussians rendered, None for all of them
        if cfg.cull:
            ids = cull_gaussians(
                params["means"].detach(), params["scales"].detach(), F.logsigmoid(params["opacities"].detach()),
                cameras, cfg,
            )  # fmt: skip
            if len(ids) == n:
                ids = None

        def shade(rows: Sequence[Tensor], viewmats: Tensor) -> tuple[Tensor, ...]:
            """`shade_gaussians` through ``cameras`` at the poses ``viewmats`` (`_RowChunks`' shared input)."""
            return shade_gaussians(rows, cameras.with_viewmats(viewmats), sh_degree, cfg)

        if (n if ids is None else len(ids)) <= cfg.max_kept_gaussians:
            # index_select's backward scatters into full-size gradients: culled Gaussians get exact zeros.
            shaded = shade(rows if ids is None else [t.index_select(0, ids) for t in rows], viewmats)
        else:  # as do _RowChunks' gradients
            all_ids = torch.arange(n, device=viewmats.device) if ids is None else ids
            shaded = _RowChunks.apply(shade, all_ids, cfg.max_chunk_gaussians, viewmats, *rows)
        proj, colors = Projection(*shaded[:5]), shaded[5]  # colors [C, M, 3]
        means2d, radii = proj.means2d, proj.radii  # [C, M, 2] each
        if ids is not None:  # full-size [C, N, 2] for the strategy; culled rows are 0
            means2d = means2d.new_zeros(n_cams, n, 2).index_copy(1, ids, means2d)
            radii = radii.new_zeros(n_cams, n, 2).index_copy_(1, ids, radii)
        if means2d.requires_grad:
            means2d.retain_grad()

        out = rasterize_tiles(
            means2d if ids is None else means2d.index_select(1, ids), proj.conics, proj.log_opacities,
            colors, proj.depths, proj.radii, width, height, cfg.tile_size, cfg.alpha_max,
            cfg.max_chunk_elements, cfg.max_kept_elements, cfg.median_depth,
        )  # fmt: skip  # [C, H, W, 5 or 6]
        alpha = out[..., 4:5]
        image = out[..., :3] + (1.0 - alpha) * backgrounds[:, None, None, :]
        depth = torch.where(alpha > 0, out[..., 3:4] / alpha.clamp_min(1e-10), 0.0)
        depths = proj.depths  # [C, M]
        if ids is not None:
            depths = depths.new_zeros(n_cams, n).index_copy(1, ids, depths)  # culled: 0
        info = {
            "means2d": means2d,
            "radii": radii,
            "depths": depths,
            "width": width,
            "height": height,
            "n_cameras": viewmats.shape[0],
            "gaussian_ids": None,  # dense info; gsplat's packed mode lists the visible pairs' ids here
        }
        median_depth = out[..., 5:6].detach() if cfg.median_depth else None
        return RenderOutput(image=image, alpha=alpha, depth=depth, info=info, median_depth=median_depth)
