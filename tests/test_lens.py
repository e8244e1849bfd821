"""Training through a fisheye lens (``data.fisheye: lens``): the lens projection, the torch renderer through it,
the loaders keeping fisheye frames as shot, and a fisheye capture trained and evaluated from the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_yaml
from test_fisheye import (
    CAPTURE_K,
    FISHEYE,
    H,
    K,
    W,
    _render_fisheye,
    _write_fisheye_transforms,
    write_synthetic_capture,
)

from gsrecon.cameras import CameraModel, Cameras
from gsrecon.cameras.lens import fisheye_project, max_lens_angle
from gsrecon.cli import main
from gsrecon.data.formats.lens import distort, undistorted_intrinsics
from gsrecon.data.readers.transforms import load_transforms
from gsrecon.render.torch_renderer import TorchRenderer
from gsrecon.strategy.default import DefaultStrategy

COEFFS = torch.tensor([[FISHEYE.k1, FISHEYE.k2, FISHEYE.k3, FISHEYE.k4]], dtype=torch.float64)  # [1, 4]
K64 = torch.from_numpy(K)[None]  # [1, 3, 3] float64
LENS = CameraModel.fisheye(COEFFS.float())  # one camera through the lens


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GSRECON_CACHE", str(tmp_path / "cache"))


def _points() -> torch.Tensor:
    """Camera-space points [1, N, 3] up to ~80 degrees off axis, with some on and next to the optical axis."""
    generator = torch.Generator().manual_seed(0)
    points = torch.randn(1, 300, 3, dtype=torch.float64, generator=generator)
    points[..., 2] = points[..., 2].abs() + 0.3
    points[0, :3] = torch.tensor([[0.0, 0.0, 2.0], [1e-6, -2e-6, 1.0], [2e-3, 1e-3, 0.7]], dtype=torch.float64)
    return points


def test_lens_projection_is_the_fisheye_model_of_the_undistortion() -> None:
    points = _points()
    projected = fisheye_project(points, K64, COEFFS, near_plane=0.01).means2d[0].numpy()  # [N, 2]
    x, y = (points[0, :, :2] / points[0, :, 2:]).numpy().T
    xd, yd = distort(x, y, FISHEYE)  # the model the loaders undistort with
    np.testing.assert_allclose(projected[:, 0], K[0, 0] * xd + K[0, 2], atol=1e-9)
    np.testing.assert_allclose(projected[:, 1], K[1, 1] * yd + K[1, 2], atol=1e-9)


def test_lens_jacobian_is_the_derivative_of_the_projection_also_on_the_axis() -> None:
    points = _points()
    lens = fisheye_project(points, K64, COEFFS, near_plane=0.01)
    for i in range(points.shape[1]):
        expected = torch.autograd.functional.jacobian(
            lambda p: fisheye_project(p[None, None], K64, COEFFS, 0.01).means2d[0, 0], points[0, i]
        )  # [2, 3]
        ours = torch.stack([lens.jacobian_u[0, i], lens.jacobian_v[0, i]])
        torch.testing.assert_close(ours, expected, rtol=1e-6, atol=1e-6 * expected.abs().max().item())


def test_points_past_the_angle_where_the_lens_folds_back_are_outside_it() -> None:
    folding = torch.tensor([[-0.3, 0.0, 0.0, 0.0]], dtype=torch.float64)  # d theta_d / d theta = 1 - 0.9 theta^2
    assert max_lens_angle(folding).item() == pytest.approx(math.sqrt(1 / 0.9), abs=2e-3)
    assert max_lens_angle(COEFFS).item() == pytest.approx(math.pi / 2)  # this lens grows up to 90 degrees
    angles = torch.tensor([0.5, 1.0, 1.1, 1.4], dtype=torch.float64)
    points = torch.stack([torch.sin(angles), torch.zeros(4, dtype=torch.float64), torch.cos(angles)], -1)[None]
    assert fisheye_project(points, K64, folding, 0.01).in_lens[0].tolist() == [True, True, False, False]


def _one_gaussian(position: list[float]) -> dict[str, torch.Tensor]:
    """A small bright Gaussian at a world ``position`` (identity camera pose: camera space)."""
    return {
        "means": torch.tensor([position]),
        "scales": torch.full((1, 3), math.log(0.01)),
        "quats": torch.tensor([[1.0, 0.0, 0.0, 0.0]]),
        "opacities": torch.tensor([3.0]),
        "sh0": torch.full((1, 1, 3), 2.0),
        "shN": torch.zeros(1, 0, 3),
    }


def test_a_gaussian_is_drawn_where_the_lens_sees_its_centre() -> None:
    position = [0.9, -0.5, 1.0]  # 46 degrees off axis
    params = _one_gaussian(position)
    renderer = TorchRenderer()
    Ks, viewmats, background = torch.from_numpy(K).float()[None], torch.eye(4)[None], torch.zeros(1, 3)
    image = renderer.render(params, Cameras(viewmats, Ks, W, H, LENS), 0, background).image[0, ..., 0]  # [H, W]
    v, u = torch.meshgrid(torch.arange(H) + 0.5, torch.arange(W) + 0.5, indexing="ij")
    centroid = [float((u * image).sum() / image.sum()), float((v * image).sum() / image.sum())]
    xd, yd = distort(np.array(position[0]), np.array(position[1]), FISHEYE)
    assert centroid == pytest.approx([K[0, 0] * xd + K[0, 2], K[1, 1] * yd + K[1, 2]], abs=0.05)
    pinhole = renderer.render(params, Cameras(viewmats, Ks, W, H), 0, background).image[0, ..., 0]
    assert float((u * pinhole).sum() / pinhole.sum()) > centroid[0] + 5  # the pinhole sees it farther out


def test_gradients_through_the_lens_are_finite_with_a_gaussian_on_the_axis() -> None:
    generator = torch.Generator().manual_seed(1)
    n = 200
    params = {
        "means": torch.randn(n, 3, generator=generator) * 0.5 + torch.tensor([0.0, 0.0, 2.0]),
        "scales": torch.full((n, 3), math.log(0.05)),
        "quats": torch.randn(n, 4, generator=generator),
        "opacities": torch.zeros(n),
        "sh0": torch.rand(n, 1, 3, generator=generator),
        "shN": torch.zeros(n, 3, 3),
    }
    params["means"][0] = torch.tensor([0.0, 0.0, 1.5])  # exactly on the optical axis
    params = {k: v.requires_grad_(True) for k, v in params.items()}
    out = TorchRenderer().render(
        params, Cameras(torch.eye(4)[None], torch.from_numpy(K).float()[None], W, H, LENS), 1, torch.zeros(1, 3)
    )
    out.image.sum().backward()
    assert out.info["radii"][0, 0].max() > 0
    for name, value in params.items():
        assert torch.isfinite(value.grad).all(), name
    assert params["means"].grad[0].abs().sum() > 0
    assert torch.isfinite(out.info["means2d"].grad).all()


def test_a_fisheye_capture_is_kept_as_shot_with_data_fisheye_lens(tmp_path: Path) -> None:
    _write_fisheye_transforms(tmp_path, k1=FISHEYE.k1, k2=FISHEYE.k2, k3=FISHEYE.k3, k4=FISHEYE.k4)
    kept = load_transforms(str(tmp_path), eval_split="none", keep_fisheye=True).train[0]
    np.testing.assert_allclose(kept.K.numpy(), K, rtol=1e-6)
    assert kept.camera_model.kind == "fisheye"
    np.testing.assert_allclose(kept.camera_model.coeffs.numpy(), COEFFS[0].numpy(), rtol=1e-6)
    np.testing.assert_array_equal(kept.image.numpy(), _render_fisheye(K, FISHEYE))  # the file's pixels
    assert kept.source.startswith("as stored, ") and kept.source.endswith(" degrees through the fisheye lens")
    undistorted = load_transforms(str(tmp_path), eval_split="none").train[0]  # the default: a pinhole image
    assert undistorted.camera_model.kind == "pinhole" and undistorted.camera_model.coeffs is None
    np.testing.assert_allclose(undistorted.K.numpy(), undistorted_intrinsics(K, FISHEYE, W, H), rtol=1e-5)


def test_default_strategy_refuses_a_render_without_screen_space_gradients() -> None:
    """gsplat's unscented transform (fisheye frames on CUDA) gives no gradient of the projected centres."""
    strategy = DefaultStrategy(DefaultStrategy.Config())
    info = {"means2d": torch.zeros(1, 5, 2)}
    with pytest.raises(ValueError, match="strategy.name=mcmc, renderer.name=torch or data.fisheye=undistort"):
        strategy.step_pre_backward({}, {}, strategy.initialize_state(1.0), 0, info)


