"""Posed images and scenes: the contract between dataset readers and the datapipeline.

Conventions (see DESIGN.md): ``viewmat`` is a world-to-camera 4x4 in the OpenCV convention
(x right, y down, z forward); ``K`` is a 3x3 pinhole intrinsic matrix in pixels; images are
stored as uint8 ``[H, W, 3]`` (or ``[H, W, 4]`` with alpha) and converted to float per batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from gsrecon.geometry import camera_centers


@dataclass
class Frame:
    """One posed photograph (already undistorted to a pinhole camera)."""

    name: str  # unique within a scene; used for output file names (no extension)
    viewmat: Tensor  # [4, 4] float32, world-to-camera (OpenCV)
    K: Tensor  # [3, 3] float32, pinhole intrinsics in pixels
    image: Tensor  # [H, W, 3] or [H, W, 4] uint8 (RGBA keeps its alpha for background compositing)
    source: str = ""  # how the pixels were made, for the first log lines: "images_8/", "resized 1/8, undistorted", ...

    @property
    def width(self) -> int:
        return int(self.image.shape[1])

    @property
    def height(self) -> int:
        return int(self.image.shape[0])

    @property
    def camera_center(self) -> Tensor:
        """Camera position in world coordinates, [3]."""
        return camera_centers(self.viewmat)


@dataclass
class Scene:
    """What a dataset reader returns: the split frames and an initial point cloud."""

    train: list[Frame]
    test: list[Frame]
    points: Tensor  # [P, 3] float32 world positions (may be empty for random init)
    colors: Tensor  # [P, 3] float32 in [0, 1]
    extent: float = field(default=0.0)  # scene radius; filled by `scene_extent` when 0
    points_hint: str = ""  # where ``points`` is empty: how to make them (said when training starts without them)
    # Where ``points`` is empty and the reader can make them from the images and known poses: a function that does,
    # given a function to log progress lines to (``model.init: auto`` calls it); None otherwise.
    triangulate: Callable[[Callable[[str], None]], tuple[Tensor, Tensor]] | None = None

    def __post_init__(self) -> None:
        if self.extent <= 0.0:
            self.extent = scene_extent(self.train + self.test)

    @property
    def center(self) -> Tensor:
        """Mean camera position, [3] (the centre of the sphere ``extent`` measures)."""
        frames = self.train + self.test
        return torch.stack([f.camera_center for f in frames]).mean(0) if frames else torch.zeros(3)


def scene_extent(frames: list[Frame]) -> float:
    """Radius of the camera centres around their mean, times 1.1 (as in 3DGS)."""
    if not frames:
        return 1.0
    centers = torch.stack([f.camera_center for f in frames])  # [F, 3]
    radius = (centers - centers.mean(0)).norm(dim=-1).max().item()
    return max(radius, 1e-6) * 1.1
