"""Fisheye cameras: the equidistant polynomial model, its undistortion to a pinhole, and the loaders using it."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_yaml
from PIL import Image

from gsrecon.cli import main
from gsrecon.data.errors import DatasetError
from gsrecon.data.formats.colmap_model import ColmapCamera
from gsrecon.data.formats.lens import (
    FISHEYE_MAX_ANGLE,
    Distortion,
    camera_intrinsics,
    describe_crop,
    distort,
    intrinsics_matrix,
    undistort_image,
    undistort_points,
    undistorted_intrinsics,
)
from gsrecon.data.readers.synthetic import SyntheticConfig, load_synthetic, orbit_viewmats, render_view
from gsrecon.data.readers.transforms import OPENGL_TO_OPENCV, load_transforms
from gsrecon.engine.evaluator import evaluate_views
from gsrecon.io.ply import write_points_ply
from gsrecon.metrics import mean_metrics

W, H = 96, 72
K = intrinsics_matrix(30.0, 30.5, 48.7, 35.2)  # ~180 degrees across the width
FISHEYE = Distortion(k1=0.03, k2=-0.01, k3=0.002, k4=-0.0005, fisheye=True)


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GSRECON_CACHE", str(tmp_path / "cache"))


def _theta_of(theta_d: np.ndarray, dist: Distortion) -> np.ndarray:
    """Undistorted angle by bisection on the fisheye polynomial (independent of the library's Newton)."""
    lo, hi = np.zeros_like(theta_d), np.full_like(theta_d, math.pi)
    ks = (dist.k1, dist.k2, dist.k3, dist.k4)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        value = mid * (1 + sum(k * mid ** (2 * i + 2) for i, k in enumerate(ks)))
        lo, hi = np.where(value < theta_d, mid, lo), np.where(value < theta_d, hi, mid)
    return 0.5 * (lo + hi)


def _pattern_of_rays(dx: np.ndarray, dy: np.ndarray, dz: np.ndarray) -> np.ndarray:
    """A smooth colour [..., 3] of unit ray directions (no aliasing however wide the view)."""
    return np.stack(
        [127.5 + 127.5 * np.sin(4 * dx) * np.cos(3 * dy), 127.5 + 127.5 * np.sin(5 * dy), 127.5 + 100 * dz], -1
    )


def _render_fisheye(K_: np.ndarray, dist: Distortion) -> np.ndarray:
    """The ray pattern seen by a W x H fisheye camera, uint8 [H, W, 3]."""
    u, v = np.meshgrid(np.arange(W) + 0.5, np.arange(H) + 0.5)
    xd, yd = (u - K_[0, 2]) / K_[0, 0], (v - K_[1, 2]) / K_[1, 1]
    rd = np.hypot(xd, yd)
    theta = _theta_of(rd, dist)
    s = np.sin(theta) / np.maximum(rd, 1e-12)
    return np.clip(np.rint(_pattern_of_rays(xd * s, yd * s, np.cos(theta))), 0, 255).astype(np.uint8)


def _render_pinhole(K_: np.ndarray) -> np.ndarray:
    u, v = np.meshgrid(np.arange(W) + 0.5, np.arange(H) + 0.5)
    x, y = (u - K_[0, 2]) / K_[0, 0], (v - K_[1, 2]) / K_[1, 1]
    n = np.sqrt(x * x + y * y + 1)
    return np.clip(np.rint(_pattern_of_rays(x / n, y / n, 1 / n)), 0, 255).astype(np.uint8)


def test_undistort_points_inverts_fisheye_distort() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-3, 3, (2, 500))  # up to ~77 degrees off axis
    xd, yd = distort(x, y, FISHEYE)
    xu, yu = undistort_points(xd, yd, FISHEYE)
    np.testing.assert_allclose(np.stack([xu, yu]), np.stack([x, y]), atol=1e-9)
    r = np.hypot(x, y)
    np.testing.assert_allclose(np.hypot(xd, yd), _theta_d(np.arctan(r)), rtol=1e-12)


def _theta_d(theta: np.ndarray) -> np.ndarray:
    d = FISHEYE
    return theta * (1 + d.k1 * theta**2 + d.k2 * theta**4 + d.k3 * theta**6 + d.k4 * theta**8)


