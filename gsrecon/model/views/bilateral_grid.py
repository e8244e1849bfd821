"""Per-image bilateral grids: a colour transform per pixel that depends on where the pixel is and how bright.

The bilateral guided grid of Wang et al. (2024, "Bilateral Guided Radiance Field Processing"): each training
image owns a 3D grid over (x, y, luminance) whose cells hold 3x4 affine colour transforms. A rendered pixel's
transform is read from its image's grid by trilinear interpolation at the pixel's position and the luminance of
its rendered colour, then applied to that colour. Unlike one transform per image (``affine``), the grid can
follow a camera's tone curve (its cells along the luminance) and, with cells across the image (``shape``),
vignetting and local tone mapping. The grids start at the identity (the render
passes unchanged), are trained by their own Adam and kept smooth by a total-variation penalty. As with
``affine``, only the photos whose colours at their SfM keypoints differ from the other photos' beyond ``trust``
have grids that learn (starting from the gains measured there); where every photo's do, the grids average to the
identity over the training images (or each over its ``neighbours``). Test views are scored as rendered
(``eval: identity``) or with one transform fitted on the left half (``eval: fit_left``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from gsrecon.data.prefetch import host_memory_room
from gsrecon.model.views.affine import AppearanceConfig, AppearanceModule
from gsrecon.registry import VIEW_REGISTRY

if TYPE_CHECKING:
    from gsrecon.data.pipeline import Batch
    from gsrecon.render.base import RenderOutput

LUMA_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R BT.601 luminance of an RGB colour: the grid's third axis
MAX_GRID_CELLS = 256  # per axis
GAIN_ENTRIES = (0, 5, 10)  # a cell's entries (3x4, row-major) that scale each channel by itself
GRID_COPIES = 8  # grid-sized float32 tensors a training step holds at its peak (see check_grid_memory)


@VIEW_REGISTRY.register("bilateral_grid")
class BilateralGridAppearance(AppearanceModule):
    """One bilateral grid of colour transforms per training image, looked up by image name."""

    @dataclass
    class Config(AppearanceConfig):
        lr: float = 2e-3  # Adam learning rate of the grids
        reg: float = 10.0  # weight of the grids' total variation (mean squared difference of neighbouring cells)
        # cells across x, y and luminance: one cell across the image (a colour transform per luminance level: a
        # photo's tone curve and white balance) kept the 4 x 4 grid's gain on the exposure capture and cost the
        # statuette's real photos 0.1 dB (its transforms.json capture 0.1) where 4 x 4 cost 0.4-0.5 and gsplat's
        # 16 x 16 0.7-1.2: cells across the image also learnt what the Gaussians should hold (BENCHMARKS.md, issue
        # 38). [4, 4, 8]: vignetting that differs between photos.
        shape: list[int] = field(default_factory=lambda: [1, 1, 8])
        matrix: str = "full"  # full: a 3x3 colour matrix and a bias per cell | diagonal: a gain and a bias per channel

        def __post_init__(self) -> None:
            super().__post_init__()
            shape = self.shape
            if not (len(shape) == 3 and all(isinstance(n, int) and 1 <= n <= MAX_GRID_CELLS for n in shape)):
                raise ValueError(
                    f"shape must be three whole numbers of cells [x, y, luminance], each 1 to {MAX_GRID_CELLS}, "
                    f"got {shape!r}"
                )

    def __init__(self, cfg: Config, train_names: list[str]) -> None:
        super().__init__(cfg, train_names)
        cells_x, cells_y, cells_luma = cfg.shape
        check_grid_memory(cfg.shape, len(train_names))
        # Each cell's offset from the identity transform [N, 12 (3x4, row-major), luminance, y, x].
        self.offsets = torch.nn.Parameter(torch.zeros(len(train_names), 12, cells_luma, cells_y, cells_x))

    def masked(self, offsets: Tensor) -> Tensor:
        return offsets * self.learnt.to(offsets.device).reshape(1, 12, 1, 1, 1)

    def grids(self, rows: Tensor) -> Tensor:
        """The offsets from the identity [B, 12, L, Y, X] of the training images at ``rows`` [B] (see
        :meth:`~gsrecon.model.views.affine.AppearanceModule.centred`)."""
        return self.centred(self.masked(self.offsets))[rows]

    def start_from_gains(self, rows: Tensor, gains: Tensor) -> None:
        self.offsets[rows[:, None], list(GAIN_ENTRIES)] = (gains - 1)[..., None, None, None].to(self.offsets)

    def adjust_image(self, image: Tensor, batch: Batch, out: RenderOutput) -> Tensor:
        """The rendered ``image`` [B, H, W, 3] as the training images ``batch.names`` saw them."""
        if not self.corrects_any(batch):
            return image
        return slice_grids(self.grids(self.rows(batch.names, self.offsets.device)), image)

    def regularization(self, out: RenderOutput, batch: Batch) -> Tensor | None:
        """``reg`` × the grids' total variation; None where no photo is corrected."""
        if not self.corrected().any():
            return None
        return self.cfg.reg * total_variation(self.centred(self.masked(self.offsets)))


