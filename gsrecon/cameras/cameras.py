"""Cameras: the value a render is asked for, one or several cameras of one size and one model.

The convention, here and everywhere in gsrecon: a camera's pose is a world-to-camera 4x4 matrix in the OpenCV
convention (x right, y down, z forward, so a point in front of the camera has z > 0); its intrinsics ``K`` are a
3x3 matrix in pixels, the centre of pixel ``(i, j)`` at ``(i + 0.5, j + 0.5)``, read through its
:class:`~gsrecon.cameras.model.CameraModel` (a pinhole, or a fisheye lens with its k1..k4).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from gsrecon.cameras.model import PINHOLE, CameraModel


@dataclass(frozen=True, eq=False)
class Cameras:
    """``B`` cameras of one size and one model, rendered together."""

    viewmats: Tensor  # [B, 4, 4] world-to-camera (OpenCV)
    Ks: Tensor  # [B, 3, 3] intrinsics in pixels (of ``model``)
    width: int
    height: int
    model: CameraModel = PINHOLE  # the B cameras' model: pinholes, or fisheye lenses (coeffs [B, 4])

    def __post_init__(self) -> None:
        b = self.viewmats.shape[0] if self.viewmats.dim() == 3 else -1
        if tuple(self.viewmats.shape) != (b, 4, 4):
            raise ValueError(f"viewmats has shape {tuple(self.viewmats.shape)}, expected (B, 4, 4)")
        if tuple(self.Ks.shape) != (b, 3, 3):
            raise ValueError(f"Ks has shape {tuple(self.Ks.shape)}, expected ({b}, 3, 3)")
        if self.width <= 0 or self.height <= 0:
            raise ValueError(f"image size must be positive, got width={self.width}, height={self.height}")
        if not isinstance(self.model, CameraModel):
            raise ValueError(f"model must be a CameraModel, got {type(self.model).__name__}")
        if self.model.kind == "fisheye" and tuple(self.model.coeffs.shape) != (b, 4):
            raise ValueError(f"fisheye model coeffs have shape {tuple(self.model.coeffs.shape)}, expected ({b}, 4)")

    def __len__(self) -> int:
        return self.viewmats.shape[0]

    def __getitem__(self, index: int | slice) -> Cameras:
        """The cameras at ``index`` (one camera stays a batch of one)."""
        if isinstance(index, int):
            if not -len(self) <= index < len(self):
                raise IndexError(f"camera {index} of {len(self)}")
            index %= len(self)
        rows = slice(index, index + 1) if isinstance(index, int) else index
        coeffs = self.model.coeffs
        model = self.model if coeffs is None else CameraModel(self.model.kind, coeffs[rows])
        return Cameras(self.viewmats[rows], self.Ks[rows], self.width, self.height, model)

    def to(self, device: torch.device | str) -> Cameras:
        """These cameras with their tensors on ``device``."""
        return Cameras(self.viewmats.to(device), self.Ks.to(device), self.width, self.height, self.model.to(device))

    def with_viewmats(self, viewmats: Tensor) -> Cameras:
        """These cameras moved to the world-to-camera ``viewmats`` [B, 4, 4]."""
        return dataclasses.replace(self, viewmats=viewmats)
