"""``Scene.train_cameras``: the training frames' cameras as one :class:`~gsrecon.cameras.Cameras` value."""

from __future__ import annotations

import torch

from gsrecon.cameras import PINHOLE, CameraModel
from gsrecon.data.scene import Frame, Scene
from gsrecon.geometry import camera_centers


def _frame(name: str, x: float, width: int = 8, height: int = 6, model: CameraModel = PINHOLE) -> Frame:
    """A frame at (x, 0, 0) looking along +z, ``width`` x ``height`` black pixels."""
    viewmat = torch.eye(4)
    viewmat[0, 3] = -x
    K = torch.tensor([[10.0 + x, 0.0, width / 2], [0.0, 10.0, height / 2], [0.0, 0.0, 1.0]])
    return Frame(name, viewmat, K, torch.zeros(height, width, 3, dtype=torch.uint8), camera_model=model)


def _scene(train: list[Frame]) -> Scene:
    return Scene(train, [_frame("test", 9.0)], torch.zeros(0, 3), torch.zeros(0, 3))


def test_the_training_cameras_are_the_training_frames_poses_and_intrinsics_in_order() -> None:
    lens = [CameraModel.fisheye(torch.tensor([0.1 * i, 0.0, 0.0, 0.0])) for i in range(3)]
    frames = [_frame(f"f{i}", float(i), model=lens[i]) for i in range(3)]
    cameras = _scene(frames).train_cameras
    assert len(cameras) == 3 and (cameras.width, cameras.height) == (8, 6)  # the test view is not one of them
    assert torch.equal(cameras.viewmats, torch.stack([frame.viewmat for frame in frames]))
    assert torch.equal(cameras.Ks, torch.stack([frame.K for frame in frames]))
    assert cameras.model.kind == "fisheye" and torch.equal(cameras.model.coeffs[:, 0], torch.tensor([0.0, 0.1, 0.2]))
    torch.testing.assert_close(camera_centers(cameras.viewmats)[:, 0], torch.tensor([0.0, 1.0, 2.0]))


def test_training_frames_of_mixed_sizes_and_lenses_keep_their_poses() -> None:
    fisheye = CameraModel.fisheye(torch.tensor([0.1, 0.0, 0.0, 0.0]))
    frames = [_frame("small", 0.0, 8, 6), _frame("tall", 1.0, 6, 10, fisheye)]
    cameras = _scene(frames).train_cameras
    assert (cameras.width, cameras.height) == (8, 10) and cameras.model.kind == "pinhole"  # the largest size
    assert torch.equal(cameras.viewmats, torch.stack([frame.viewmat for frame in frames]))
    assert torch.equal(cameras.Ks, torch.stack([frame.K for frame in frames]))
