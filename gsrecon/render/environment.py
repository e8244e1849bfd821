"""The environment behind the Gaussians: a colour for every viewing direction (a sky, a far background), drawn where
the Gaussians' accumulated opacity leaves room.

An environment is a cube map: six square faces of ``R x R`` RGB texels, one per axis direction (+x, -x, +y, -y, +z,
-z), read bilinearly within a face (:func:`cube_lookup`). A pixel's colour is the renderer's image plus what its
opacity lets through of the environment seen along the pixel's ray, ``image + (1 - alpha) (env(d) - background)``
(:func:`composite`): the renderer composited its background there, which the environment replaces. Every renderer
returns ``alpha`` with its gradient, so the same code serves all of them, outside the rasterisers. The rays go
through each camera's lens (:func:`~gsrecon.cameras.rays.camera_rays`: pinhole or fisheye).

A trained environment is a :class:`Sky`: its cube map and its horizon, drawn along any directions by one function
(:meth:`Sky.draw`), which a run's renders, a viewer's baked cube map (:meth:`Sky.baked`) and the far sphere of the
formats that hold only Gaussians (:func:`far_sphere_gaussians`: one flat, opaque Gaussian per texel, facing the
centre, of the baked colours) all go through.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

from gsrecon.render.base import RenderOutput
from gsrecon.sh import rgb_to_sh

HORIZON_BAND = 0.1  # radians (about 6 degrees) over which the environment fades in above the horizon

# Face f looks along _FACE_AXES[f]; a direction on it is axis + s * first tangent + t * second tangent, s, t in [-1, 1].
_FACE_AXES = ((0, 1, 2), (0, 1, 2), (1, 2, 0), (1, 2, 0), (2, 0, 1), (2, 0, 1))  # (axis, tangent s, tangent t)
_FACE_SIGNS = (1.0, -1.0, 1.0, -1.0, 1.0, -1.0)


def cube_faces(directions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Where unit ``directions`` [..., 3] meet the cube: the face [...] (int64, 0..5) and its coordinates s, t [...]
    in [-1, 1]."""
    major = directions.abs().argmax(dim=-1)  # [...]
    positive = directions.gather(-1, major[..., None])[..., 0] >= 0.0
    face = 2 * major + (~positive).long()
    axes = torch.tensor(_FACE_AXES, device=directions.device)[face]  # [..., 3]
    along = directions.gather(-1, axes).unbind(-1)  # axis, s, t components [...] each
    depth = along[0].abs().clamp_min(1e-12)
    return face, (along[1] / depth).clamp(-1.0, 1.0), (along[2] / depth).clamp(-1.0, 1.0)


