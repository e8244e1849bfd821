"""The renderer ``cpu``: the torch renderer's model (`gsrecon.render.torch_renderer`) on compiled multi-threaded CPU
kernels (`gsrecon.render.cpu.functions`), with the same inputs, outputs and conventions.

Pinhole cameras are projected by the C++ kernel (its backward gives the poses' gradients too, for pose
refinement); fisheye lenses, and intrinsics that carry gradients, are projected by the torch renderer's
differentiable projection and composited by the C++ rasterizer. A render is deterministic: its image and
gradients do not depend on the number of threads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from gsrecon.cameras import Cameras
from gsrecon.component import RunSetup
from gsrecon.kernels.build import load_kernels
from gsrecon.params import PARAM_NAMES
from gsrecon.registry import RENDERER_REGISTRY
from gsrecon.render.base import Renderer, RendererConfig, RenderOutput
from gsrecon.render.cpu.functions import Projection, project_pinhole, rasterize
from gsrecon.render.torch_renderer import ALPHA_MIN, shade_gaussians


@RENDERER_REGISTRY.register("cpu")
class CpuRenderer(Renderer):
    """3DGS on compiled CPU kernels; same inputs and outputs as the torch renderer."""

    @dataclass
    class Config(RendererConfig):
        alpha_max: float = 0.99  # per-Gaussian alpha clamp (the torch renderer's)
        absgrad: bool = False  # also accumulate |grad| of means2d (AbsGS): set from strategy.absgrad by the builder
        # A training step whose loss is the L1 and SSIM terms (no per-view module) in two compiled calls, forward and
        # backward (gsrecon.render.cpu.step); false: the render, then the terms, as on every renderer.
        fused_step: bool = True

        def __post_init__(self) -> None:
            super().__post_init__()
            if not ALPHA_MIN < self.alpha_max < 1.0:
                raise ValueError(f"renderer alpha_max={self.alpha_max} must be in (1/255, 1)")

    def __init__(self, cfg: CpuRenderer.Config | None = None) -> None:
        self.cfg = cfg if cfg is not None else CpuRenderer.Config()

    @property
    def compiled(self) -> bool:
        return True

    def setup(self, run: RunSetup) -> None:
        """Build (on first use, saying so) or load the kernels; KernelsUnavailableError says why they cannot be."""
        load_kernels(run.log)

    def _render(
        self, params: Mapping[str, Tensor], cameras: Cameras, sh_degree: int, backgrounds: Tensor
    ) -> RenderOutput:
        cfg = self.cfg
        if params["means"].device.type != "cpu":
            raise ValueError(f"renderer 'cpu' renders on the CPU; the Gaussians are on {params['means'].device}")
        if cameras.model.kind == "pinhole" and not cameras.Ks.requires_grad:
            proj = project_pinhole(
                params["means"], params["quats"], params["scales"], params["opacities"], params["sh0"],
                params["shN"], sh_degree, cameras, cfg,
            )  # fmt: skip
        else:
            rows = [params[key] for key in PARAM_NAMES]
            proj = Projection(*shade_gaussians(rows, cameras, sh_degree, cfg))
        width, height = cameras.width, cameras.height
        means2d = proj.means2d.float().contiguous()  # [C, N, 2]
        if means2d.requires_grad:
            means2d.retain_grad()
        out, median = rasterize(
            means2d, proj.conics, proj.log_opacities, proj.colors, proj.depths, proj.radii, width, height,
            cfg.tile_size, cfg.alpha_max, cfg.median_depth, cfg.absgrad and means2d.requires_grad,
        )  # fmt: skip  # [C, H, W, 5], [C, H, W]
        dtype = params["means"].dtype
        out = out.to(dtype)
        alpha = out[..., 4:5]
        image = out[..., :3] + (1.0 - alpha) * backgrounds[:, None, None, :]
        depth = torch.where(alpha > 0, out[..., 3:4] / alpha.clamp_min(1e-10), 0.0)
        info = {
            "means2d": means2d,
            "radii": proj.radii,
            "depths": proj.depths.detach().to(dtype),
            "width": width,
            "height": height,
            "n_cameras": len(cameras),
            "gaussian_ids": None,  # dense info; gsplat's packed mode lists the visible pairs' ids here
        }
        median_depth = median[..., None].to(dtype) if cfg.median_depth else None
        return RenderOutput(image=image, alpha=alpha, depth=depth, info=info, median_depth=median_depth)