def test_widest_pinhole_stays_inside_the_fisheye_image_and_caps_the_angle() -> None:
    K_new = undistorted_intrinsics(K, FISHEYE, W, H)
    assert K_new[0, 2] == K[0, 2] and K_new[1, 2] == K[1, 2]
    assert K_new[0, 0] < K[0, 0]  # wider than the fisheye's own focal length: a pinhole must zoom out
    u, v = np.meshgrid(np.arange(W) + 0.5, np.arange(H) + 0.5)
    x, y = (u - K_new[0, 2]) / K_new[0, 0], (v - K_new[1, 2]) / K_new[1, 1]
    xd, yd = distort(x, y, FISHEYE)
    src_u, src_v = xd * K[0, 0] + K[0, 2], yd * K[1, 1] + K[1, 2]
    assert src_u.min() >= 0.5 - 1e-6 and src_u.max() <= W - 0.5 + 1e-6
    assert src_v.min() >= 0.5 - 1e-6 and src_v.max() <= H - 0.5 + 1e-6
    assert np.arctan(np.hypot(x, y)).max() <= FISHEYE_MAX_ANGLE + 1e-9  # the 180-degree lens is cropped


def test_undistorted_fisheye_matches_a_pinhole_render() -> None:
    fisheye = _render_fisheye(K, FISHEYE)
    K_new = undistorted_intrinsics(K, FISHEYE, W, H)
    straight = undistort_image(fisheye, K, FISHEYE, K_new)
    expected = _render_pinhole(K_new)
    error = np.abs(straight.astype(float) - expected.astype(float))
    mse = float(np.mean(error**2))
    assert 10 * math.log10(255**2 / mse) > 35.0
    assert np.median(error) <= 2.0


@pytest.mark.parametrize(
    "model, params, expected",
    [
        ("SIMPLE_RADIAL_FISHEYE", [30, 48, 35, 0.1], Distortion(k1=0.1, fisheye=True)),
        ("RADIAL_FISHEYE", [30, 48, 35, 0.1, 0.02], Distortion(k1=0.1, k2=0.02, fisheye=True)),
        (
            "OPENCV_FISHEYE",
            [30, 31, 48, 35, 0.1, 0.02, 0.003, 0.0004],
            Distortion(0.1, 0.02, 0.003, k4=0.0004, fisheye=True),
        ),
    ],
)
def test_colmap_fisheye_models(model: str, params: list[float], expected: Distortion) -> None:
    _, dist = camera_intrinsics(ColmapCamera(3, model, W, H, np.array(params, float)), "cameras.txt")
    assert dist == expected


def test_colmap_fisheye_with_too_few_params_names_file_and_camera() -> None:
    camera = ColmapCamera(5, "OPENCV_FISHEYE", W, H, np.ones(6))
    with pytest.raises(
        DatasetError, match=r"^sparse/cameras\.txt: camera 5 \(OPENCV_FISHEYE\) has 6 parameters, expected 8$"
    ):
        camera_intrinsics(camera, "sparse/cameras.txt")


def _write_fisheye_transforms(root: Path, **fields) -> None:
    """A nerfstudio capture of two fisheye frames rendered from the ray pattern."""
    (root / "images").mkdir(parents=True)
    frames = []
    for i in range(2):
        Image.fromarray(_render_fisheye(K, FISHEYE)).save(root / "images" / f"f{i}.png")
        c2w = np.eye(4)
        c2w[0, 3] = 0.1 * i
        frames.append({"file_path": f"images/f{i}.png", "transform_matrix": c2w.tolist()})
    intrinsics = {"fl_x": K[0, 0], "fl_y": K[1, 1], "cx": K[0, 2], "cy": K[1, 2], "w": W, "h": H}
    content = intrinsics | {"camera_model": "OPENCV_FISHEYE", "frames": frames} | fields
    (root / "transforms.json").write_text(json.dumps(content))


