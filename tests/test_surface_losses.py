"""The surface terms: flat Gaussians (flatten) and rendered normals that agree with the depth's (depth_normal)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import read_scalars

from gsrecon.cameras import Cameras
from gsrecon.losses.depth_normal import DepthNormalTerm, depth_normals, gaussian_normals
from gsrecon.losses.flatten import flatten_loss
from gsrecon.render.torch_renderer import TorchRenderer
from gsrecon.sh import rgb_to_sh

torch.set_num_threads(1)


def _disc(normal_angle: float) -> dict[str, torch.Tensor]:
    """One opaque disc 2 m in front of the camera, its normal tilted by ``normal_angle`` about the camera's y axis."""
    half = normal_angle / 2
    return {
        "means": torch.tensor([[0.0, 0.0, 2.0]]),
        "scales": torch.log(torch.tensor([[0.3, 0.3, 0.001]])),
        "quats": torch.tensor([[math.cos(half), 0.0, math.sin(half), 0.0]]),  # rotates z (the normal) about y
        "opacities": torch.tensor([5.0]),
        "sh0": rgb_to_sh(torch.tensor([[[0.5, 0.5, 0.5]]])),
        "shN": torch.zeros(1, 0, 3),
    }


def test_flatten_is_the_mean_smallest_scale() -> None:
    log_scales = torch.log(torch.tensor([[0.1, 0.02, 0.3], [0.5, 0.4, 0.2]]))
    assert flatten_loss(log_scales).item() == pytest.approx((0.02 + 0.2) / 2)


def test_depth_normals_of_a_tilted_plane_and_gaussian_normals_face_the_camera() -> None:
    K = torch.tensor([[50.0, 0.0, 16.0], [0.0, 50.0, 12.0], [0.0, 0.0, 1.0]])
    xs = (torch.arange(32) + 0.5).expand(24, 32)
    # The plane z = 2 + 0.5 x (camera space): along a pixel ray, z = 2 / (1 - 0.5 (u - cx) / fx).
    depth = 2.0 / (1.0 - 0.5 * (xs - 16.0) / 50.0)
    expected = torch.nn.functional.normalize(torch.tensor([0.5, 0.0, -1.0]), dim=0)  # facing the camera
    torch.testing.assert_close(depth_normals(depth, K)[5:-5, 5:-5], expected.expand(14, 22, 3), atol=1e-4, rtol=0)
    viewmat = torch.eye(4)
    for angle in (0.3, math.pi - 0.3):  # the same disc seen from its back: still toward the camera
        normal = gaussian_normals(_disc(angle), viewmat)[0]
        assert normal[2].item() == pytest.approx(-math.cos(0.3), abs=1e-6)


def test_depth_normal_term_is_zero_for_a_disc_facing_the_camera_and_turns_a_tilted_one() -> None:
    from gsrecon.data.pipeline import Batch
    from gsrecon.losses.base import LossInputs

    renderer = TorchRenderer()
    K = torch.tensor([[[40.0, 0.0, 16.0], [0.0, 40.0, 12.0], [0.0, 0.0, 1.0]]])
    batch = Batch(torch.zeros(1, 24, 32, 3), Cameras(torch.eye(4)[None], K, 32, 24), torch.zeros(1, 3), ["v"])
    term = DepthNormalTerm(DepthNormalTerm.Config())
    values = {}
    for angle in (0.0, 0.6):
        params = {k: v.clone().requires_grad_() for k, v in _disc(angle).items()}
        out = renderer.render_batch(params, batch, 0)
        value = term(LossInputs(out.image, out, batch, None, params, renderer))
        values[angle] = value.item()
        if angle:
            value.backward()
            assert params["quats"].grad.abs().sum() > 0  # it turns the disc
    assert values[0.0] < 1e-4  # one Gaussian's depth is flat: its depth normal faces the camera, as the disc does
    assert values[0.6] == pytest.approx(1 - math.cos(0.6), abs=0.02)


def test_training_with_the_surface_terms_logs_them_and_flattens(make_trainer) -> None:
    plain = make_trainer("plain", max_steps=8)
    plain.train()
    surface = make_trainer("surface", max_steps=8, loss={"flatten": {"weight": 1000.0}, "depth_normal": {}})
    surface.train()
    assert set(read_scalars(surface.exp_dir, "train/loss/flatten")) and read_scalars(
        surface.exp_dir, "train/loss/depth_normal"
    )
    smallest = {t.exp_dir.name: flatten_loss(t.model.params["scales"]).item() for t in (plain, surface)}
    assert smallest["surface"] < 0.98 * smallest["plain"]  # Adam moves a log-scale by at most about 0.005 a step
