"""Posed images and scenes: the contract between dataset readers and the datapipeline.

A frame's camera (``viewmat``, ``K``, ``camera_model``) follows :mod:`gsrecon.cameras`; images are stored as uint8
``[H, W, 3]`` (or ``[H, W, 4]`` with alpha) and converted to float per batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from gsrecon.cameras.cameras import Cameras
from gsrecon.cameras.model import PINHOLE, CameraModel
from gsrecon.errors import InputError
from gsrecon.geometry import camera_centers


@runtime_checkable
class PixelFile(Protocol):
    """Pixels kept in a file and decoded when read (:class:`gsrecon.data.formats.images.ImageFile`, a mask or a depth
    map file)."""

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the decoded pixels, known without decoding them."""

    def load(self) -> np.ndarray:
        """The decoded pixels, [H, W] or [H, W, C]."""


@dataclass
class Frame:
    """One posed photograph (through a pinhole, or a fisheye lens kept as shot), its pixels decoded or left in a file.

    A frame read with ``data.cache: disk`` holds :class:`PixelFile` s instead of tensors; ``image`` decodes one
    when read and :meth:`decoded` gives a copy with every such field decoded.
    """

    name: str  # unique within a scene; used for output file names (no extension)
    viewmat: Tensor  # [4, 4] float32, world-to-camera (OpenCV)
    K: Tensor  # [3, 3] float32, intrinsics in pixels (of ``camera_model``)
    pixels: Tensor | PixelFile  # [H, W, 3] or [H, W, 4] uint8 (RGBA keeps its alpha for background compositing)
    source: str = ""  # how the pixels were made, for the first log lines: "images_8/", "resized 1/8, undistorted", ...
    # Pixels the loss and the metrics ignore: [H, W] bool, True where kept (or a file decoding to it); None: all kept.
    mask: Tensor | PixelFile | None = None
    # The camera the pixels were seen through: a pinhole, or a fisheye lens (coeffs [4] float32) where they are as
    # that lens saw them (``data.fisheye: lens``; ``K`` is the lens's), rendered through it.
    camera_model: CameraModel = PINHOLE
    # The capture's depth map (:mod:`gsrecon.data.formats.depths`): [H, W] float32 metres along the optical axis, 0
    # where unknown (or a file decoding to it); None: no depth map.
    depth: Tensor | PixelFile | None = None

    @property
    def image(self) -> Tensor:
        """The pixels, uint8 [H, W, 3|4]: those held, or decoded from their file now (and not kept)."""
        return decoded(self.pixels)

    @property
    def width(self) -> int:
        return _size(self.pixels)[0]

    @property
    def height(self) -> int:
        return _size(self.pixels)[1]

    def decoded(self) -> Frame:
        """This frame with every field held in a :class:`PixelFile` (the pixels, a mask, a depth map) decoded to a
        tensor."""
        files = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return dataclasses.replace(self, **{k: decoded(v) for k, v in files.items() if isinstance(v, PixelFile)})

    @property
    def camera_center(self) -> Tensor:
        """Camera position in world coordinates, [3]."""
        return camera_centers(self.viewmat)


