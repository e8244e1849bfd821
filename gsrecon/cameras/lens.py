"""Lens maths: how each camera model maps camera-space points to pixels (see :mod:`gsrecon.cameras.model`).

A pinhole divides by depth: ``(u, v) = (fx x / z + cx, fy y / z + cy)`` (:func:`pinhole_project`). A fisheye lens
is OpenCV's equidistant model: with ``theta`` the angle from the optical axis,
``theta_d = theta (1 + k1 theta^2 + k2 theta^4 + k3 theta^6 + k4 theta^8)`` (:func:`fisheye_polynomial`, numpy or
torch) and the pixel ``(u, v) = (fx x theta_d / r + cx, fy y theta_d / r + cy)`` for a camera-space point
``(x, y, z)`` with ``r = sqrt(x^2 + y^2)``. A frame kept through its lens (``data.fisheye: lens``) is rendered by
projecting each Gaussian's centre with the lens model and its covariance with the model's Jacobian at that centre
(:func:`fisheye_project`: the EWA linearisation that 3DGS applies to the pinhole). Undistorting images to a pinhole
is the image formats' (:mod:`gsrecon.data.formats.lens`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Generic, NamedTuple, TypeVar

import numpy as np
import torch
from torch import Tensor

from gsrecon.cameras.model import CameraModel

Array = TypeVar("Array", np.ndarray, Tensor)


class PinholeProjection(NamedTuple, Generic[Array]):
    """Camera-space points seen through a pinhole (see `pinhole_project`), each field of the points' shape."""

    u: Array  # x / z
    v: Array  # y / z
    pixel_x: Array  # fx u + cx
    pixel_y: Array  # fy v + cy


def pinhole_project(x: Array, y: Array, z: Array, K: Array) -> PinholeProjection[Array]:
    """Pinhole projection of camera-space points ``(x, y, z)`` (z > 0; numpy arrays or torch tensors) through the
    intrinsics ``K``: points [N] each with K [3, 3], or points [C, N] each with K [C, 3, 3]."""
    u, v = x / z, y / z
    fx, fy = K[..., 0, 0, None], K[..., 1, 1, None]  # [1] or [C, 1]
    cx, cy = K[..., 0, 2, None], K[..., 1, 2, None]
    return PinholeProjection(u, v, fx * u + cx, fy * v + cy)


_AXIS_RATIO = 1e-3  # r / z below which the series at the optical axis replaces the exact terms (0 / 0 at r = 0)


class LensProjection(NamedTuple):
    """Fisheye projection of camera-space points and its Jacobian, for ``C`` cameras of ``N`` points."""

    means2d: Tensor  # [C, N, 2] pixel coordinates
    jacobian_u: Tensor  # [C, N, 3] d(u) / d(x, y, z)
    jacobian_v: Tensor  # [C, N, 3] d(v) / d(x, y, z)
    in_lens: Tensor  # [C, N] bool: in front of the camera and inside the angle where the lens model is one-to-one


def fisheye_polynomial(theta: Array, coeffs: Sequence[float | Array]) -> tuple[Array, Array]:
    """(theta_d, d theta_d / d theta) of the fisheye polynomial at the angles ``theta`` (any shape; a numpy array
    or a torch tensor), with ``coeffs`` k1..k4 (numbers, or values that broadcast against ``theta``)."""
    k1, k2, k3, k4 = coeffs
    t2 = theta * theta
    theta_d = theta * (1.0 + t2 * (k1 + t2 * (k2 + t2 * (k3 + t2 * k4))))
    slope = 1.0 + t2 * (3.0 * k1 + t2 * (5.0 * k2 + t2 * (7.0 * k3 + t2 * 9.0 * k4)))
    return theta_d, slope


def _polynomial(theta: Tensor, coeffs: Tensor) -> tuple[Tensor, Tensor]:
    """(theta_d, d theta_d / d theta) of the fisheye polynomial; ``theta`` [C, N], ``coeffs`` [C, 4] (k1..k4)."""
    return fisheye_polynomial(theta, [k[:, None] for k in coeffs.unbind(-1)])  # k1..k4 [C, 1] each


@torch.no_grad()
def max_lens_angle(coeffs: Tensor, samples: int = 2048) -> Tensor:
    """Per camera, the angle from the optical axis (radians, at most pi / 2) up to which ``theta_d`` grows
    with ``theta`` (past it the lens model folds back and points would land twice in the image), [C]."""
    theta = torch.linspace(0.0, math.pi / 2, samples, dtype=coeffs.dtype, device=coeffs.device)  # [S]
    _, slope = _polynomial(theta.expand(len(coeffs), samples), coeffs)  # [C, S]
    folds = slope <= 0.0
    first = torch.where(folds.any(-1), folds.float().argmax(-1), samples - 1)  # [C]
    return theta[first]


