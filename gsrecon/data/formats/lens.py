"""Lens distortion: camera models to pinhole intrinsics, and undistortion of images to a pinhole camera.

Pixel coordinates follow COLMAP: the centre of pixel ``(i, j)`` is at ``(i + 0.5, j + 0.5)``. Distortion is
OpenCV's radial-tangential model on normalised coordinates ``(x, y) = ((u - cx) / fx, (v - cy) / fy)``::

    r2 = x^2 + y^2,  radial = 1 + k1 r2 + k2 r2^2 + k3 r2^3
    xd = x radial + 2 p1 x y + p2 (r2 + 2 x^2)
    yd = y radial + p1 (r2 + 2 y^2) + 2 p2 x y

Fisheye cameras (COLMAP ``*_FISHEYE``, OpenCV/nerfstudio ``OPENCV_FISHEYE``) are equidistant with a polynomial
on the angle ``theta = atan(r)`` from the optical axis: ``theta_d = theta (1 + k1 t^2 + k2 t^4 + k3 t^6 + k4 t^8)``,
``(xd, yd) = (x, y) theta_d / r`` (:func:`gsrecon.cameras.lens.fisheye_polynomial`, the lens maths the renderers
use too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gsrecon.cameras.lens import fisheye_polynomial
from gsrecon.data.errors import DatasetError
from gsrecon.data.formats.colmap_model import ColmapCamera

SUPPORTED_MODELS = (  # COLMAP model name: number of parameters
    {"SIMPLE_PINHOLE": 3, "PINHOLE": 4, "SIMPLE_RADIAL": 4, "RADIAL": 5, "OPENCV": 8}
    | {"SIMPLE_RADIAL_FISHEYE": 4, "RADIAL_FISHEYE": 5, "OPENCV_FISHEYE": 8}
)
FISHEYE_MAX_ANGLE = math.radians(80.0)  # widest half-angle an undistorted pinhole image keeps


@dataclass(frozen=True)
class Distortion:
    """OpenCV radial-tangential (or, with ``fisheye``, equidistant fisheye) distortion; all zero: a pinhole."""

    k1: float = 0.0
    k2: float = 0.0
    k3: float = 0.0
    p1: float = 0.0
    p2: float = 0.0
    k4: float = 0.0  # fisheye only
    fisheye: bool = False

    @property
    def is_zero(self) -> bool:
        return not self.fisheye and not any((self.k1, self.k2, self.k3, self.p1, self.p2))

    @property
    def fisheye_coeffs(self) -> tuple[float, float, float, float]:
        """(k1, k2, k3, k4) of the fisheye polynomial."""
        return self.k1, self.k2, self.k3, self.k4


def intrinsics_matrix(fx: float, fy: float, cx: float, cy: float) -> np.ndarray:
    """Pinhole K [3, 3] float64."""
    return np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])


def fov_to_focal(fov: float, pixels: float) -> float:
    """Focal length in pixels of a pinhole camera whose field of view ``fov`` (radians) spans ``pixels``."""
    return 0.5 * pixels / math.tan(0.5 * fov)


def camera_intrinsics(camera: ColmapCamera, source: str) -> tuple[np.ndarray, Distortion]:
    """(K [3, 3], distortion) of a COLMAP camera; ``source`` (the file it came from) names it in errors."""
    p = [float(v) for v in camera.params]
    if camera.model in SUPPORTED_MODELS and len(p) != SUPPORTED_MODELS[camera.model]:
        raise DatasetError(
            f"{source}: camera {camera.id} ({camera.model}) has {len(p)} parameters, "
            f"expected {SUPPORTED_MODELS[camera.model]}"
        )
    if camera.model == "SIMPLE_RADIAL_FISHEYE":
        return intrinsics_matrix(p[0], p[0], p[1], p[2]), Distortion(k1=p[3], fisheye=True)
    if camera.model == "RADIAL_FISHEYE":
        return intrinsics_matrix(p[0], p[0], p[1], p[2]), Distortion(k1=p[3], k2=p[4], fisheye=True)
    if camera.model == "OPENCV_FISHEYE":
        return intrinsics_matrix(*p[:4]), Distortion(k1=p[4], k2=p[5], k3=p[6], k4=p[7], fisheye=True)
    if camera.model == "SIMPLE_PINHOLE":
        return intrinsics_matrix(p[0], p[0], p[1], p[2]), Distortion()
    if camera.model == "PINHOLE":
        return intrinsics_matrix(*p), Distortion()
    if camera.model == "SIMPLE_RADIAL":
        return intrinsics_matrix(p[0], p[0], p[1], p[2]), Distortion(k1=p[3])
    if camera.model == "RADIAL":
        return intrinsics_matrix(p[0], p[0], p[1], p[2]), Distortion(k1=p[3], k2=p[4])
    if camera.model == "OPENCV":
        return intrinsics_matrix(*p[:4]), Distortion(k1=p[4], k2=p[5], p1=p[6], p2=p[7])
    raise DatasetError(
        f"{source}: camera {camera.id} uses the {camera.model} camera model, which gsrecon cannot undistort "
        f"(supported: {', '.join(SUPPORTED_MODELS)}); undistort the images first, e.g. with "
        "`colmap image_undistorter`, and use its output folder"
    )


def distort(x: np.ndarray, y: np.ndarray, dist: Distortion) -> tuple[np.ndarray, np.ndarray]:
    """Distorted normalised coordinates of undistorted ones (any equal shapes)."""
    if dist.fisheye:
        r = np.hypot(x, y)
        theta = np.arctan(r)
        theta_d, _ = fisheye_polynomial(theta, dist.fisheye_coeffs)
        scale = np.where(r > 1e-12, theta_d / np.maximum(r, 1e-12), 1.0)
        return x * scale, y * scale
    r2 = x * x + y * y
    radial = 1.0 + r2 * (dist.k1 + r2 * (dist.k2 + r2 * dist.k3))
    xd = x * radial + 2.0 * dist.p1 * x * y + dist.p2 * (r2 + 2.0 * x * x)
    yd = y * radial + dist.p1 * (r2 + 2.0 * y * y) + 2.0 * dist.p2 * x * y
    return xd, yd


def undistort_points(
    xd: np.ndarray, yd: np.ndarray, dist: Distortion, iters: int = 30
) -> tuple[np.ndarray, np.ndarray]:
    """Undistorted normalised coordinates of distorted ones (fixed-point inversion of :func:`distort`; Newton
    on the angle for fisheye, whose angles are capped at :data:`FISHEYE_MAX_ANGLE`)."""
    if dist.fisheye:
        rd = np.hypot(xd, yd)
        theta = fisheye_angle(rd, dist, iters)
        theta = np.clip(np.nan_to_num(theta, nan=FISHEYE_MAX_ANGLE), 0.0, FISHEYE_MAX_ANGLE)
        scale = np.where(rd > 1e-12, np.tan(theta) / np.maximum(rd, 1e-12), 1.0)
        return xd * scale, yd * scale
    x, y = xd.copy(), yd.copy()
    for _ in range(iters):
        r2 = x * x + y * y
        radial = 1.0 + r2 * (dist.k1 + r2 * (dist.k2 + r2 * dist.k3))
        dx = 2.0 * dist.p1 * x * y + dist.p2 * (r2 + 2.0 * x * x)
        dy = dist.p1 * (r2 + 2.0 * y * y) + 2.0 * dist.p2 * x * y
        x, y = (xd - dx) / radial, (yd - dy) / radial
    return x, y


def fisheye_angle(rd: np.ndarray, dist: Distortion, iters: int = 30) -> np.ndarray:
    """Angle from the optical axis (radians, uncapped) of distorted fisheye radii ``rd`` (any shape); NaN past
    the lens, where the polynomial has no solution."""
    theta = rd.copy()
    for _ in range(iters):
        theta_d, slope = fisheye_polynomial(theta, dist.fisheye_coeffs)
        theta = theta - (theta_d - rd) / slope
    off_lens = ~(np.abs(fisheye_polynomial(theta, dist.fisheye_coeffs)[0] - rd) < 1e-9) | (theta < 0)
    return np.where(off_lens, np.nan, theta)


def field_of_view(K: np.ndarray, dist: Distortion, width: int, height: int) -> tuple[float, float]:
    """(horizontal, vertical) field of view in degrees of a ``width`` x ``height`` camera, across the lines
    through its principal point from border to border; NaN where a border lies past a fisheye lens."""
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    x = np.array([-cx / fx, (width - cx) / fx, 0.0, 0.0])  # left, right, top, bottom border points
    y = np.array([0.0, 0.0, -cy / fy, (height - cy) / fy])
    if dist.fisheye:
        angles = fisheye_angle(np.hypot(x, y), dist)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            angles = np.arctan(np.hypot(*undistort_points(x, y, dist)))
    return float(np.degrees(angles[0] + angles[1])), float(np.degrees(angles[2] + angles[3]))


def describe_crop(K: np.ndarray, dist: Distortion, K_new: np.ndarray, width: int, height: int) -> str:
    """How much of a distorted camera's view its undistorted pinhole image keeps, e.g.
    ``"kept 160x121 degrees of the lens's 190x143"``."""
    kept = field_of_view(K_new, Distortion(), width, height)
    lens = field_of_view(K, dist, width, height)
    if np.isfinite(lens).all():
        lens_text = f"the lens's {lens[0]:.0f}x{lens[1]:.0f}"
    else:
        lens_text = "a view whose borders lie past the lens model"
    return f"kept {kept[0]:.0f}x{kept[1]:.0f} degrees of {lens_text}"


def undistorted_intrinsics(K: np.ndarray, dist: Distortion, width: int, height: int) -> np.ndarray:
    """Pinhole K [3, 3] for the undistorted image of a ``width`` x ``height`` distorted camera.

    Same size and principal point as ``K``; the focal lengths are scaled up (never down; for fisheye, also
    down, to the widest view) by the smallest common factor that makes every undistorted pixel fall inside
    the distorted image, so that the undistorted image has no blank border. A fisheye view wider than
    :data:`FISHEYE_MAX_ANGLE` is cropped to it.

    Raises:
        ValueError: the distortion folds the image edges back (it cannot be inverted up to the border).
    """
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    edges = {  # the distorted image's outermost pixel centres: (u [256], v [256]) per side
        "left": (np.full(256, 0.5), np.linspace(0.5, height - 0.5, 256)),
        "right": (np.full(256, width - 0.5), np.linspace(0.5, height - 0.5, 256)),
        "top": (np.linspace(0.5, width - 0.5, 256), np.full(256, 0.5)),
        "bottom": (np.linspace(0.5, width - 0.5, 256), np.full(256, height - 0.5)),
    }
    bounds = {}
    for side, (u, v) in edges.items():
        with np.errstate(over="ignore", invalid="ignore"):  # a diverging inversion ends in inf/nan, checked below
            x, y = undistort_points((u - cx) / fx, (v - cy) / fy, dist)
        # The innermost undistorted point of each side bounds the rectangle the output must fit in.
        bounds[side] = {"left": x.max(), "right": x.min(), "top": y.max(), "bottom": y.min()}[side]
    needed = [
        (0.5 - cx) / fx / bounds["left"] if bounds["left"] < 0 else np.inf,
        (width - 0.5 - cx) / fx / bounds["right"] if bounds["right"] > 0 else np.inf,
        (0.5 - cy) / fy / bounds["top"] if bounds["top"] < 0 else np.inf,
        (height - 0.5 - cy) / fy / bounds["bottom"] if bounds["bottom"] > 0 else np.inf,
    ]
    scale = float(np.max([0.0 if dist.fisheye else 1.0, *needed]))  # nan (a diverged inversion) propagates
    if not np.isfinite(scale):
        raise DatasetError(f"distortion {dist} is too strong to undistort a {width}x{height} image with K={K.tolist()}")
    return intrinsics_matrix(fx * scale, fy * scale, cx, cy)


def undistort_image(image: np.ndarray, K: np.ndarray, dist: Distortion, K_new: np.ndarray) -> np.ndarray:
    """Resample a distorted uint8 image [H, W, C] (intrinsics ``K``) to the pinhole camera ``K_new``.

    Each output pixel centre is mapped through the forward model to the distorted image and sampled
    bilinearly (edge-clamped); the output has the same size and dtype.
    """
    return _bilinear(image, *undistortion_sources(image.shape[1], image.shape[0], K, dist, K_new))


def undistortion_sources(
    width: int, height: int, K: np.ndarray, dist: Distortion, K_new: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Where each pixel of a ``width`` x ``height`` pinhole image (``K_new``) lies in the distorted image (``K``):
    fractional column and row indices (pixel centres at integers), [H, W] each."""
    u, v = np.meshgrid(np.arange(width) + 0.5, np.arange(height) + 0.5)  # [H, W] each
    xd, yd = distort((u - K_new[0, 2]) / K_new[0, 0], (v - K_new[1, 2]) / K_new[1, 1], dist)
    return xd * K[0, 0] + K[0, 2] - 0.5, yd * K[1, 1] + K[1, 2] - 0.5


def _bilinear(image: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Sample ``image`` [H, W, C] at fractional indices (u: column, v: row) [h, w], clamped at the edges."""
    height, width = image.shape[:2]
    u = np.clip(u, 0.0, width - 1.0)
    v = np.clip(v, 0.0, height - 1.0)
    u0 = np.clip(np.floor(u).astype(np.int64), 0, max(width - 2, 0))
    v0 = np.clip(np.floor(v).astype(np.int64), 0, max(height - 2, 0))
    u1, v1 = np.minimum(u0 + 1, width - 1), np.minimum(v0 + 1, height - 1)
    wu, wv = (u - u0)[..., None], (v - v0)[..., None]  # [h, w, 1]
    src = image.astype(np.float32)
    top = src[v0, u0] * (1 - wu) + src[v0, u1] * wu
    bottom = src[v1, u0] * (1 - wu) + src[v1, u1] * wu
    out = top * (1 - wv) + bottom * wv
    return np.clip(np.rint(out), 0, 255).astype(image.dtype)
