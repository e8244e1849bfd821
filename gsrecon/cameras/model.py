"""Camera models: how a camera maps its view to pixels through its intrinsics (a pinhole, or a fisheye lens)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

CAMERA_KINDS = ("pinhole", "fisheye")


@dataclass(frozen=True, eq=False)
class CameraModel:
    """How a camera maps its view to pixels through its ``K``: a pinhole, or an OpenCV fisheye lens with its
    k1..k4 (``theta_d = theta (1 + k1 theta^2 + k2 theta^4 + k3 theta^6 + k4 theta^8)``, see
    :mod:`gsrecon.cameras.lens`).

    One model describes one camera (a :class:`Frame`: ``coeffs`` [4]) or several of one kind (a batch, the cameras
    of a render: ``coeffs`` [C, 4]): :data:`PINHOLE`, :meth:`fisheye` or :meth:`stack`.
    """

    kind: str = "pinhole"  # one of CAMERA_KINDS
    coeffs: Tensor | None = None  # fisheye k1..k4, [4] or [C, 4] floating point; None for a pinhole

    def __post_init__(self) -> None:
        if self.kind not in CAMERA_KINDS:
            raise ValueError(f"camera model kind '{self.kind}' is not one of {', '.join(CAMERA_KINDS)}")
        if self.kind == "pinhole":
            if self.coeffs is not None:
                raise ValueError("a pinhole camera model has no coefficients; give coeffs=None")
            return
        shape = None if self.coeffs is None else tuple(self.coeffs.shape)
        if shape is None or not 1 <= len(shape) <= 2 or shape[-1] != 4 or not self.coeffs.is_floating_point():
            raise ValueError(
                f"a fisheye camera model needs coeffs k1..k4 as a floating-point tensor of shape [4] or [C, 4]; "
                f"got {'None' if shape is None else f'shape {list(shape)}'}"
            )

    @classmethod
    def fisheye(cls, coeffs: Tensor) -> CameraModel:
        """A fisheye lens with OpenCV coefficients ``coeffs`` k1..k4, [4] or [C, 4]."""
        return cls("fisheye", coeffs)

    @classmethod
    def stack(cls, models: Sequence[CameraModel]) -> CameraModel:
        """The model of a batch of cameras, one single-camera model each (fisheye coefficients [B, 4]).

        Raises ValueError where the cameras are of different kinds (they render separately).
        """
        kinds = sorted({model.kind for model in models})
        if len(kinds) != 1:
            raise ValueError(f"cameras of one batch must be of one kind; got {' and '.join(kinds) or 'none'}")
        if kinds[0] == "pinhole":
            return PINHOLE
        return cls.fisheye(torch.stack([model.coeffs for model in models]))

    def to(self, device: torch.device | str) -> CameraModel:
        """This model with its coefficients on ``device``."""
        return self if self.coeffs is None else CameraModel(self.kind, self.coeffs.to(device))


PINHOLE = CameraModel()  # a pinhole camera, or any number of them