def fisheye_project(points: Tensor, Ks: Tensor, coeffs: Tensor, near_plane: float) -> LensProjection:
    """Project camera-space ``points`` [C, N, 3] through the fisheye lenses ``Ks`` [C, 3, 3], ``coeffs`` [C, 4]."""
    x, y, z = points.unbind(-1)  # [C, N] each
    in_front = z > near_plane
    z = torch.where(in_front, z, torch.ones_like(z))  # keeps what is culled finite
    fx, fy = Ks[:, 0, 0, None], Ks[:, 1, 1, None]  # [C, 1]
    cx, cy = Ks[:, 0, 2, None], Ks[:, 1, 2, None]
    r2 = x * x + y * y
    rho2 = r2 + z * z
    near_axis = r2 < (_AXIS_RATIO * z) ** 2
    # On the axis the exact terms are 0 / 0: a stand-in r there keeps the unused branch (and its gradient) finite.
    r2 = torch.where(near_axis, torch.ones_like(r2), r2)
    r = torch.sqrt(r2)
    theta = torch.atan2(r, z)
    theta_d, slope = _polynomial(theta, coeffs)
    k1 = coeffs[:, 0, None]  # [C, 1]
    # scale = theta_d / r, a = (d scale / d x) / x, dz = d scale / d z; on the axis, their series in r / z.
    scale = torch.where(near_axis, 1.0 / z, theta_d / r)
    a = torch.where(near_axis, (2.0 * k1 - 2.0 / 3.0) / z**3, slope * z / (r2 * rho2) - theta_d / (r2 * r))
    dz = torch.where(near_axis, -1.0 / rho2, -slope / rho2)
    means2d = torch.stack([fx * scale * x + cx, fy * scale * y + cy], dim=-1)  # [C, N, 2]
    jacobian_u = fx[..., None] * torch.stack([scale + x * x * a, x * y * a, x * dz], dim=-1)  # [C, N, 3]
    jacobian_v = fy[..., None] * torch.stack([x * y * a, scale + y * y * a, y * dz], dim=-1)
    in_lens = in_front & (near_axis | (theta < max_lens_angle(coeffs)[:, None]))
    return LensProjection(means2d, jacobian_u, jacobian_v, in_lens)


def project_points(points: Tensor, viewmat: Tensor, K: Tensor, model: CameraModel) -> tuple[Tensor, Tensor]:
    """Where one camera sees world ``points`` [P, 3] from the world-to-camera ``viewmat`` [4, 4] through ``K``
    [3, 3] and its ``model`` (a pinhole, or a fisheye lens with coeffs [4]): [P, 3] pixel x, y (centres at +0.5) and
    camera z, and [P] bool, whether each is seen (in front of a pinhole; inside the lens's one-to-one angle)."""
    camera = points @ viewmat[:3, :3].T + viewmat[:3, 3]  # [P, 3]
    if model.kind == "pinhole":
        x, y, z = camera.unbind(-1)  # [P] each
        projection = pinhole_project(x, y, z.clamp_min(1e-6), K)
        pixels, seen = torch.stack([projection.pixel_x, projection.pixel_y], dim=-1), z > 0  # [P, 2], [P]
    else:
        lens = fisheye_project(camera[None], K[None], model.coeffs.to(camera.device)[None], near_plane=0.0)
        pixels, seen = lens.means2d[0], lens.in_lens[0]
    return torch.cat([pixels, camera[:, 2:]], dim=-1), seen


def fisheye_angle(theta_d: Tensor, coeffs: Tensor, iterations: int = 12) -> Tensor:
    """The angles ``theta`` [C, N] from the optical axis whose fisheye polynomial is ``theta_d`` [C, N] (the inverse of
    :func:`fisheye_polynomial` for the lenses ``coeffs`` [C, 4], by Newton's method), clamped to each lens's
    one-to-one angle (:func:`max_lens_angle`)."""
    limit = max_lens_angle(coeffs)[:, None]  # [C, 1]
    theta = torch.minimum(theta_d, limit)
    for _ in range(iterations):
        value, slope = _polynomial(theta, coeffs)
        theta = torch.minimum(theta - (value - theta_d) / slope.clamp_min(1e-6), limit).clamp_min(0.0)
    return theta