def cube_lookup(texture: Tensor, directions: Tensor) -> Tensor:
    """The colours [..., 3] of the cube map ``texture`` [6, R, R, 3] seen along unit ``directions`` [..., 3]: bilinear
    within a face (texel centres at ``(i + 0.5) / R`` of the face), clamped at its edges. Differentiable in
    ``texture``."""
    res = texture.shape[1]
    face, s, t = cube_faces(directions)
    flat = texture.reshape(-1, 3)  # [6 R R, 3]

    def corners(coord: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        pixel = ((coord + 1.0) * 0.5 * res - 0.5).clamp(0.0, res - 1.0)
        low = pixel.floor().long()
        return low, (low + 1).clamp_max(res - 1), (pixel - low)[..., None]

    i0, i1, wi = corners(s)  # column
    j0, j1, wj = corners(t)  # row
    base = face * res * res
    top = flat[base + j0 * res + i0] * (1.0 - wi) + flat[base + j0 * res + i1] * wi
    bottom = flat[base + j1 * res + i0] * (1.0 - wi) + flat[base + j1 * res + i1] * wi
    return top * (1.0 - wj) + bottom * wj


def texel_coverage(res: int, directions: Tensor) -> Tensor:
    """[6, R, R] how much :func:`cube_lookup` reads each texel of an ``R`` x ``R`` cube map along unit
    ``directions`` [..., 3]: the sum of its bilinear weights (0 for a texel none of them reads)."""
    texture = torch.zeros(6, res, res, 3, device=directions.device, requires_grad=True)
    with torch.enable_grad():
        (weights,) = torch.autograd.grad(cube_lookup(texture, directions.detach())[..., 0].sum(), texture)
    return weights[..., 0]


def texel_directions(res: int, device: torch.device | str = "cpu") -> Tensor:
    """[6, R, R, 3] unit directions through the centres of a cube map's texels (where :func:`cube_lookup` reads
    each texel alone)."""
    coords = (torch.arange(res, dtype=torch.float32, device=device) + 0.5) / res * 2.0 - 1.0  # [R]
    t, s = torch.meshgrid(coords, coords, indexing="ij")  # [R, R]: row t, column s
    faces = []
    for (axis, first, second), sign in zip(_FACE_AXES, _FACE_SIGNS):
        direction = torch.zeros(res, res, 3, device=device)
        direction[..., axis] = sign
        direction[..., first] = s
        direction[..., second] = t
        faces.append(direction)
    directions = torch.stack(faces)
    return directions / directions.norm(dim=-1, keepdim=True)


def above_horizon(rays: Tensor, up: Tensor) -> Tensor:
    """[..., 1] how much of each unit ray [..., 3] is above the horizon of ``up`` [3]: 1 above, 0 below, a ramp
    over :data:`HORIZON_BAND` radians about it (the environment's edge, not a seam); 1 everywhere for a zero
    ``up``."""
    if not bool(up.any()):
        return torch.ones_like(rays[..., :1])
    return (0.5 + (rays @ up)[..., None] / HORIZON_BAND).clamp(0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class Sky:
    """An environment as state: what a run draws behind its Gaussians, and how (:meth:`draw`)."""

    colors: Tensor  # [6, R, R, 3] the cube map's colours in [0, 1] (differentiable where a run trains them)
    up: Tensor | None = None  # [3] world up: drawn only above its horizon (a zero up: not yet known); None: everywhere

    def above(self, directions: Tensor) -> Tensor | None:
        """[..., 1] the share of the sky along unit ``directions`` [..., 3] (:func:`above_horizon`); None where it
        is drawn everywhere."""
        return None if self.up is None else above_horizon(directions, self.up.to(directions))

    def draw(self, directions: Tensor, background: Tensor) -> Tensor:
        """[..., 3] the colours seen along unit ``directions`` [..., 3]: the cube map (:func:`cube_lookup`), and below
        the horizon the ``background`` (broadcast against [..., 3])."""
        environment = cube_lookup(self.colors.to(directions.device), directions.to(self.colors.dtype))
        sky = self.above(directions)
        if sky is None:
            return environment
        return sky * environment + (1.0 - sky) * background.to(environment)

    def baked(self, background: Tensor) -> Tensor:
        """[6, R, R, 3] the sky drawn (:meth:`draw`) through the centres of its texels over ``background`` [3]: the
        cube map a viewer and the far sphere show, the horizon in its texels."""
        return self.draw(texel_directions(self.colors.shape[1], self.colors.device), background)

    def detach(self) -> Sky:
        """The same sky without its gradient."""
        return Sky(self.colors.detach(), None if self.up is None else self.up.detach())


def composite(out: RenderOutput, environment: Tensor, backgrounds: Tensor) -> RenderOutput:
    """``out`` with the ``environment`` [C, H, W, 3] (its colour along each pixel's ray) drawn where the accumulated
    opacity leaves room, in place of the ``backgrounds`` [C, 3] the renderer drew there; differentiable in both and
    in ``out.alpha``. Depth, alpha and the densification info are the Gaussians' alone."""
    room = 1.0 - out.alpha  # [C, H, W, 1]
    image = out.image + room * (environment - backgrounds[:, None, None, :])
    return dataclasses.replace(out, image=image)


def far_sphere_gaussians(colors: Tensor, center: Tensor, radius: float, opacity: float = 0.99) -> dict[str, Tensor]:
    """The environment of cube-map ``colors`` [6, R, R, 3] (in [0, 1]) as Gaussians on the sphere of ``radius`` about
    ``center`` [3], for formats that hold only Gaussians: one per texel, at its direction, flat (thin along the ray)
    and as wide as the texel seen from the centre, facing it, of the texel's colour (degree-0 SH) and ``opacity``.

    Returns parameters in the model's pre-activation form (:mod:`gsrecon.params`): ``means`` [N, 3], ``scales`` [N,
    3] (log), ``quats`` [N, 4] (w, x, y, z), ``opacities`` [N] (logit), ``sh0`` [N, 1, 3], ``shN`` [N, 0, 3]; N = 6
    R^2.
    """
    if not radius > 0.0 or not math.isfinite(radius):
        raise ValueError(f"far sphere radius must be a finite number > 0, got {radius!r}")
    if not 0.0 < opacity < 1.0:
        raise ValueError(f"far sphere opacity must be in (0, 1), got {opacity!r}")
    res = colors.shape[1]
    directions = texel_directions(res, colors.device).reshape(-1, 3)  # [N, 3]
    # A texel spans 2 / R of its face, whose point at (s, t) lies sqrt(1 + s^2 + t^2) = 1 / max|d| from the centre
    # and is seen obliquely: about 2 / R / distance^1.5 radians wide. Half that as the Gaussian's extent (its
    # standard deviation) keeps neighbours overlapping smoothly.
    cube_distance = 1.0 / directions.abs().amax(dim=-1)  # [N]
    width = radius * (2.0 / res) / cube_distance**1.5 * 0.5  # [N]
    means = center.to(directions)[None] + radius * directions
    scales = torch.stack([width, width, width * 1e-3], dim=-1).log()  # [N, 3]: flat along its local z
    quats = _rotation_to(directions)  # local z onto the ray
    logit = math.log(opacity / (1.0 - opacity))
    return {
        "means": means,
        "scales": scales,
        "quats": quats,
        "opacities": torch.full((len(means),), logit, device=colors.device),
        "sh0": rgb_to_sh(colors.reshape(-1, 3).clamp(0.0, 1.0))[:, None, :],
        "shN": colors.new_zeros(len(means), 0, 3),
    }


def _rotation_to(directions: Tensor) -> Tensor:
    """[N, 4] unit quaternions (w, x, y, z) rotating +z onto the unit ``directions`` [N, 3] (about the axis z x d)."""
    z = torch.tensor([0.0, 0.0, 1.0], device=directions.device).expand_as(directions)
    axis = torch.cross(z, directions, dim=-1)  # [N, 3]
    cos = directions[:, 2]
    w = torch.sqrt(((1.0 + cos) * 0.5).clamp_min(0.0))  # cos(angle / 2)
    sin_half = torch.sqrt(((1.0 - cos) * 0.5).clamp_min(0.0))
    norm = axis.norm(dim=-1, keepdim=True)
    # Opposite to +z the axis is undefined: any axis perpendicular to z (x) turns it round.
    unit_axis = torch.where(norm > 1e-8, axis / norm.clamp_min(1e-12), torch.tensor([1.0, 0.0, 0.0]).to(axis))
    return torch.cat([w[:, None], unit_axis * sin_half[:, None]], dim=-1)