def test_nerfstudio_opencv_fisheye_is_undistorted_to_the_widest_pinhole(tmp_path: Path) -> None:
    coefficients = {"k1": FISHEYE.k1, "k2": FISHEYE.k2, "k3": FISHEYE.k3, "k4": FISHEYE.k4}
    _write_fisheye_transforms(tmp_path, **coefficients)
    frames = load_transforms(str(tmp_path), eval_split="none").train
    K_new = undistorted_intrinsics(K, FISHEYE, W, H)
    for frame in frames:
        np.testing.assert_allclose(frame.K.numpy(), K_new, rtol=1e-5)
        expected = _render_pinhole(K_new).astype(float)
        assert frame.image.dtype == torch.uint8
        mse = float(np.mean((frame.image.numpy().astype(float) - expected) ** 2))
        assert 10 * math.log10(255**2 / mse) > 35.0


def test_the_first_log_line_says_how_much_of_the_fisheye_view_is_kept(tmp_path: Path) -> None:
    _write_fisheye_transforms(tmp_path, k1=FISHEYE.k1, k2=FISHEYE.k2, k3=FISHEYE.k3, k4=FISHEYE.k4)
    frame = load_transforms(str(tmp_path), eval_split="none").train[0]
    K_new = undistorted_intrinsics(K, FISHEYE, W, H)
    (fx, fy), (cx, cy) = np.diag(K)[:2], K[:2, 2]
    lens = [
        math.degrees(_theta_of(np.array([c / f, (n - c) / f]), FISHEYE).sum()) for f, c, n in [(fx, cx, W), (fy, cy, H)]
    ]
    kept = [
        math.degrees(math.atan(c / f) + math.atan((n - c) / f))
        for f, c, n in [(K_new[0, 0], cx, W), (K_new[1, 1], cy, H)]
    ]
    assert lens[0] > 2 * math.degrees(FISHEYE_MAX_ANGLE) > kept[0]  # a 178-degree lens, cropped
    assert frame.source == (
        f"as stored, undistorted (kept {kept[0]:.0f}x{kept[1]:.0f} degrees of the lens's {lens[0]:.0f}x{lens[1]:.0f})"
    )


def test_a_fisheye_whose_borders_lie_past_its_polynomial_is_described_without_an_angle() -> None:
    folding = Distortion(k1=-0.3, fisheye=True)  # theta_d peaks at 0.70 rad; the borders are at 1.2-1.6
    text = describe_crop(K, folding, undistorted_intrinsics(K, folding, W, H), W, H)
    assert text.endswith("degrees of a view whose borders lie past the lens model")


def test_nerfstudio_fisheye_without_k_params_is_the_plain_equidistant_lens(tmp_path: Path) -> None:
    _write_fisheye_transforms(tmp_path)  # nerfstudio's defaults: k1..k4 = 0
    frame = load_transforms(str(tmp_path), eval_split="none").train[0]
    np.testing.assert_allclose(frame.K.numpy(), undistorted_intrinsics(K, Distortion(fisheye=True), W, H), rtol=1e-5)


def test_cli_bad_fisheye_camera_is_one_line_and_exit_2(
    tmp_path: Path, make_config, capsys: pytest.CaptureFixture
) -> None:
    _write_fisheye_transforms(tmp_path / "scene", k4="wide")
    cfg = make_config(data={"dataset": "blender", "path": str(tmp_path / "scene")})
    assert main(["train", "--config", str(write_yaml(tmp_path / "c.yaml", cfg))]) == 2
    err = capsys.readouterr().err.strip()
    assert "transforms.json" in err and "k4" in err and len(err.splitlines()) == 1


# An action camera orbiting the synthetic scene: a 125x104-degree fisheye (corners 78 degrees off axis).
CAPTURE = SyntheticConfig(width=96, height=72, num_views=24, orbit_radius=3.0, supersample=2, num_points=3000)
CAPTURE_K = intrinsics_matrix(42.9, 42.9, 48.0, 36.0)


