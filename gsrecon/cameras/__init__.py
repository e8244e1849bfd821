"""Cameras on the ground floor: the :class:`Cameras` value a render is asked for, camera models, the lens maths
(pinhole and fisheye projection), the rays through a camera's pixels and camera paths."""

from gsrecon.cameras.cameras import Cameras
from gsrecon.cameras.model import PINHOLE, CameraModel

__all__ = ["PINHOLE", "CameraModel", "Cameras"]