def check_grid_memory(shape: list[int], images: int) -> None:
    """A ValueError naming ``shape`` when the grids of ``images`` training images need more memory than this process
    may still take (the machine's, its cgroup's and its own limits; before anything is allocated)."""
    # float32 offsets, their gradient, Adam's two moments, the centred copy and its gradient, the smoothness terms
    needed = images * 12 * math.prod(shape) * 4 * GRID_COPIES
    free, bound = host_memory_room()
    if needed > free:
        cells = math.prod(shape) * free / needed
        raise ValueError(
            f"shape {shape} needs about {needed / 2**30:.1f} GiB for {images} training images (grids, "
            f"gradients, Adam's moments); {free / 2**30:.1f} GiB are free ({bound}): give fewer cells (at most "
            f"about {int(cells):,} per image, e.g. [4, 4, 8])"
        )


def slice_grids(offsets: Tensor, images: Tensor) -> Tensor:
    """``images`` [B, H, W, 3] through their bilateral grids, given as offsets from the identity [B, 12, L, Y, X]:
    each pixel's transform is interpolated at its position and its luminance (corner cells at the corner pixels'
    centres and at luminance 0 and 1; beyond them, the border cells)."""
    batch, height, width, _ = images.shape
    ys = (torch.arange(height, device=images.device, dtype=images.dtype) + 0.5) / height * 2 - 1  # [H] in (-1, 1)
    xs = (torch.arange(width, device=images.device, dtype=images.dtype) + 0.5) / width * 2 - 1  # [W]
    luma = images @ torch.tensor(LUMA_WEIGHTS, device=images.device, dtype=images.dtype)  # [B, H, W]
    where = torch.stack(
        [xs.expand(batch, height, width), ys[:, None].expand(batch, height, width), luma * 2 - 1], dim=-1
    )  # [B, H, W, 3]: x, y, luminance in grid_sample's [-1, 1]
    sliced = F.grid_sample(offsets, where[:, None], mode="bilinear", padding_mode="border", align_corners=True)
    transforms = sliced[:, :, 0].permute(0, 2, 3, 1).reshape(batch, height, width, 3, 4)  # [B, H, W, 3, 4]
    return images + apply_affine_offsets(images, transforms)


def apply_affine_offsets(images: Tensor, offsets: Tensor) -> Tensor:
    """What per-pixel transform offsets [B, H, W, 3, 4] add to ``images`` [B, H, W, 3]: ``D @ rgb + d``."""
    return torch.einsum("bhwij,bhwj->bhwi", offsets[..., :3], images) + offsets[..., 3]


def total_variation(grids: Tensor) -> Tensor:
    """The mean squared difference of neighbouring cells of ``grids`` [N, C, L, Y, X], summed over the three
    axes (an axis of one cell adds nothing)."""
    terms = [grids.diff(dim=axis).square().mean() for axis in (2, 3, 4) if grids.shape[axis] > 1]
    return torch.stack(terms).sum() if terms else grids.new_zeros(())
