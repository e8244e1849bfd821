"""The gsplat CUDA renderer: a thin wrapper over ``gsplat.rasterization`` (gsplat >= 1.5).

gsplat compiles its CUDA kernels on first use (minutes); :meth:`GsplatRenderer.setup` says so
before it happens and fails with an actionable message when CUDA or its toolkit is missing.

``gsplat.rasterization`` renders no median depth for 3D Gaussians (only its 2DGS rasterizer has one): with
``median_depth`` this renderer walks each pixel's Gaussians front to back with gsplat's
``rasterize_to_indices_in_range``, the kernel of its own reference rasterizer, until the transmittance crosses 1/2.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from gsrecon.cameras import Cameras
from gsrecon.component import RunSetup
from gsrecon.errors import InputError
from gsrecon.registry import RENDERER_REGISTRY
from gsrecon.render.base import Renderer, RendererConfig, RenderOutput

GSPLAT_ALPHA_MAX = 0.999  # gsplat's per-Gaussian alpha clamp (the torch renderer's alpha_max equivalent)


class GsplatUnavailableError(InputError):
    """gsplat cannot run here (no CUDA device, no CUDA toolkit, or gsplat not installed): use the torch renderer."""


@RENDERER_REGISTRY.register("gsplat")
class GsplatRenderer(Renderer):
    """Rasterizes with gsplat's CUDA kernels; same inputs and outputs as the torch renderer."""

    @dataclass
    class Config(RendererConfig):
        packed: bool = False  # packed intersections: less memory for large scenes (not with median_depth)
        absgrad: bool = False  # also accumulate |grad| of means2d (AbsGS): set from strategy.absgrad by the builder
        sparse_grad: bool = False  # sparse gradients for means/quats/scales (needs packed; trains with RowSparseAdam)
        radius_clip: float = 0.0  # skip Gaussians whose screen radius is at most this (pixels)

        def __post_init__(self) -> None:
            super().__post_init__()
            if self.sparse_grad and not self.packed:
                raise ValueError("renderer.sparse_grad needs renderer.packed: true")
            if self.radius_clip < 0.0:
                raise ValueError(f"renderer radius_clip={self.radius_clip} must be >= 0")

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self._rasterization = None

    @property
    def sparse_grad(self) -> bool:
        return self.cfg.sparse_grad

    def setup(self, run: RunSetup) -> None:
        """Check CUDA, set build variables when unset, and build (or load) gsplat's kernels."""
        if not torch.cuda.is_available():
            raise GsplatUnavailableError("renderer 'gsplat' needs a CUDA GPU; use renderer.name=torch on this machine")
        try:
            import gsplat  # noqa: F401  (pure-Python import; kernels load below)
        except ImportError:
            raise GsplatUnavailableError(
                "renderer 'gsplat' needs the gsplat package (a dependency of gsrecon: reinstall with "
                "pip install -e .), or use renderer.name=torch"
            ) from None
        configure_cuda_build_env()
        if not _kernels_built():
            run.log(
                f"gsplat: compiling its CUDA kernels on first use; this takes a few minutes (cached in {_build_dir()})"
            )
        from gsplat.cuda._backend import _C

        if _C is None:
            raise GsplatUnavailableError(
                "gsplat could not build its CUDA kernels: no CUDA toolkit (nvcc) was found. Install the CUDA "
                "toolkit matching torch.version.cuda and set CUDA_HOME, or use renderer.name=torch"
            )
        from gsplat import rasterization

        self._rasterization = rasterization

    def _render(
        self, params: Mapping[str, Tensor], cameras: Cameras, sh_degree: int, backgrounds: Tensor
    ) -> RenderOutput:
        if self._rasterization is None:
            raise GsplatUnavailableError("GsplatRenderer.setup(run) must run before render()")
        cfg = self.cfg
        camera_model = cameras.model
        if camera_model.kind == "fisheye" and cfg.median_depth:
            raise InputError(
                "renderer.median_depth with gsplat needs pinhole cameras (fisheye Gaussians are evaluated along rays, "
                "which gsplat's per-pixel lists do not follow): set data.fisheye=undistort or renderer.name=torch"
            )
        if camera_model.kind == "fisheye" and (cfg.packed or cfg.sparse_grad):
            raise InputError(
                "fisheye frames (data.fisheye: lens) render through gsplat's unscented transform, which has no "
                "packed mode: set renderer.packed=false renderer.sparse_grad=false, or data.fisheye=undistort"
            )
        packed = cfg.packed and not cfg.median_depth  # the median depth walks unpacked lists: the same image
        common = {
            "means": params["means"], "quats": params["quats"], "scales": torch.exp(params["scales"]),
            "opacities": torch.sigmoid(params["opacities"]), "viewmats": cameras.viewmats, "Ks": cameras.Ks,
            "width": cameras.width, "height": cameras.height, "near_plane": cfg.near_plane,
            "far_plane": cfg.far_plane, "radius_clip": cfg.radius_clip, "eps2d": cfg.eps2d, "packed": packed,
            "tile_size": cfg.tile_size, "sparse_grad": cfg.sparse_grad and packed, "absgrad": cfg.absgrad,
            "rasterize_mode": "antialiased" if cfg.antialiased else "classic",
        }  # fmt: skip
        colors = torch.cat([params["sh0"], params["shN"]], dim=1)  # [N, K, 3]
        if camera_model.kind == "fisheye":
            return self._render_through_lens(common, colors, cameras, sh_degree, backgrounds)
        render_colors, render_alphas, info = self._rasterization(
            colors=colors, sh_degree=sh_degree, backgrounds=backgrounds, render_mode="RGB+ED", **common
        )
        median = median_depth(info) if cfg.median_depth else None
        return RenderOutput(
            image=render_colors[..., :3], alpha=render_alphas, depth=render_colors[..., 3:4], info=info,
            median_depth=median,
        )  # fmt: skip

    def _render_through_lens(
        self, common: dict, colors: Tensor, cameras: Cameras, sh_degree: int, backgrounds: Tensor
    ) -> RenderOutput:
        """A fisheye render: gsplat's unscented transform projects through the lens model (3DGUT) and with_eval3d
        evaluates each Gaussian along the pixels' rays, as 3DGUT trains. Its rasterizer composites exactly three
        channels (four abort the process: gsplat 1.5.3, issue #716), so the expected depth is a second pass whose
        three channels are each Gaussian's camera depth."""
        lens = {"camera_model": "fisheye", "radial_coeffs": cameras.model.coeffs, "with_ut": True, "with_eval3d": True}
        image, alpha, info = self._rasterization(
            colors=colors, sh_degree=sh_degree, backgrounds=backgrounds, render_mode="RGB", **common, **lens
        )
        viewmats = cameras.viewmats  # [C, 4, 4]
        depths = torch.einsum("cj,nj->cn", viewmats[:, 2, :3], common["means"]) + viewmats[:, 2, 3:]  # [C, N]
        accumulated, _, _ = self._rasterization(
            colors=depths[..., None].expand(-1, -1, 3), sh_degree=None, backgrounds=None, render_mode="RGB",
            **common, **lens,
        )  # fmt: skip
        depth = accumulated[..., :1] / alpha.clamp_min(1e-10)  # [C, H, W, 1]: gsplat's expected depth (RGB+ED)
        return RenderOutput(image=image, alpha=alpha, depth=depth, info=info, median_depth=None)


