"""Undistortion: camera models to pinhole, and distorted renderings of a known pattern coming back straight."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from gsrecon.data.errors import DatasetError
from gsrecon.data.formats.colmap_model import ColmapCamera
from gsrecon.data.formats.lens import (
    Distortion,
    camera_intrinsics,
    distort,
    fov_to_focal,
    intrinsics_matrix,
    undistort_image,
    undistort_points,
    undistorted_intrinsics,
)

W, H = 160, 120
K = intrinsics_matrix(140.0, 138.0, 83.2, 57.9)  # principal point off the image centre on purpose
PERIOD = 14.0  # pixels (at K's focal length) per cycle of the test pattern

DISTORTIONS = {
    "SIMPLE_RADIAL barrel": Distortion(k1=-0.25),
    "RADIAL pincushion": Distortion(k1=0.2, k2=0.05),
    "OPENCV": Distortion(k1=-0.15, k2=0.03, p1=0.01, p2=-0.008),
}


def _pattern(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A smooth grid pattern [..., 3] (uint8-ranged float) of undistorted normalised coordinates."""
    gx = np.sin(2 * np.pi * x * K[0, 0] / PERIOD)
    gy = np.sin(2 * np.pi * y * K[1, 1] / PERIOD)
    return np.stack([127.5 + 127.5 * gx * gy, 127.5 + 127.5 * gx, 127.5 + 127.5 * gy], axis=-1)


def _invert_newton(xd: np.ndarray, yd: np.ndarray, dist: Distortion) -> tuple[np.ndarray, np.ndarray]:
    """Undistorted coordinates by Newton's method with a finite-difference Jacobian (independent of the library)."""
    x, y, eps = xd.copy(), yd.copy(), 1e-7
    for _ in range(20):
        fx, fy = distort(x, y, dist)
        rx, ry = fx - xd, fy - yd
        ax, ay = distort(x + eps, y, dist)
        bx, by = distort(x, y + eps, dist)
        j11, j21, j12, j22 = (ax - fx) / eps, (ay - fy) / eps, (bx - fx) / eps, (by - fy) / eps
        det = j11 * j22 - j12 * j21
        x, y = x - (j22 * rx - j12 * ry) / det, y - (-j21 * rx + j11 * ry) / det
    return x, y


def _render(K_: np.ndarray, dist: Distortion | None) -> np.ndarray:
    """The pattern seen by a W x H camera with intrinsics K_ and (optionally) lens distortion, uint8 [H, W, 3]."""
    u, v = np.meshgrid(np.arange(W) + 0.5, np.arange(H) + 0.5)
    x, y = (u - K_[0, 2]) / K_[0, 0], (v - K_[1, 2]) / K_[1, 1]
    if dist is not None:
        x, y = _invert_newton(x, y, dist)
    return np.clip(np.rint(_pattern(x, y)), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("name", list(DISTORTIONS))
def test_distorted_pattern_comes_back_straight(name: str) -> None:
    dist = DISTORTIONS[name]
    distorted = _render(K, dist)
    K_new = undistorted_intrinsics(K, dist, W, H)
    straight = undistort_image(distorted, K, dist, K_new)
    expected = _render(K_new, None)

    interior = (slice(6, H - 6), slice(6, W - 6))
    err = np.abs(straight[interior].astype(float) - expected[interior]).mean()
    before = np.abs(distorted[interior].astype(float) - expected[interior]).mean()
    assert before > 25.0  # the distortion is visible...
    assert err < 4.0  # ...and undistortion removes it (what remains is bilinear resampling error)
    assert straight.shape == distorted.shape and straight.dtype == np.uint8


@pytest.mark.parametrize("name", list(DISTORTIONS))
def test_undistorted_intrinsics_keep_principal_point_and_leave_no_blank_border(name: str) -> None:
    dist = DISTORTIONS[name]
    K_new = undistorted_intrinsics(K, dist, W, H)
    assert K_new[0, 2] == K[0, 2] and K_new[1, 2] == K[1, 2]
    scale = K_new[0, 0] / K[0, 0]
    assert scale >= 1.0 and K_new[1, 1] / K[1, 1] == pytest.approx(scale)
    u, v = np.meshgrid(np.arange(W) + 0.5, np.arange(H) + 0.5)
    xd, yd = distort((u - K_new[0, 2]) / K_new[0, 0], (v - K_new[1, 2]) / K_new[1, 1], dist)
    src_u, src_v = xd * K[0, 0] + K[0, 2], yd * K[1, 1] + K[1, 2]
    assert src_u.min() >= 0.5 - 1e-6 and src_u.max() <= W - 0.5 + 1e-6
    assert src_v.min() >= 0.5 - 1e-6 and src_v.max() <= H - 0.5 + 1e-6
    # Tight: some output pixel reaches the source border (unless the focal could stay as it was).
    margin = min(src_u.min() - 0.5, W - 0.5 - src_u.max(), src_v.min() - 0.5, H - 0.5 - src_v.max())
    assert scale == 1.0 or margin < 0.5


def test_pincushion_zooms_in_and_barrel_keeps_focal() -> None:
    assert undistorted_intrinsics(K, Distortion(k1=0.2), W, H)[0, 0] > K[0, 0]
    assert undistorted_intrinsics(K, Distortion(k1=-0.2), W, H)[0, 0] == K[0, 0]


@pytest.mark.parametrize("dist", [Distortion(k1=-1.0), Distortion(k1=-10.0), Distortion(p1=2.0)])
def test_too_strong_distortion_is_a_value_error_without_numpy_warnings(dist: Distortion) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="too strong to undistort a 160x120 image"):
            undistorted_intrinsics(K, dist, W, H)


