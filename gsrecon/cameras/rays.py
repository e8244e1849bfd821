"""Camera rays: the world-space direction each pixel of a camera looks along, through its lens."""

from __future__ import annotations

import torch
from torch import Tensor

from gsrecon.cameras.cameras import Cameras
from gsrecon.cameras.lens import fisheye_angle


def camera_rays(cameras: Cameras) -> Tensor:
    """[C, H, W, 3] unit world-space directions of the rays through the centres of the ``cameras``' pixels, through
    each camera's lens (a pinhole, or a fisheye lens: the inverse of its polynomial)."""
    device, dtype = cameras.viewmats.device, cameras.viewmats.dtype
    ys, xs = torch.meshgrid(
        torch.arange(cameras.height, device=device, dtype=dtype) + 0.5,
        torch.arange(cameras.width, device=device, dtype=dtype) + 0.5,
        indexing="ij",
    )  # [H, W] each
    Ks = cameras.Ks.to(dtype)
    x = (xs[None] - Ks[:, 0, 2, None, None]) / Ks[:, 0, 0, None, None]  # [C, H, W]
    y = (ys[None] - Ks[:, 1, 2, None, None]) / Ks[:, 1, 1, None, None]
    if cameras.model.kind == "fisheye":
        theta_d = torch.sqrt(x * x + y * y)  # [C, H, W]
        coeffs = cameras.model.coeffs.to(device, dtype)  # [C, 4]
        theta = fisheye_angle(theta_d.flatten(1), coeffs).view_as(theta_d)
        scale = torch.where(theta_d > 1e-12, torch.sin(theta) / theta_d.clamp_min(1e-12), torch.ones_like(theta))
        local = torch.stack([x * scale, y * scale, torch.cos(theta)], dim=-1)  # [C, H, W, 3]
    else:
        local = torch.stack([x, y, torch.ones_like(x)], dim=-1)
    rotations = cameras.viewmats[:, :3, :3].to(dtype)  # [C, 3, 3] world to camera
    world = torch.einsum("cji,chwj->chwi", rotations, local)  # R^T applied to each ray
    return world / world.norm(dim=-1, keepdim=True)