@torch.no_grad()
def median_depth(info: dict, alpha_max: float = GSPLAT_ALPHA_MAX) -> Tensor:
    """The median depth [C, H, W, 1] of an unpacked ``gsplat.rasterization``'s ``info``: per pixel the depth of the
    Gaussian across which the transmittance falls from above 1/2 to 1/2 or below (0 where it stays above), with
    gsplat's alphas (clamped to ``alpha_max``, 1/255 skipped) and its pixel centres at +0.5.

    Walks the per-tile lists one block of ``tile_size²`` Gaussians at a time, stopping when every pixel is past
    1/2. ``rasterize_to_indices_in_range`` writes each pixel's pairs together, front to back, pixels in order."""
    from gsplat import rasterize_to_indices_in_range

    means2d, conics = info["means2d"].detach(), info["conics"].detach()  # [C, N, 2], [C, N, 3]
    opacities, depths = info["opacities"].detach(), info["depths"].detach()  # [C, N] each
    width, height, tile_size = info["width"], info["height"], info["tile_size"]
    offsets, flatten_ids = info["isect_offsets"], info["flatten_ids"]  # [C, TH, TW], [n_isects]
    n_cams, n_pixels = means2d.shape[0], width * height
    trans = torch.ones(n_cams, height, width, device=means2d.device)
    median = torch.zeros(n_cams * n_pixels, device=means2d.device)
    ends = torch.cat([offsets.flatten(), offsets.new_tensor([len(flatten_ids)])])
    longest = int((ends[1:] - ends[:-1]).max()) if len(flatten_ids) else 0
    for block in range(math.ceil(longest / tile_size**2)):
        gauss, pixels, images = rasterize_to_indices_in_range(
            block, block + 1, trans, means2d, conics, opacities, width, height, tile_size, offsets, flatten_ids
        )  # [M] each, grouped by pixel, front to back
        if len(gauss) == 0:
            break
        x, y = (pixels % width).float() + 0.5, (pixels // width).float() + 0.5  # [M]
        dx, dy = means2d[images, gauss, 0] - x, means2d[images, gauss, 1] - y
        a, b, c = conics[images, gauss].unbind(-1)
        sigma = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
        log_keep = torch.log1p(-(opacities[images, gauss] * torch.exp(-sigma)).clamp_max(alpha_max))  # ln(1 - alpha)
        rays = images * n_pixels + pixels  # [M] flat pixel ids, non-decreasing
        _, counts = torch.unique_consecutive(rays, return_counts=True)
        after = torch.cumsum(log_keep, 0)  # [M] ln T after each pair, from the block's first pair
        first = torch.cumsum(counts, 0) - counts  # [R] each ray's first pair
        after = after - torch.repeat_interleave(after[first] - log_keep[first], counts)  # from the ray's first pair
        start = trans.view(-1)[rays]  # [M] T in front of the block
        crossing = (start * torch.exp(after - log_keep) > 0.5) & (start * torch.exp(after) <= 0.5)
        median[rays[crossing]] = depths[images[crossing], gauss[crossing]]
        trans.view(-1).index_put_((rays[first],), start[first] * torch.exp(after[first + counts - 1]))
        if float(trans.max()) <= 0.5:
            break
    return median.view(n_cams, height, width, 1)


def configure_cuda_build_env() -> None:
    """Set ``TORCH_CUDA_ARCH_LIST`` (this GPU's architecture) and ``CUDA_HOME`` (from nvcc) when unset."""
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    if not os.environ.get("CUDA_HOME"):
        nvcc = shutil.which("nvcc")
        candidates = [Path(nvcc).resolve().parent.parent] if nvcc else []
        candidates.append(Path("/usr/local/cuda"))
        for home in candidates:
            if (home / "bin" / "nvcc").is_file():
                os.environ["CUDA_HOME"] = str(home)
                break


def _build_dir() -> Path:
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory("gsplat_cuda", verbose=False))


def _kernels_built() -> bool:
    try:
        from gsplat import csrc  # noqa: F401  (a prebuilt wheel)

        return True
    except ImportError:
        return any(_build_dir().glob("gsplat_cuda*.so"))