def write_synthetic_capture(root: Path, fisheye: bool, cache: Path) -> None:
    """A nerfstudio capture of the synthetic scene seen through the ``CAPTURE_K`` fisheye lens (``OPENCV_FISHEYE``)
    or through the pinhole camera that its undistorted images have (``PINHOLE``), with the scene's points."""
    K_pinhole = undistorted_intrinsics(CAPTURE_K, FISHEYE, CAPTURE.width, CAPTURE.height)
    fov = math.degrees(2 * math.atan(CAPTURE.width / 2 / K_pinhole[0, 0]))
    cfg = dataclasses.replace(CAPTURE, fov_deg=fov, cache_dir=str(cache))
    K, lens = (CAPTURE_K, FISHEYE) if fisheye else (K_pinhole, None)
    (root / "images").mkdir(parents=True)
    frames = []
    for i, viewmat in enumerate(orbit_viewmats(cfg)):
        Image.fromarray(render_view(viewmat, K, cfg, lens)).save(root / "images" / f"{i:03d}.png")
        c2w = np.linalg.inv(viewmat) @ OPENGL_TO_OPENCV
        frames.append({"file_path": f"images/{i:03d}.png", "transform_matrix": c2w.tolist()})
    scene = load_synthetic(cfg, eval_split="none")  # its points: sampled on the surfaces these cameras see
    write_points_ply(root / "points.ply", scene.points.numpy(), np.rint(scene.colors.numpy() * 255).astype(np.uint8))
    coefficients = {"k1": FISHEYE.k1, "k2": FISHEYE.k2, "k3": FISHEYE.k3, "k4": FISHEYE.k4} if fisheye else {}
    (root / "transforms.json").write_text(
        json.dumps(
            {"camera_model": "OPENCV_FISHEYE" if fisheye else "PINHOLE", "ply_file_path": "points.ply"}
            | {"fl_x": K[0, 0], "fl_y": K[1, 1], "cx": K[0, 2], "cy": K[1, 2], "w": cfg.width, "h": cfg.height}
            | coefficients
            | {"frames": frames}
        )
    )


@pytest.mark.slow  # 9 s on the 2 loaded cores: CI's slow run (the default run stays under 5 min)
def test_the_synthetic_fisheye_capture_undistorts_to_its_pinhole_twin(tmp_path: Path) -> None:
    """The fisheye capture, read and undistorted, shows what the pinhole capture shows (the training test's premise)."""
    for fisheye in (True, False):
        write_synthetic_capture(tmp_path / str(fisheye), fisheye, tmp_path / "synthetic")
    fisheye, pinhole = (load_transforms(str(tmp_path / str(f)), eval_split="none").train for f in (True, False))
    for a, b in zip(fisheye, pinhole, strict=True):
        np.testing.assert_allclose(a.K.numpy(), b.K.numpy(), rtol=1e-5)
        mse = float(np.mean((a.image.numpy().astype(float) - b.image.numpy().astype(float)) ** 2))
        assert 10 * math.log10(255**2 / mse) > 30.0  # 32.3-35.9 dB: the resampling blur


@pytest.mark.slow
def test_a_fisheye_capture_trains_within_1_db_of_the_same_capture_through_a_pinhole(
    tmp_path: Path, make_trainer
) -> None:
    """1500 steps from the scene's points; both scenes are scored on the pinhole capture's held-out views (every
    8th), the true images of the same cameras (30.1 and 30.0 dB measured)."""
    trainers = {}
    for lens in ("pinhole", "fisheye"):
        write_synthetic_capture(tmp_path / lens, lens == "fisheye", tmp_path / "synthetic")
        trainers[lens] = make_trainer(
            f"run_{lens}",
            max_steps=1500,
            val_interval=1500,
            data={"dataset": "blender", "path": str(tmp_path / lens), "eval_split": "every_8"},
            model={"init": "auto"},
        )
        trainers[lens].train()
    fisheye, pinhole = trainers["fisheye"], trainers["pinhole"]
    on_true_views = mean_metrics(evaluate_views(fisheye.render, pinhole.datapipeline.val_batches(), fisheye.metrics))
    print(f"pinhole {pinhole.val_metrics['psnr']:.2f} dB, fisheye on the same views {on_true_views['psnr']:.2f} dB")
    assert pinhole.val_metrics["psnr"] > 25.0
    assert on_true_views["psnr"] > pinhole.val_metrics["psnr"] - 1.0
