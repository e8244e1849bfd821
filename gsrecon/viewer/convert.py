"""Conversions between gsrecon's tensors and the arrays viser takes: camera poses, splats, thumbnails.

viser poses a camera by ``wxyz`` (the camera-to-world rotation as a quaternion, w first) and
``position`` (its centre in world coordinates), OpenCV axes (x right, y down, z forward), with a
vertical field of view in radians, which is gsrecon's camera convention as well.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from gsrecon.cameras import Cameras
from gsrecon.geometry import quat_scale_to_factor, quat_to_rotmat, rotmat_to_quat
from gsrecon.sh import sh_to_rgb


@dataclass
class Pose:
    """A camera as viser poses it."""

    wxyz: np.ndarray  # [4] camera-to-world rotation (w, x, y, z)
    position: np.ndarray  # [3] camera centre in world coordinates


@dataclass
class SplatArrays:
    """Activated Gaussians in the layout of viser's ``add_gaussian_splats``."""

    centers: np.ndarray  # [N, 3] float32
    covariances: np.ndarray  # [N, 3, 3] float32
    rgbs: np.ndarray  # [N, 3] float32 in [0, 1], the SH degree-0 colour
    opacities: np.ndarray  # [N, 1] float32 in [0, 1]


def pose_of(viewmat: Tensor) -> Pose:
    """viser's pose of the world-to-camera ``viewmat`` [4, 4]."""
    viewmat = viewmat.detach().double().cpu()
    R_wc = viewmat[:3, :3].T  # [3, 3] camera-to-world rotation
    position = -R_wc @ viewmat[:3, 3]  # [3]
    return Pose(rotmat_to_quat(R_wc[None])[0].numpy(), position.numpy())


def vertical_fov(K: Tensor, height: int) -> float:
    """Vertical field of view in radians of intrinsics ``K`` [3, 3] for an image ``height`` pixels tall."""
    return 2.0 * math.atan(0.5 * height / float(K[1, 1]))


def view_of(pose: Pose, fov: float, aspect: float, max_side: int) -> Cameras:
    """The pinhole camera at ``pose`` with vertical field of view ``fov`` (radians) and width/height
    ``aspect``, its longer image side ``max_side`` pixels, principal point at the image centre."""
    if aspect >= 1.0:
        width, height = max_side, max(1, round(max_side / aspect))
    else:
        width, height = max(1, round(max_side * aspect)), max_side
    R_wc = quat_to_rotmat(torch.as_tensor(pose.wxyz, dtype=torch.float64))  # [3, 3]
    viewmat = torch.eye(4, dtype=torch.float64)
    viewmat[:3, :3] = R_wc.T
    viewmat[:3, 3] = -R_wc.T @ torch.as_tensor(pose.position, dtype=torch.float64)
    focal = 0.5 * height / math.tan(0.5 * fov)
    K = torch.tensor([[focal, 0.0, 0.5 * width], [0.0, focal, 0.5 * height], [0.0, 0.0, 1.0]])
    return Cameras(viewmat.float()[None], K[None], width, height)  # one camera


SPLAT_KEYS = ("means", "scales", "quats", "opacities", "sh0")  # the parameters :func:`splat_arrays` reads


@torch.no_grad()
def splat_arrays(params: Mapping[str, Tensor]) -> SplatArrays:
    """Activate pre-activation Gaussian ``params`` into viser's splat arrays (colours without view dependence)."""
    factor = quat_scale_to_factor(params["quats"].float(), params["scales"].float().exp())  # [N, 3, 3]
    covariances = factor @ factor.transpose(1, 2)  # [N, 3, 3]
    rgbs = sh_to_rgb(params["sh0"][:, 0, :].float()).clamp(0.0, 1.0)  # [N, 3]
    opacities = torch.sigmoid(params["opacities"].float())[:, None]  # [N, 1]
    return SplatArrays(*(t.cpu().numpy() for t in (params["means"].float(), covariances, rgbs, opacities)))


def thumbnail(image: Tensor, max_side: int) -> np.ndarray:
    """``image`` [H, W, 3 or 4] uint8 shrunk to at most ``max_side`` pixels a side, RGB uint8 [h, w, 3]."""
    picture = Image.fromarray(image[..., :3].cpu().numpy())
    picture.thumbnail((max_side, max_side))
    return np.asarray(picture)
