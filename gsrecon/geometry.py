"""Rigid-body geometry shared across gsrecon: rotations, camera centres, look-at poses.

Quaternions are (w, x, y, z); viewmats are world-to-camera 4x4 in the convention of :mod:`gsrecon.cameras.cameras`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def quat_to_rotmat(quats: Tensor) -> Tensor:
    """Rotation matrices ``[..., 3, 3]`` of quaternions ``[..., 4]`` (any non-zero norm; normalised here)."""
    w, x, y, z = F.normalize(quats, dim=-1).unbind(-1)
    return torch.stack(
        [
            1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
            2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
            2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
        ],
        dim=-1,
    ).reshape(*quats.shape[:-1], 3, 3)  # fmt: skip


def quat_scale_to_factor(quats: Tensor, scales: Tensor) -> Tensor:
    """Factor ``M = R(q) diag(s)`` of the 3D covariance ``M M^T``, [N, 3, 3].

    Args:
        quats: rotations (w, x, y, z), any non-zero norm, [N, 4].
        scales: activated (positive) scales, [N, 3].
    """
    return quat_to_rotmat(quats) * scales[:, None, :]


def rotmat_to_quat(R: Tensor) -> Tensor:
    """Rotation matrices ``[N, 3, 3]`` -> unit quaternions ``[N, 4]`` (w, x, y, z), numerically stable."""
    diag = R.diagonal(dim1=1, dim2=2)  # [N, 3]
    squares = torch.stack(  # 4w^2, 4x^2, 4y^2, 4z^2
        [
            1 + diag.sum(1),
            1 + diag[:, 0] - diag[:, 1] - diag[:, 2],
            1 - diag[:, 0] + diag[:, 1] - diag[:, 2],
            1 - diag[:, 0] - diag[:, 1] + diag[:, 2],
        ],
        dim=1,
    )  # [N, 4]
    wx, wy, wz = R[:, 2, 1] - R[:, 1, 2], R[:, 0, 2] - R[:, 2, 0], R[:, 1, 0] - R[:, 0, 1]
    xy, xz, yz = R[:, 1, 0] + R[:, 0, 1], R[:, 0, 2] + R[:, 2, 0], R[:, 2, 1] + R[:, 1, 2]
    candidates = torch.stack(  # row k: 4 q_k q, computed from the largest component k
        [
            torch.stack([squares[:, 0], wx, wy, wz], dim=1),
            torch.stack([wx, squares[:, 1], xy, xz], dim=1),
            torch.stack([wy, xy, squares[:, 2], yz], dim=1),
            torch.stack([wz, xz, yz, squares[:, 3]], dim=1),
        ],
        dim=1,
    )  # [N, 4, 4]
    best = squares.argmax(dim=1)  # [N]
    return F.normalize(candidates[torch.arange(len(R)), best])


def camera_centers(viewmats: Tensor) -> Tensor:
    """Camera positions in world coordinates, ``[..., 3]``, of world-to-camera ``viewmats [..., 4, 4]``."""
    R, t = viewmats[..., :3, :3], viewmats[..., :3, 3]
    return -(R.transpose(-1, -2) @ t[..., None])[..., 0]


def look_at(positions: Tensor, targets: Tensor, up: Tensor) -> Tensor:
    """World-to-camera viewmats ``[F, 4, 4]`` at ``positions [F, 3]`` looking at ``targets [F, 3] | [3]``.

    The image's up direction (-y) is ``up [3]`` projected onto the image plane.

    Raises:
        ValueError: a camera looks along ``up`` (or at its own position), so its roll is undefined.
    """
    offset = targets - positions  # [F, 3]
    forward = F.normalize(offset, dim=-1)  # [F, 3] camera z
    side = torch.linalg.cross(forward, up.expand_as(forward))  # [F, 3]
    if (offset.norm(dim=-1) < 1e-9).any() or (side.norm(dim=-1) < 1e-6).any():
        raise ValueError("look_at: a camera looks straight along the up vector or at its own position")
    right = F.normalize(side, dim=-1)  # [F, 3] camera x
    down = torch.linalg.cross(forward, right)  # [F, 3] camera y
    R = torch.stack([right, down, forward], dim=1)  # [F, 3, 3] rows are the camera axes in world
    viewmats = torch.eye(4, dtype=positions.dtype, device=positions.device).repeat(len(positions), 1, 1)
    viewmats[:, :3, :3] = R
    viewmats[:, :3, 3] = -(R @ positions[:, :, None])[:, :, 0]
    return viewmats