def first_sightings(rows: np.ndarray, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A photo's keypoints of SfM points, ``rows`` [K] (the point each one is of) and ``pixels`` [K, 2], as each point
    once: its row [P_i] (sorted) and the pixel of its first keypoint [P_i, 2] (``Scene.observed`` / ``keypoints``)."""
    rows, first = np.unique(rows, return_index=True)
    return rows.astype(np.int64), pixels[first]


@dataclass
class SfmPoints:
    """Points made from the photos (a COLMAP model, or triangulated from known poses) and where each was seen."""

    points: Tensor  # [P, 3] float32 world positions
    colors: Tensor  # [P, 3] float32 in [0, 1]
    observed: dict[str, Tensor]  # frame name -> [P_i] int64 rows of ``points`` that photo observed
    keypoints: dict[str, Tensor] = field(default_factory=dict)  # frame name -> where it saw them (Scene.keypoints)
    keypoint_scale: dict[str, float] = field(default_factory=dict)  # see Scene.keypoint_scale


@dataclass(frozen=True)
class PosedCapture:
    """A capture whose known poses its SfM points can be triangulated from: a transforms.json folder ``root`` (its
    images may lie outside it with ``outside``), and the size (width, height) of each of its pinhole frames as the
    run reads them (triangulation saw them undistorted; keypoints are placed in these frames)."""

    root: Path
    outside: bool
    sizes: dict[str, tuple[int, int]]


@dataclass
class Scene:
    """What a dataset reader returns: the split frames and an initial point cloud."""

    train: list[Frame]
    test: list[Frame]
    points: Tensor  # [P, 3] float32 world positions (may be empty for random init)
    colors: Tensor  # [P, 3] float32 in [0, 1]
    extent: float = field(default=0.0)  # scene radius; filled by `scene_extent` when 0
    points_hint: str = ""  # where ``points`` is empty: how to make them (said when training starts without them)
    # Where SfM points with their tracks can be made from the images and known poses: a function that does, given a
    # function to log progress lines to (``model.init: auto`` calls it where ``points`` is empty, pose refinement
    # where ``keypoints`` is); None otherwise. A reader says what can be triangulated (``posed_capture``); preparation
    # sets this for it (gsrecon.data.prepare.triangulate.attach_triangulation), so that no reader imports it.
    triangulate: Callable[[Callable[[str], None]], SfmPoints] | None = None
    posed_capture: PosedCapture | None = None
    # The SfM tracks: frame name -> [P_i] int64 rows of ``points`` that photo observed; empty where unknown (random
    # points, a PLY). The depth prior (``loss.depth_prior``) reads them.
    observed: dict[str, Tensor] = field(default_factory=dict)
    # Where each photo saw its ``observed`` points: frame name -> [P_i, 2] float32 pixel x, y in the frame's image
    # (centres at +0.5), row for row; absent where unknown. Pose refinement (``pose_opt.trust_px``) reads them.
    keypoints: dict[str, Tensor] = field(default_factory=dict)
    # Frame name -> pixels of the image its keypoints were found in per pixel of the frame (8 for a frame at 1/8).
    keypoint_scale: dict[str, float] = field(default_factory=dict)
    # What ``sfm_tracks`` triangulated (or the error it met), kept so that a second module asking does not wait again
    _triangulated: SfmPoints | InputError | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.extent <= 0.0:
            self.extent = scene_extent(self.train + self.test)

    @property
    def read_tracks(self) -> SfmPoints:
        """The SfM points with the tracks and keypoints the scene was read with (empty where it had none)."""
        return SfmPoints(self.points, self.colors, self.observed, self.keypoints, self.keypoint_scale)

    def sfm_tracks(self, log: Callable[[str], None]) -> SfmPoints:
        """The SfM points with where each photo saw them: as read, or, for a scene read without keypoints whose reader
        can make them (a capture whose points come from a file), triangulated from the known poses once (``log`` takes
        its progress lines). Raises the triangulation's :class:`InputError` (too few points, no pycolmap)."""
        if self.keypoints or self.triangulate is None:
            return self.read_tracks
        if self._triangulated is None:
            try:
                self._triangulated = self.triangulate(log)
            except InputError as exc:
                self._triangulated = exc
        if isinstance(self._triangulated, InputError):
            raise self._triangulated
        return self._triangulated

    @property
    def train_cameras(self) -> Cameras:
        """The training frames' cameras as one value, in ``train`` order: each frame's pose (``viewmats`` [F, 4, 4])
        and intrinsics (``Ks`` [F, 3, 3]) as read. A scene whose training frames mix sizes or lens kinds (they train
        one at a time) has no one size or model: its value has the largest frame's size and, where the kinds mix,
        pinhole models; a frame's own size and lens are its frame's."""
        frames = self.train
        models = [frame.camera_model for frame in frames]
        model = CameraModel.stack(models) if len({m.kind for m in models}) == 1 else PINHOLE
        width, height = max(frame.width for frame in frames), max(frame.height for frame in frames)
        viewmats = torch.stack([frame.viewmat for frame in frames])  # [F, 4, 4]
        return Cameras(viewmats, torch.stack([frame.K for frame in frames]), width, height, model)

    @property
    def center(self) -> Tensor:
        """Mean camera position, [3] (the centre of the sphere ``extent`` measures)."""
        frames = self.train + self.test
        return torch.stack([f.camera_center for f in frames]).mean(0) if frames else torch.zeros(3)


def decoded(pixels: Tensor | PixelFile) -> Tensor:
    """``pixels`` as a tensor: itself, or decoded from its file."""
    return torch.from_numpy(pixels.load()) if isinstance(pixels, PixelFile) else pixels


def _size(pixels: Tensor | PixelFile) -> tuple[int, int]:
    """(width, height) of ``pixels`` [H, W, ...], without decoding a file."""
    return pixels.size if isinstance(pixels, PixelFile) else (int(pixels.shape[1]), int(pixels.shape[0]))


def scene_extent(frames: list[Frame]) -> float:
    """Radius of the camera centres around their mean, times 1.1 (as in 3DGS)."""
    if not frames:
        return 1.0
    centers = torch.stack([f.camera_center for f in frames])  # [F, 3]
    radius = (centers - centers.mean(0)).norm(dim=-1).max().item()
    return max(radius, 1e-6) * 1.1
