"""Smooth camera paths for fly-through videos, fitted to a scene's training cameras.

All functions take and return world-to-camera ``viewmats [N, 4, 4]`` in the convention of
:mod:`gsrecon.cameras.cameras`; returned rotations are orthonormal with determinant +1. The world
"up" of a capture is the mean of the cameras' up vectors (their -y axes).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from gsrecon.errors import InputError
from gsrecon.geometry import camera_centers, look_at, quat_to_rotmat, rotmat_to_quat


def focus_point(viewmats: Tensor, points: Tensor | None = None) -> Tensor:
    """The point the cameras look at, ``[3]``: the least-squares nearest point to all optical axes.

    For forward-facing captures, whose optical axes are (nearly) parallel, it is instead the point on
    the mean viewing axis at the median depth of ``points [P, 3]`` (e.g. the SfM points) in front of
    the cameras.

    Raises:
        ValueError: the axes are parallel and no points in front of the cameras were given.
    """
    vm = viewmats.double()
    centers = camera_centers(vm)  # [N, 3]
    dirs = vm[:, 2, :3]  # [N, 3] optical axes (camera z in world)
    proj = torch.eye(3, dtype=vm.dtype, device=vm.device) - dirs[:, :, None] * dirs[:, None, :]  # [N, 3, 3]
    A = proj.sum(0)  # [3, 3]
    if torch.linalg.eigvalsh(A / len(vm))[0] >= 1e-4:
        b = (proj @ centers[:, :, None]).sum(0)  # [3, 1]
        return torch.linalg.solve(A, b)[:, 0].to(viewmats.dtype)
    mean_center, forward = centers.mean(0), _normalize(dirs.mean(0))
    depths = (points.to(vm) - mean_center) @ forward if points is not None else vm.new_zeros(0)  # [P]
    depths = depths[depths > 0]
    if len(depths) == 0:
        raise InputError(
            "the cameras' optical axes are (nearly) parallel and there are no scene points in front "
            "of them to place the focus point"
        )
    return (mean_center + depths.median() * forward).to(viewmats.dtype)


def ellipse_path(viewmats: Tensor, n_frames: int = 120, focus: Tensor | None = None) -> Tensor:
    """A closed elliptical orbit around the scene, at the cameras' mean height, looking at the focus point.

    As in Mip-NeRF 360: the ellipse lies in the plane orthogonal to the mean camera up vector, is
    centred above/below the focus point (default: ``focus_point(viewmats)``), has its axes along the
    principal directions of the camera positions and semi-axes at the 90th percentile of their
    distances. The orbit starts near the first camera and runs counter-clockwise around up.
    Returns ``[n_frames, 4, 4]`` in the dtype/device of ``viewmats``.
    """
    vm = viewmats.detach().cpu().double()
    target = focus_point(vm) if focus is None else focus.detach().cpu().double()  # [3]
    centers = camera_centers(vm)  # [N, 3]
    up = mean_up(vm)  # [3]
    height = (centers @ up).mean()
    origin = target + (height - target @ up) * up  # [3] ellipse centre, at the cameras' mean height
    axis_a, axis_b = _plane_basis(up)
    planar = torch.stack([(centers - origin) @ axis_a, (centers - origin) @ axis_b], dim=1)  # [N, 2]
    _, principal = torch.linalg.eigh(planar.T @ planar)  # [2, 2] columns: minor, major
    axis_1 = principal[0, 1] * axis_a + principal[1, 1] * axis_b  # [3] major axis
    axis_2 = torch.linalg.cross(up, axis_1)  # [3] so that (axis_1, axis_2, up) is right-handed
    coords = torch.stack([(centers - origin) @ axis_1, (centers - origin) @ axis_2], dim=1)  # [N, 2]
    radii = torch.quantile(coords.abs(), 0.9, dim=0)  # [2]
    start = torch.atan2(coords[0, 1] / radii[1], coords[0, 0] / radii[0])
    theta = start + torch.arange(n_frames, dtype=vm.dtype) * (2 * math.pi / n_frames)  # [F]
    positions = origin + radii[0] * theta.cos()[:, None] * axis_1 + radii[1] * theta.sin()[:, None] * axis_2
    return look_at(positions, target, up).to(viewmats)


def spiral_path(
    viewmats: Tensor,
    n_frames: int = 120,
    n_rotations: float = 2.0,
    z_rate: float = 0.5,
    focus: Tensor | None = None,
) -> Tensor:
    """A spiral around the mean camera, for forward-facing captures (as in LLFF / Mip-NeRF 360).

    Positions circle the mean camera centre in its image plane (radii: 90th percentile of the camera
    offsets along the mean camera's x and y axes), moving back and forth along its viewing axis at
    ``z_rate`` times the circling rate, ``n_rotations`` times in all; every frame looks at the focus
    point (default: ``focus_point(viewmats)``). Returns ``[n_frames, 4, 4]``.
    """
    vm = viewmats.detach().cpu().double()
    target = focus_point(vm) if focus is None else focus.detach().cpu().double()  # [3]
    centers = camera_centers(vm)  # [N, 3]
    mean_center = centers.mean(0)  # [3]
    up = mean_up(vm)  # [3]
    forward = _normalize(vm[:, 2, :3].mean(0))  # [3]
    right = _normalize(torch.linalg.cross(forward, up))  # [3]
    down = torch.linalg.cross(forward, right)  # [3]
    axes = torch.stack([right, down, forward])  # [3, 3] rows: mean camera axes in world
    radii = torch.quantile(((centers - mean_center) @ axes.T).abs(), 0.9, dim=0)  # [3]
    theta = torch.arange(n_frames, dtype=vm.dtype) * (2 * math.pi * n_rotations / n_frames)  # [F]
    offsets = torch.stack([theta.cos(), -theta.sin(), -(theta * z_rate).sin()], dim=1) * radii  # [F, 3] camera frame
    positions = mean_center + offsets @ axes  # [F, 3]
    return look_at(positions, target, up).to(viewmats)


def interp_path(viewmats: Tensor, n_frames: int) -> Tensor:
    """A smooth path through the given poses, in the given order (e.g. sorted by image name).

    Positions and rotations (as sign-aligned unit quaternions, renormalised) follow uniform
    Catmull-Rom splines with one segment per pair of consecutive poses. Frame ``k`` sits at spline
    parameter ``k * (N - 1) / (n_frames - 1)``, so the first and last frames are the first and last
    poses, and pose ``i`` is reproduced at frame ``i * (n_frames - 1) / (N - 1)`` when that is an
    integer. Returns ``[n_frames, 4, 4]``.
    """
    if len(viewmats) < 2 or n_frames < 2:
        raise InputError(f"interp_path needs at least 2 poses and 2 frames, got {len(viewmats)} and {n_frames}")
    vm = viewmats.detach().cpu().double()
    c2w_rot = vm[:, :3, :3].transpose(1, 2)  # [N, 3, 3]
    quats = rotmat_to_quat(c2w_rot)  # [N, 4]
    for i in range(1, len(quats)):  # q and -q are the same rotation: take the one nearer the previous
        if quats[i] @ quats[i - 1] < 0:
            quats[i] = -quats[i]
    keys = torch.cat([camera_centers(vm), quats], dim=1)  # [N, 7]
    t = torch.arange(n_frames, dtype=vm.dtype) * (len(vm) - 1) / (n_frames - 1)  # [F] exact at integers
    values = _catmull_rom(keys, t)  # [F, 7]
    rotations = quat_to_rotmat(values[:, 3:]).transpose(1, 2)  # [F, 3, 3] world-to-camera
    out = torch.eye(4, dtype=vm.dtype).repeat(n_frames, 1, 1)
    out[:, :3, :3] = rotations
    out[:, :3, 3] = -(rotations @ values[:, :3, None])[:, :, 0]
    return out.to(viewmats)


def _catmull_rom(keys: Tensor, t: Tensor) -> Tensor:
    """Uniform Catmull-Rom spline through ``keys [N, D]`` (key i at parameter i), evaluated at ``t [F]``."""
    padded = torch.cat([2 * keys[:1] - keys[1:2], keys, 2 * keys[-1:] - keys[-2:-1]])  # [N+2, D] end tangents
    segment = t.floor().long().clamp(max=len(keys) - 2)  # [F]
    u = (t - segment)[:, None]  # [F, 1]
    p0, p1, p2, p3 = (padded[segment + k] for k in range(4))  # [F, D] each
    return 0.5 * (2 * p1 + (p2 - p0) * u + (2 * p0 - 5 * p1 + 4 * p2 - p3) * u**2 + (3 * p1 - p0 - 3 * p2 + p3) * u**3)


def mean_up(viewmats: Tensor) -> Tensor:
    """Unit mean of the cameras' up vectors (-y axes) in world coordinates, ``[3]``."""
    return _normalize(-viewmats[:, 1, :3].mean(0))


def _plane_basis(normal: Tensor) -> tuple[Tensor, Tensor]:
    """Two unit vectors spanning the plane orthogonal to unit ``normal [3]``."""
    helper = torch.zeros_like(normal)
    helper[normal.abs().argmin()] = 1.0
    a = _normalize(torch.linalg.cross(normal, helper))
    return a, torch.linalg.cross(normal, a)


def _normalize(x: Tensor) -> Tensor:
    return F.normalize(x, dim=-1)


CAMERA_PATHS = {"ellipse": ellipse_path, "spiral": spiral_path, "interp": interp_path}  # gsrecon render --path
