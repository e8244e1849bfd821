"""Camera paths: valid viewmats, looking at the focus point, smooth, interpolating the input poses."""

from __future__ import annotations

import math

import pytest
import torch

from gsrecon.cameras.paths import ellipse_path, focus_point, interp_path, spiral_path
from gsrecon.geometry import camera_centers, look_at, quat_to_rotmat, rotmat_to_quat

UP = torch.tensor([0.2, -0.3, 1.0]) / math.sqrt(1.13)  # a world up that is not a coordinate axis
TARGET = torch.tensor([0.5, -0.2, 1.0])


def _orbit_cameras(n: int = 24, radius: float = 3.0) -> torch.Tensor:
    """``n`` cameras on a wobbly circle around TARGET, looking at it up to small aim errors, [n, 4, 4]."""
    gen = torch.Generator().manual_seed(0)
    a = torch.linalg.cross(UP, torch.tensor([1.0, 0.0, 0.0]))
    a = a / a.norm()
    b = torch.linalg.cross(UP, a)
    theta = torch.linspace(0, 2 * math.pi, n + 1)[:-1]
    heights = 1.0 + 0.2 * torch.randn(n, generator=gen)
    positions = TARGET + radius * (theta.cos()[:, None] * a + theta.sin()[:, None] * b) + heights[:, None] * UP
    aims = TARGET + 0.05 * torch.randn(n, 3, generator=gen)
    return look_at(positions, aims, UP)


def _forward_cameras() -> torch.Tensor:
    """A 3x3 grid of cameras in a plane, all converging on a point 5 units ahead, [9, 4, 4]."""
    grid = torch.stack(torch.meshgrid(torch.linspace(-0.5, 0.5, 3), torch.linspace(-0.3, 0.3, 3), indexing="ij"), -1)
    positions = torch.cat([grid.reshape(-1, 2), torch.zeros(9, 1)], dim=1)
    return look_at(positions, torch.tensor([0.0, 0.0, 5.0]), torch.tensor([0.0, -1.0, 0.0]))


def _assert_valid_viewmats(viewmats: torch.Tensor, n: int) -> None:
    assert viewmats.shape == (n, 4, 4)
    assert torch.isfinite(viewmats).all()
    assert torch.equal(viewmats[:, 3], torch.tensor([0.0, 0.0, 0.0, 1.0]).expand(n, 4))
    R = viewmats[:, :3, :3]
    assert torch.allclose(R @ R.transpose(1, 2), torch.eye(3).expand(n, 3, 3), atol=1e-5)
    assert torch.allclose(torch.linalg.det(R), torch.ones(n), atol=1e-5)


def _project(viewmats: torch.Tensor, point: torch.Tensor) -> torch.Tensor:
    """Camera-frame coordinates of ``point [3]`` in every camera, [F, 3]."""
    return viewmats[:, :3, :3] @ point + viewmats[:, :3, 3]