def test_fov_to_focal() -> None:
    assert fov_to_focal(math.pi / 2, 100) == pytest.approx(50.0)
    assert fov_to_focal(2 * math.atan(0.25), 64) == pytest.approx(128.0)


def test_undistort_points_inverts_distort() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-0.6, 0.6, (2, 500))
    for dist in DISTORTIONS.values():
        xu, yu = undistort_points(*distort(x, y, dist), dist)
        np.testing.assert_allclose(np.stack([xu, yu]), np.stack([x, y]), atol=1e-9)


def test_pinhole_image_is_unchanged_by_identity_undistortion() -> None:
    image = _render(K, None)
    np.testing.assert_array_equal(undistort_image(image, K, Distortion(), K), image)


@pytest.mark.parametrize(
    "model, params, expected_K, expected_dist",
    [
        ("SIMPLE_PINHOLE", [100, 40, 30], (100, 100, 40, 30), Distortion()),
        ("PINHOLE", [100, 90, 40, 30], (100, 90, 40, 30), Distortion()),
        ("SIMPLE_RADIAL", [100, 40, 30, 0.1], (100, 100, 40, 30), Distortion(k1=0.1)),
        ("RADIAL", [100, 40, 30, 0.1, -0.02], (100, 100, 40, 30), Distortion(k1=0.1, k2=-0.02)),
        (
            "OPENCV",
            [100, 90, 40, 30, 0.1, -0.02, 0.003, 0.004],
            (100, 90, 40, 30),
            Distortion(0.1, -0.02, 0, 0.003, 0.004),
        ),
    ],
)
def test_camera_intrinsics_per_model(model, params, expected_K, expected_dist) -> None:
    K_, dist = camera_intrinsics(ColmapCamera(7, model, 80, 60, np.array(params, float)), "cameras.bin")
    np.testing.assert_array_equal(K_, intrinsics_matrix(*expected_K))
    assert dist == expected_dist


@pytest.mark.parametrize(
    "model, num_params", [("THIN_PRISM_FISHEYE", 12), ("FULL_OPENCV", 12), ("FOV", 5), ("FISHEYE", 4)]
)
def test_unsupported_models_name_model_camera_and_file(model: str, num_params: int) -> None:
    camera = ColmapCamera(42, model, 80, 60, np.ones(num_params))
    with pytest.raises(DatasetError, match=rf"sparse/cameras\.bin: camera 42 uses the {model} camera model"):
        camera_intrinsics(camera, "sparse/cameras.bin")
