"""The explicit camera model (pinhole | fisheye with k1..k4) of frames, batches and renderers, and the projection
maths written once: the fisheye polynomial (numpy and torch alike) and the pinhole projection."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gsrecon.cameras import PINHOLE, CameraModel, Cameras
from gsrecon.cameras.lens import fisheye_polynomial, pinhole_project
from gsrecon.render.torch_renderer import TorchRenderer

COEFFS = (0.03, -0.01, 0.002, -0.0005)  # k1..k4


def test_a_fisheye_model_needs_k1_to_k4_and_a_pinhole_has_none() -> None:
    assert PINHOLE.kind == "pinhole" and PINHOLE.coeffs is None
    lens = CameraModel.fisheye(torch.tensor(COEFFS))
    assert lens.kind == "fisheye" and lens.coeffs.tolist() == pytest.approx(COEFFS)
    with pytest.raises(ValueError, match="shape \\[3\\]"):
        CameraModel.fisheye(torch.zeros(3))
    with pytest.raises(ValueError, match="got None"):
        CameraModel("fisheye")
    with pytest.raises(ValueError, match="floating-point"):
        CameraModel.fisheye(torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="a pinhole camera model has no coefficients"):
        CameraModel("pinhole", torch.zeros(4))
    with pytest.raises(ValueError, match="'orthographic' is not one of pinhole, fisheye"):
        CameraModel("orthographic")


def test_frames_models_stack_into_a_batch_s_of_one_kind() -> None:
    lenses = [CameraModel.fisheye(torch.tensor(COEFFS)), CameraModel.fisheye(torch.tensor(COEFFS) * 2)]
    batch = CameraModel.stack(lenses)
    assert batch.kind == "fisheye" and batch.coeffs.shape == (2, 4)
    torch.testing.assert_close(batch.coeffs[1], torch.tensor(COEFFS) * 2)
    assert CameraModel.stack([PINHOLE, PINHOLE]).kind == "pinhole"
    with pytest.raises(ValueError, match="one kind; got fisheye and pinhole"):
        CameraModel.stack([lenses[0], PINHOLE])


def _one_gaussian() -> dict[str, torch.Tensor]:
    return {
        "means": torch.tensor([[1.6, 0.0, 2.0]]),  # 39 degrees off axis
        "scales": torch.full((1, 3), math.log(0.05)),
        "quats": torch.tensor([[1.0, 0.0, 0.0, 0.0]]),
        "opacities": torch.tensor([3.0]),
        "sh0": torch.full((1, 1, 3), 2.0),
        "shN": torch.zeros(1, 0, 3),
    }


def test_cameras_check_their_model_and_a_renderer_draws_through_it() -> None:
    Ks = torch.tensor([[[20.0, 0.0, 32.0], [0.0, 20.0, 12.0], [0.0, 0.0, 1.0]]])
    with pytest.raises(ValueError, match=r"coeffs have shape \(2, 4\), expected \(1, 4\)"):
        Cameras(torch.eye(4)[None], Ks, 64, 24, CameraModel.fisheye(torch.zeros(2, 4)))
    with pytest.raises(ValueError, match="model must be a CameraModel, got Tensor"):
        Cameras(torch.eye(4)[None], Ks, 64, 24, torch.zeros(1, 4))
    renderer = TorchRenderer()
    pinhole = renderer.render(_one_gaussian(), Cameras(torch.eye(4)[None], Ks, 64, 24), 0).image
    # A lens with no distortion is an equidistant fisheye, not a pinhole: it draws the Gaussian nearer the centre.
    lens_cameras = Cameras(torch.eye(4)[None], Ks, 64, 24, CameraModel.fisheye(torch.zeros(1, 4)))
    lens = renderer.render(_one_gaussian(), lens_cameras, 0).image
    columns = torch.arange(64) + 0.5
    centroids = [float((img[0, ..., 0].sum(0) * columns).sum() / img[0, ..., 0].sum()) for img in (pinhole, lens)]
    assert centroids == pytest.approx([20.0 * 0.8 + 32.0, 20.0 * math.atan(0.8) + 32.0], abs=0.05)


def test_the_fisheye_polynomial_is_the_same_on_numpy_and_torch_and_its_slope_is_its_derivative() -> None:
    theta = np.linspace(0.0, 1.5, 101)
    theta_d, slope = fisheye_polynomial(theta, COEFFS)
    t = torch.from_numpy(theta).requires_grad_(True)
    t_d, t_slope = fisheye_polynomial(t, [torch.tensor(k, dtype=torch.float64) for k in COEFFS])
    np.testing.assert_array_equal(t_d.detach().numpy(), theta_d)
    np.testing.assert_array_equal(t_slope.detach().numpy(), slope)
    (derivative,) = torch.autograd.grad(t_d.sum(), t)
    np.testing.assert_allclose(derivative.numpy(), slope, rtol=1e-12)
    k1, k2, k3, k4 = COEFFS
    expected = theta * (1 + k1 * theta**2 + k2 * theta**4 + k3 * theta**6 + k4 * theta**8)
    np.testing.assert_allclose(theta_d, expected, rtol=1e-14)


def test_the_pinhole_projection_is_k_times_the_point_over_its_depth_on_numpy_and_torch() -> None:
    K = np.array([[50.0, 0.0, 31.5], [0.0, 52.0, 23.5], [0.0, 0.0, 1.0]])
    points = np.random.default_rng(0).normal(size=(40, 3)) + np.array([0.0, 0.0, 4.0])  # [N, 3], z > 0
    u, v, pixel_x, pixel_y = pinhole_project(*points.T, K)
    homogeneous = points @ K.T  # [N, 3]
    np.testing.assert_allclose(np.stack([pixel_x, pixel_y], -1), homogeneous[:, :2] / homogeneous[:, 2:], rtol=1e-12)
    np.testing.assert_allclose(np.stack([u, v], -1), points[:, :2] / points[:, 2:], rtol=1e-15)
    cameras = torch.from_numpy(np.stack([K, 2 * K]))  # [2, 3, 3]: per camera intrinsics against points [2, N]
    on_torch = pinhole_project(*torch.from_numpy(points).T.unsqueeze(1).expand(3, 2, -1), cameras)
    np.testing.assert_array_equal(on_torch.pixel_x[0].numpy(), pixel_x)
    np.testing.assert_array_equal(on_torch.pixel_y[1].numpy(), 2 * pixel_y)  # scaling by 2 is exact


def test_cameras_are_one_value_indexed_moved_and_checked() -> None:
    viewmats = torch.eye(4).repeat(3, 1, 1)  # [3, 4, 4]
    viewmats[:, 0, 3] = torch.arange(3.0)
    Ks = torch.tensor([[20.0, 0.0, 8.0], [0.0, 20.0, 6.0], [0.0, 0.0, 1.0]]).repeat(3, 1, 1)
    coeffs = torch.arange(12.0).reshape(3, 4) / 100
    cameras = Cameras(viewmats, Ks, 16, 12, CameraModel.fisheye(coeffs))
    assert len(cameras) == 3 and (cameras.width, cameras.height) == (16, 12)
    second = cameras[1]  # one camera stays a batch of one, its lens coefficients with it
    assert len(second) == 1 and torch.equal(second.viewmats[0], viewmats[1])
    assert torch.equal(second.model.coeffs, coeffs[1:2]) and second.model.kind == "fisheye"
    assert torch.equal(cameras[-1].viewmats, viewmats[2:]) and len(cameras[:2]) == 2
    with pytest.raises(IndexError, match="camera 3 of 3"):
        cameras[3]
    moved = cameras.with_viewmats(viewmats * 2)
    assert torch.equal(moved.viewmats, viewmats * 2) and moved.Ks is cameras.Ks and moved.model is cameras.model
    assert cameras.to("cpu").viewmats.device.type == "cpu"
    with pytest.raises(ValueError, match=r"Ks has shape \(2, 3, 3\), expected \(3, 3, 3\)"):
        Cameras(viewmats, Ks[:2], 16, 12)
    with pytest.raises(ValueError, match=r"viewmats has shape \(4, 4\), expected \(B, 4, 4\)"):
        Cameras(viewmats[0], Ks, 16, 12)
    with pytest.raises(ValueError, match="image size must be positive"):
        Cameras(viewmats, Ks, 0, 12)