def _capture_config(tmp_path: Path, make_config, capture: Path, **data) -> Path:
    cfg = make_config(
        max_steps=300,
        val_interval=300,
        data={"dataset": "blender", "path": str(capture), "eval_split": "every_8", **data},
        model={"sh_degree": 1, "init": "auto"},
        strategy={"name": "default", "refine_start": 100, "refine_every": 100},
    )
    return write_yaml(tmp_path / "capture.yaml", cfg)


@pytest.mark.slow  # 44 s on the 2 loaded cores: CI's slow run (the default run stays under 5 min)
def test_cli_trains_and_evaluates_a_fisheye_capture_through_its_lens(
    tmp_path: Path, make_config, capsys: pytest.CaptureFixture
) -> None:
    capture = tmp_path / "fisheye"
    write_synthetic_capture(capture, True, tmp_path / "synthetic")
    config = _capture_config(tmp_path, make_config, capture, fisheye="lens")
    assert main(["train", "--config", str(config)]) == 0
    exp_dir = tmp_path / "run"
    assert "through the fisheye lens" in (exp_dir / "train.log").read_text()
    trained = json.loads((exp_dir / "metrics.json").read_text())["mean"]["psnr"]
    assert trained > 23.0  # 26.0 dB measured after 300 steps
    assert main(["eval", "--exp-dir", str(exp_dir)]) == 0
    cameras = json.loads((exp_dir / "eval" / "cameras.json").read_text())
    assert cameras and all(c["fisheye_k1_k4"] == pytest.approx(COEFFS[0].tolist()) for c in cameras)
    np.testing.assert_allclose(cameras[0]["K"], CAPTURE_K, rtol=1e-6)  # the lens's own intrinsics
    assert json.loads((exp_dir / "eval" / "metrics.json").read_text())["mean"]["psnr"] == pytest.approx(trained)


def test_cli_unknown_fisheye_mode_is_one_line_and_exit_2(
    tmp_path: Path, make_config, capsys: pytest.CaptureFixture
) -> None:
    capture = tmp_path / "scene"
    _write_fisheye_transforms(capture)
    assert main(["train", "--config", str(_capture_config(tmp_path, make_config, capture, fisheye="raw"))]) == 2
    err = capsys.readouterr().err.strip()
    assert "data.fisheye" in err and "'raw'" in err and len(err.splitlines()) == 1
