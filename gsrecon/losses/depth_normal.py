"""Rendered normals that agree with the rendered depth's (2DGS's normal consistency, PGSR's single-view term).

Each Gaussian's normal is the axis of its smallest scale, turned toward the camera; rendering those normals as
colours (a second render of the same Gaussians, the renderer's own compositing) gives a normal per pixel, which
is compared with the normal of the surface the expected depth describes (the cross product of its finite
differences, back-projected through the pinhole).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from gsrecon.geometry import camera_centers, quat_to_rotmat
from gsrecon.losses.base import LossInputs, LossTerm
from gsrecon.registry import LOSS_REGISTRY
from gsrecon.sh import rgb_to_sh


def gaussian_normals(params: Mapping[str, Tensor], viewmat: Tensor) -> Tensor:
    """World-space unit normals [N, 3]: each Gaussian's smallest axis, turned toward the camera ``viewmat`` [4, 4]."""
    rotations = quat_to_rotmat(params["quats"])  # [N, 3, 3], columns are the axes
    smallest = params["scales"].argmin(dim=-1)  # [N]
    normals = rotations.gather(2, smallest[:, None, None].expand(-1, 3, 1))[..., 0]  # [N, 3]
    towards = camera_centers(viewmat[None])[0] - params["means"]  # [N, 3]
    return torch.where(((normals * towards).sum(-1, keepdim=True) < 0), -normals, normals)


def depth_normals(depth: Tensor, K: Tensor) -> Tensor:
    """Camera-space unit normals [H, W, 3] of the surface ``depth`` [H, W] describes through pinhole ``K`` [3, 3]
    (central differences; the border pixels repeat their neighbours'), facing the camera."""
    height, width = depth.shape
    ys, xs = torch.meshgrid(
        torch.arange(height, device=depth.device, dtype=depth.dtype) + 0.5,
        torch.arange(width, device=depth.device, dtype=depth.dtype) + 0.5,
        indexing="ij",
    )
    points = torch.stack([(xs - K[0, 2]) / K[0, 0] * depth, (ys - K[1, 2]) / K[1, 1] * depth, depth], dim=-1)
    padded = F.pad(points.permute(2, 0, 1)[None], (1, 1, 1, 1), mode="replicate")[0].permute(1, 2, 0)
    dx = padded[1:-1, 2:] - padded[1:-1, :-2]  # [H, W, 3]
    dy = padded[2:, 1:-1] - padded[:-2, 1:-1]
    return F.normalize(torch.cross(dy, dx, dim=-1), dim=-1)  # x right, y down, z forward: dy x dx faces the camera


@LOSS_REGISTRY.register("depth_normal")
class DepthNormalTerm(LossTerm):
    """Mean (1 - cos) between the rendered normals and the expected depth's normals where the render is opaque;
    costs a second render each step (pinhole views)."""

    @dataclass
    class Config(LossTerm.Config):
        weight: float = 0.05
        min_alpha: float = 0.5  # pixels less opaque than this are left out

    def __call__(self, inputs: LossInputs) -> Tensor | None:
        if inputs.params is None or inputs.renderer is None or inputs.batch.cameras.model.kind != "pinhole":
            return None
        batch, params, errors = inputs.batch, inputs.params, []
        for view in range(len(batch.names)):
            camera = batch.cameras[view]
            viewmat, K = camera.viewmats[0], camera.Ks[0]
            normals = gaussian_normals(params, viewmat) @ viewmat[:3, :3].T  # [N, 3] camera space
            as_colors = dict(params, sh0=rgb_to_sh(0.5 * normals + 0.5)[:, None], shN=params["shN"][:, :0])
            out = inputs.renderer.render(as_colors, camera, 0)
            alpha = out.alpha[0, ..., 0]  # [H, W]
            rendered = F.normalize(2.0 * out.image[0] - alpha[..., None], dim=-1)  # sum of w n: [H, W, 3]
            from_depth = depth_normals(inputs.render.depth[view, ..., 0], K)
            keep = (alpha.detach() >= self.cfg.min_alpha) & (inputs.render.alpha[view, ..., 0].detach() > 0)
            if keep.any():
                errors.append((1.0 - (rendered * from_depth).sum(-1))[keep])
        return torch.cat(errors).mean() if errors else None