def _rotation_angles(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Angles (radians) between the rotations of viewmats ``a`` and ``b`` [F, 4, 4]."""
    rel = a[:, :3, :3] @ b[:, :3, :3].transpose(1, 2)
    cos = ((rel.diagonal(dim1=1, dim2=2).sum(-1) - 1) / 2).clamp(-1, 1)
    return torch.arccos(cos)


def test_look_at_opencv_convention():
    viewmat = look_at(torch.zeros(1, 3), torch.tensor([0.0, 1.0, 0.0]), torch.tensor([0.0, 0.0, 1.0]))[0]
    # Looking along +y with +z up: camera x (right) is +x, camera y (down) is -z, camera z is +y.
    assert torch.allclose(viewmat[:3, :3], torch.tensor([[1.0, 0, 0], [0, 0, -1], [0, 1, 0]]), atol=1e-6)


def test_focus_point_recovers_target():
    assert torch.allclose(focus_point(_orbit_cameras()), TARGET, atol=0.05)
    with pytest.raises(ValueError, match="parallel"):
        focus_point(look_at(torch.randn(5, 3), torch.randn(5, 3) * 0 + torch.tensor([0, 0, 1e6]), UP))


def test_ellipse_path():
    cams = _orbit_cameras()
    path = ellipse_path(cams, n_frames=60)
    _assert_valid_viewmats(path, 60)
    assert path.dtype == cams.dtype
    local = _project(path, TARGET)  # [F, 3] the scene centre in each frame: straight ahead
    assert (local[:, 2] > 0).all()
    assert (local[:, :2].norm(dim=1) / local[:, 2]).max() < 0.03
    centers = camera_centers(path)
    offsets = centers - TARGET
    heights = offsets @ UP
    assert torch.allclose(heights, torch.full_like(heights, 1.0), atol=0.15)  # the cameras' mean height
    radial = (offsets - heights[:, None] * UP).norm(dim=1)
    assert (radial > 2.6).all() and (radial < 3.3).all()
    assert (-path[:, 1, :3] @ UP > 0.9).all()  # upright: camera up close to the world up
    steps = (centers.roll(-1, 0) - centers).norm(dim=1)  # closed loop, including last -> first
    assert steps.max() < 1.3 * 2 * math.pi * 3.0 / 60
    assert _rotation_angles(path, path.roll(-1, 0)).max() < 1.3 * 2 * math.pi / 60
    assert (centers[0] - camera_centers(cams)[0]).norm() < 0.5  # starts near the first camera


def test_spiral_path():
    cams = _forward_cameras()
    path = spiral_path(cams, n_frames=48, n_rotations=2)
    _assert_valid_viewmats(path, 48)
    local = _project(path, torch.tensor([0.0, 0.0, 5.0]))
    assert (local[:, 2] > 0).all() and (local[:, :2].norm(dim=1) / local[:, 2]).max() < 1e-3
    centers = camera_centers(path)
    assert (centers[:, 0].abs() <= 0.5 + 1e-5).all() and (centers[:, 1].abs() <= 0.3 + 1e-5).all()
    assert centers[:, 0].max() > 0.4 and centers[:, 1].max() > 0.2  # it does sweep the capture area
    assert (centers[1:] - centers[:-1]).norm(dim=1).max() < 0.2


def test_interp_path_passes_through_poses():
    cams = _orbit_cameras(n=6)
    steps = 10
    path = interp_path(cams, n_frames=(len(cams) - 1) * steps + 1)
    _assert_valid_viewmats(path, len(cams) * steps - steps + 1)
    assert torch.allclose(path[::steps], cams, atol=1e-5)
    centers = camera_centers(path)
    spacing = (camera_centers(cams)[1:] - camera_centers(cams)[:-1]).norm(dim=1).max()
    assert (centers[1:] - centers[:-1]).norm(dim=1).max() < 1.5 * spacing / steps
    key_angles = _rotation_angles(cams[1:], cams[:-1]).max()
    assert _rotation_angles(path[1:], path[:-1]).max() < 1.5 * key_angles / steps


def test_interp_path_handles_quaternion_sign_flips():
    # Rotations about the up axis by 0..300 degrees: the quaternion w changes sign along the way.
    angles = torch.linspace(0, 5 * math.pi / 3, 6)
    positions = torch.stack([angles.cos(), angles.sin(), torch.zeros(6)], dim=1) * 2
    cams = look_at(positions, torch.zeros(3), torch.tensor([0.0, 0.0, 1.0]))
    path = interp_path(cams, n_frames=51)
    assert torch.allclose(path[::10], cams, atol=1e-5)
    assert _rotation_angles(path[1:], path[:-1]).max() < 1.5 * (math.pi / 3) / 10


def test_interp_path_needs_two_poses():
    with pytest.raises(ValueError, match="at least 2 poses"):
        interp_path(_orbit_cameras()[:1], n_frames=10)


def test_forward_facing_capture_focuses_at_the_median_point_depth() -> None:
    positions = torch.tensor([[x, y, 0.0] for x in (-0.2, 0.0, 0.2) for y in (-0.1, 0.1)])
    viewmats = look_at(positions, positions + torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0.0, -1.0, 0.0]))
    with pytest.raises(ValueError, match="parallel"):
        focus_point(viewmats)
    points = torch.tensor([[0.0, 0.0, 3.0], [0.1, 0.0, 4.0], [0.0, 0.1, 5.0], [0.0, 0.0, -2.0]])  # one behind
    focus = focus_point(viewmats, points)
    torch.testing.assert_close(focus, torch.tensor([0.0, 0.0, 4.0]), atol=1e-5, rtol=0)
    frames = spiral_path(viewmats, 12, focus=focus)
    assert torch.isfinite(frames).all()


def test_look_at_refuses_a_camera_looking_along_up() -> None:
    with pytest.raises(ValueError, match="up vector"):
        look_at(torch.tensor([[0.0, 0.0, 5.0]]), torch.zeros(3), torch.tensor([0.0, 0.0, 1.0]))


def test_quaternion_rotation_round_trip() -> None:
    quats = torch.nn.functional.normalize(torch.randn(100, 4, generator=torch.Generator().manual_seed(0)), dim=-1)
    quats = quats * quats[:, :1].sign()  # q and -q are the same rotation: compare with w >= 0
    R = quat_to_rotmat(quats * 3.0)  # any norm
    torch.testing.assert_close(R @ R.transpose(1, 2), torch.eye(3).expand(100, 3, 3), atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.linalg.det(R), torch.ones(100), atol=1e-5, rtol=0)
    back = rotmat_to_quat(R)
    torch.testing.assert_close(back * back[:, :1].sign(), quats, atol=1e-5, rtol=0)
