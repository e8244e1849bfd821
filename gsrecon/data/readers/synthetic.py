"""A built-in analytic scene, ray-cast without any Gaussian renderer, for demos and tests.

World z is up, units are metres. Two layouts (``SyntheticConfig.layout``):

- ``orbit``: a checkered ground disc of radius 3 at z = 0 with four textured objects near the origin: a
  striped sphere, a sphere whose colour follows its normal, a checkered cube and a pillar with a vertical
  colour gradient. Cameras orbit the look-at point at a fixed radius, alternating between elevations, all
  around it or over an arc (a forward-facing capture).
- ``street``: a scene that needs blocks (block training, issue 30): a ground strip 6 m wide along world x,
  ``street_length`` long, whose checker colours drift along x, with spheres, boxes and pillars of varied
  sizes, textures and colours along it (a fixed draw, so no two stretches look alike). Cameras move along
  the street (alternating heights and sides), each looking down at the centre line a little ahead, so that
  each sees only a few metres of it; with a sky (``sky: gradient``) they look nearer the horizon, so that the
  upper rows of their images show it.

The scene is lit by a directional light (Lambertian, with cast shadows) plus ambient light; rays that miss
everything see a plain background colour (or get alpha 0 with ``SyntheticConfig.alpha``), or a sky at infinity
(``sky: gradient``: from a pale horizon to a blue zenith, with bands of cloud that vary with the azimuth). Every
``val_every``-th view goes to the test split. An "SfM-like" point cloud is sampled on the surfaces the
cameras see (area-proportionally), jittered and coloured with the shaded colour, with SfM-like tracks: the views
that see each point and where (its projection plus a detector's noise, as bundle adjustment leaves them).

Images are supersampled for anti-aliased edges, deterministic for a given config, and cached
as an ``.npz`` file keyed by a hash of the fields that change the data and of the generator's source
code (this module and the camera helpers it calls), so editing the generator invalidates old files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from numpy.typing import NDArray

from gsrecon import geometry
from gsrecon.atomic import atomic_path
from gsrecon.cache import cache_file
from gsrecon.cameras.lens import pinhole_project
from gsrecon.data.formats import lens as lens_maths
from gsrecon.data.formats.lens import fov_to_focal, intrinsics_matrix
from gsrecon.data.scene import Frame, Scene
from gsrecon.data.splits import check_eval_split, evenly_spaced, split_frames
from gsrecon.errors import InputError
from gsrecon.geometry import camera_centers, look_at
from gsrecon.registry import DATASET_REGISTRY

if TYPE_CHECKING:
    from gsrecon.data.pipeline import DataPipeline

Array = NDArray[np.float64]

_GROUND_RADIUS = 3.0  # the scene's half-size (the street's half-width); `point_noise` is relative to it
_LIGHT_DIR = np.array([-0.45, -0.3, 0.84])
_LIGHT_DIR /= np.linalg.norm(_LIGHT_DIR)  # unit vector towards the (infinitely far) light
_AMBIENT = 0.35
_EPS = 1e-6
_CHUNK = 8192  # rays traced at once (keeps the working set in cache)
_STREET_VIEW = (1.3, 5.5)  # about how far ahead of a street camera the bottom and top of its image meet the ground


@dataclass
class SyntheticConfig:
    """Parameters of the synthetic scene; every field except ``val_every`` (the split), ``depth_noise`` (drawn
    when loaded), ``tracks`` (given to the scene or not), ``cache_dir`` and the options of the other layout changes
    the data (and so the cache file)."""

    # "orbit": objects near the origin, cameras around them; "street": a long strip of objects, cameras moving along
    # it, each seeing a few metres (a scene that needs blocks, for block training: issue 30)
    layout: str = "orbit"
    num_views: int = 24
    width: int = 64
    height: int = 48
    val_every: int = 8  # views 0, val_every, 2*val_every, ... are test views; 0 = no test views
    num_points: int = 2000
    point_noise: float = 0.02  # std of the point jitter, relative to the scene half-size (3 m)
    seed: int = 0  # drives the point cloud (images and cameras do not depend on it)
    fov_deg: float = 50.0  # horizontal field of view; pixels are square
    # Options of layout "orbit" (layout "street" rejects a change to them)
    orbit_radius: float = 4.0  # camera distance from `look_at`
    arc_deg: float = 360.0  # azimuths the cameras spread over: 360 all around, e.g. 90 for a forward-facing capture
    elevations_deg: tuple[float, ...] = (25.0, 45.0)  # view i uses elevations_deg[i % len]
    look_at: tuple[float, float, float] = (0.0, 0.0, 0.35)  # orbit centre, projects to image centre
    # Option of layout "street" (layout "orbit" rejects a change to it): the street's length along world x (it is
    # 6 m wide, centred on the origin); the cameras spread evenly along it, each seeing a few metres
    street_length: float = 24.0
    supersample: int = 3  # samples per pixel along each axis
    background: tuple[float, float, float] = (0.0, 0.0, 0.0)  # sky colour in [0, 1]
    sky: str = "none"  # none: rays that miss see `background` | gradient: a sky at infinity (see `sky_colors`)
    alpha: bool = False  # True: RGBA images with alpha 0 where the sky shows, RGB unpremultiplied
    depth: bool = False  # True: a depth map per view (z at each pixel's centre, metres; 0 where the sky shows)
    # Noise of the training views' depth maps, as a sensor's: each depth times (1 + depth_noise * N(0, 1)), drawn
    # with `seed`; the test views keep their true depth (what depth errors are measured against)
    depth_noise: float = 0.0
    # SfM-like tracks: which points each view sees and where (Scene.observed / keypoints, as a COLMAP model gives
    # them); false: a point cloud without them, as a PLY gives
    tracks: bool = True
    cache_dir: str | None = None  # None: gsrecon's cache root / synthetic (see `cache_path`)

    def __post_init__(self) -> None:
        if self.layout not in _LAYOUT_OPTIONS:
            raise ValueError(f"SyntheticConfig.layout must be one of {sorted(_LAYOUT_OPTIONS)}, got {self.layout!r}")
        positive = {
            "num_views": self.num_views,
            "width": self.width,
            "height": self.height,
            "num_points": self.num_points,
            "fov_deg": self.fov_deg,
            "orbit_radius": self.orbit_radius,
            "supersample": self.supersample,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"SyntheticConfig.{name} must be > 0, got {value!r}")
        if self.street_length < _STREET_VIEW[1]:
            raise ValueError(
                f"SyntheticConfig.street_length must be >= {_STREET_VIEW[1]} (metres: what one view sees of it), "
                f"got {self.street_length!r}"
            )
        defaults = {field.name: field.default for field in dataclasses.fields(self)}
        for name in _ignored_options(self.layout):
            value = getattr(self, name)
            if (tuple(value) if isinstance(value, list) else value) != defaults[name]:
                raise ValueError(
                    f"SyntheticConfig.{name} is not an option of layout {self.layout!r} (got {value!r}); "
                    f"leave it out or set layout to the one it belongs to"
                )
        if self.val_every < 0:
            raise ValueError(f"SyntheticConfig.val_every must be >= 0, got {self.val_every!r}")
        if not 0.0 < self.fov_deg < 180.0:
            raise ValueError(f"SyntheticConfig.fov_deg must be in (0, 180), got {self.fov_deg!r}")
        if not 0.0 < self.arc_deg <= 360.0:
            raise ValueError(f"SyntheticConfig.arc_deg must be in (0, 360], got {self.arc_deg!r}")
        if self.point_noise < 0.0:
            raise ValueError(f"SyntheticConfig.point_noise must be >= 0, got {self.point_noise!r}")
        if not 0.0 <= self.depth_noise < 1.0:
            raise ValueError(f"SyntheticConfig.depth_noise must be in [0, 1), got {self.depth_noise!r}")
        if not self.elevations_deg or not all(0.0 < e < 90.0 for e in self.elevations_deg):
            raise ValueError(
                "SyntheticConfig.elevations_deg must be a non-empty list of angles in (0, 90), "
                f"got {self.elevations_deg!r}"
            )
        if len(self.look_at) != 3 or len(self.background) != 3:
            raise ValueError("SyntheticConfig.look_at and .background must have 3 entries each")
        if not all(0.0 <= c <= 1.0 for c in self.background):
            raise ValueError(f"SyntheticConfig.background must be in [0, 1], got {self.background!r}")
        if self.sky not in SKIES:
            raise ValueError(f"SyntheticConfig.sky must be one of {', '.join(SKIES)}, got {self.sky!r}")
        if self.sky != "none" and (self.alpha or any(self.background)):
            raise ValueError(
                "SyntheticConfig.sky draws what rays that miss the scene see: leave alpha false and background black"
            )


SKIES = ("none", "gradient")
_SKY_HORIZON = np.array([0.86, 0.89, 0.93])
_SKY_ZENITH = np.array([0.22, 0.42, 0.80])


def sky_colors(dirs: Array) -> Array:
    """[S, 3] the ``gradient`` sky's colours along unit world directions ``dirs`` [S, 3] (z up): from the horizon's
    pale colour to the zenith's blue with the elevation, plus white bands of cloud that vary with the azimuth
    (below the horizon, the horizon's colours)."""
    elevation = np.clip(dirs[:, 2], 0.0, 1.0)[:, None]  # [S, 1] sine of the elevation
    color = _SKY_HORIZON + (_SKY_ZENITH - _SKY_HORIZON) * np.sqrt(elevation)
    azimuth = np.arctan2(dirs[:, 1], dirs[:, 0])[:, None]
    cloud = np.clip(np.sin(3.0 * azimuth + 9.0 * elevation) * np.sin(5.0 * azimuth - 4.0 * elevation), 0.0, 1.0)
    return color + (1.0 - color) * 0.6 * cloud * (1.0 - elevation)


_LAYOUT_OPTIONS = {  # layout -> the fields only it uses
    "orbit": ("look_at", "orbit_radius", "arc_deg", "elevations_deg"),
    "street": ("street_length",),
}


def _ignored_options(layout: str) -> tuple[str, ...]:
    """The `SyntheticConfig` fields that belong to the layouts other than ``layout`` (they change nothing)."""
    return tuple(name for other, names in _LAYOUT_OPTIONS.items() if other != layout for name in names)


# ----------------------------------------------------------------------------- primitives


def _rotation_z(angle_deg: float) -> Array:
    """[3, 3] rotation about the world z axis."""
    c, s = math.cos(math.radians(angle_deg)), math.sin(math.radians(angle_deg))
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def _soft_stripes(x: Array, sharpness: float = 2.0) -> Array:
    """Stripes of unit width in [0, 1] with softened edges: coordinates [R] -> [R]."""
    return np.clip(0.5 + sharpness * np.sin(math.pi * x), 0.0, 1.0)


def _soft_checker(x: Array, sharpness: float = 2.0) -> Array:
    """Checkerboard of unit cells in [0, 1] with softened edges: coordinates [R, D] -> [R]."""
    return np.clip(0.5 + sharpness * np.prod(np.sin(math.pi * x), axis=-1), 0.0, 1.0)


Color = tuple[float, float, float]


def _mix(a: Color | Array, b: Color | Array, w: Array) -> Array:
    """Per-ray blend (1 - w) * a + w * b of colours [3] or [R, 3]; w [R] -> [R, 3]."""
    return np.asarray(a) + w[:, None] * (np.asarray(b) - np.asarray(a))


def _hsv(hue: Array, saturation: float, value: float) -> Array:
    """RGB colours [R, 3] in [0, 1] of hues [R] (in turns, 0 = red) at one saturation and value."""
    k = (np.array([5.0, 3.0, 1.0]) + 6.0 * (hue[:, None] % 1.0)) % 6.0  # [R, 3]
    return value - value * saturation * np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0)


_TEXTURE_COLORS: dict[str, tuple[Color, Color]] = {  # the two colours of a texture unless a primitive names its own
    "stripes": ((0.85, 0.18, 0.12), (0.96, 0.9, 0.74)),
    "checker": ((0.16, 0.55, 0.28), (0.95, 0.84, 0.3)),
    "gradient": ((0.4, 0.18, 0.6), (0.98, 0.62, 0.18)),
}


class _Sphere:
    """A sphere; `texture` is "stripes" (latitude bands of `colors`) or "normal" (colour from the normal)."""

    def __init__(
        self, center: tuple[float, float, float], radius: float, texture: str, colors: tuple[Color, Color] | None = None
    ) -> None:
        self.center, self.radius, self.texture = np.asarray(center), radius, texture
        self.colors = colors or _TEXTURE_COLORS.get(texture)
        self.area = 4.0 * math.pi * radius**2

    def intersect(self, origins: Array, dirs: Array) -> Array:
        """[R] distance along unit rays to the first hit in front of the origin, inf on a miss."""
        oc = origins - self.center  # [R, 3]
        b = np.einsum("rk,rk->r", oc, dirs)
        disc = b * b - (np.einsum("rk,rk->r", oc, oc) - self.radius**2)
        t = -b - np.sqrt(np.maximum(disc, 0.0))
        return np.where((disc > 0.0) & (t > _EPS), t, np.inf)

    def normal(self, points: Array) -> Array:
        """[R, 3] outward unit normal at points on the surface."""
        return (points - self.center) / self.radius

    def albedo(self, points: Array) -> Array:
        """[R, 3] surface colour at points on the sphere."""
        local = (points - self.center) / self.radius  # [R, 3] unit normals
        if self.texture == "stripes":
            bands = _soft_stripes(local[:, 2] * self.radius / 0.2)
            return _mix(*self.colors, bands)
        return 0.5 + 0.42 * local * np.array([1.0, -1.0, 1.0])

    def distance(self, points: Array) -> Array:
        """[P] unsigned distance from points to the surface."""
        return np.abs(np.linalg.norm(points - self.center, axis=-1) - self.radius)

    def sample(self, rng: np.random.Generator, n: int) -> Array:
        """[n, 3] points uniform on the surface."""
        d = rng.standard_normal((n, 3))
        return self.center + self.radius * d / np.linalg.norm(d, axis=-1, keepdims=True)


class _Box:
    """A box rotated about z by `yaw_deg`; `texture` is "checker" (3D checker) or "gradient" (bottom to top), in
    `colors`."""

    def __init__(
        self,
        center: tuple[float, float, float],
        half: tuple[float, float, float],
        yaw_deg: float,
        texture: str,
        colors: tuple[Color, Color] | None = None,
    ) -> None:
        self.center, self.half, self.texture = np.asarray(center), np.asarray(half), texture
        self.colors = colors or _TEXTURE_COLORS[texture]
        self.rot = _rotation_z(yaw_deg)  # local -> world
        hx, hy, hz = half
        self.face_areas = 4.0 * np.array([hy * hz, hy * hz, hx * hz, hx * hz, hx * hy, hx * hy])
        self.area = float(self.face_areas.sum())

    def _to_local(self, points: Array) -> Array:
        """[R, 3] world points in the box frame (centred, axis-aligned)."""
        return (points - self.center) @ self.rot

    def intersect(self, origins: Array, dirs: Array) -> Array:
        """[R] distance along unit rays to the first hit in front of the origin, inf on a miss."""
        o, d = self._to_local(origins), dirs @ self.rot  # [R, 3]
        d = np.where(np.abs(d) < 1e-12, 1e-12, d)
        t1, t2 = (-self.half - o) / d, (self.half - o) / d  # [R, 3] slab entry / exit
        t_in, t_out = np.minimum(t1, t2).max(-1), np.maximum(t1, t2).min(-1)  # [R]
        return np.where((t_in <= t_out) & (t_in > _EPS), t_in, np.inf)

    def normal(self, points: Array) -> Array:
        """[R, 3] outward unit normal at points on the surface."""
        local = self._to_local(points) / self.half  # [R, 3], +-1 along the face axis
        rows, axis = np.arange(len(points)), np.abs(local).argmax(-1)
        normal = np.zeros_like(points)
        normal[rows, axis] = np.sign(local[rows, axis])
        return normal @ self.rot.T

    def albedo(self, points: Array) -> Array:
        """[R, 3] surface colour at points on the box."""
        local = self._to_local(points)
        if self.texture == "checker":
            cell = 2.0 * self.half[0] / 3.0
            return _mix(*self.colors, _soft_checker(local / cell))
        height = np.clip((local[:, 2] + self.half[2]) / (2.0 * self.half[2]), 0, 1)
        return _mix(*self.colors, height)

    def distance(self, points: Array) -> Array:
        """[P] unsigned distance from points to the surface."""
        q = np.abs(self._to_local(points)) - self.half  # [P, 3]
        outside = np.linalg.norm(np.maximum(q, 0.0), axis=-1)
        return np.abs(outside + np.minimum(q.max(-1), 0.0))

    def sample(self, rng: np.random.Generator, n: int) -> Array:
        """[n, 3] points uniform on the surface."""
        face = rng.choice(6, size=n, p=self.face_areas / self.area)  # [n]
        local = (2.0 * rng.random((n, 3)) - 1.0) * self.half
        axis, sign = face // 2, np.where(face % 2 == 0, -1.0, 1.0)
        local[np.arange(n), axis] = sign * self.half[axis]
        return local @ self.rot.T + self.center


class _Ground:
    """A ground at z = 0 seen from above; subclasses give its outline, texture and sampling."""

    cell = 0.6  # checker cell size

    def _inside(self, xy: Array) -> Array:
        """[R] bool: the points xy [R, 2] lie on the ground."""
        raise NotImplementedError

    def _beyond(self, xy: Array) -> Array:
        """[P] horizontal distance from points xy [P, 2] to the ground (0 on it)."""
        raise NotImplementedError

    def intersect(self, origins: Array, dirs: Array) -> Array:
        """[R] distance along unit rays to the first hit in front of the origin, inf on a miss."""
        down = dirs[:, 2] < 0.0  # the ground is seen from above only
        t = np.where(down, -origins[:, 2] / np.where(down, dirs[:, 2], -1.0), np.inf)
        xy = origins[:, :2] + np.where(down, t, 0.0)[:, None] * dirs[:, :2]
        inside = down & (t > _EPS) & self._inside(xy)
        return np.where(inside, t, np.inf)

    def normal(self, points: Array) -> Array:
        """[R, 3] outward unit normal at points on the surface."""
        return np.broadcast_to(np.array([0.0, 0.0, 1.0]), points.shape).copy()

    def distance(self, points: Array) -> Array:
        """[P] unsigned distance from points to the surface."""
        return np.hypot(self._beyond(points[:, :2]), points[:, 2])


class _Disc(_Ground):
    """The orbit layout's checkered disc of radius `_GROUND_RADIUS`, plain at the rim."""

    area = math.pi * _GROUND_RADIUS**2

    def _inside(self, xy: Array) -> Array:
        return np.einsum("rk,rk->r", xy, xy) <= _GROUND_RADIUS**2

    def _beyond(self, xy: Array) -> Array:
        return np.maximum(np.linalg.norm(xy, axis=-1) - _GROUND_RADIUS, 0.0)

    def albedo(self, points: Array) -> Array:
        """[R, 3] surface colour at points on the ground."""
        checker = _soft_checker(points[:, :2] / self.cell, sharpness=4.0)
        r = np.linalg.norm(points[:, :2], axis=-1)
        fade = np.clip((_GROUND_RADIUS - 0.1 - r) / 0.8, 0.0, 1.0)  # plain at the rim
        return _mix((0.82, 0.78, 0.68), (0.36, 0.42, 0.5), 0.5 + fade * (checker - 0.5))

    def sample(self, rng: np.random.Generator, n: int) -> Array:
        """[n, 3] points uniform on the surface."""
        r = _GROUND_RADIUS * np.sqrt(rng.random(n))
        phi = 2.0 * math.pi * rng.random(n)
        return np.stack([r * np.cos(phi), r * np.sin(phi), np.zeros(n)], axis=-1)


class _Strip(_Ground):
    """The street layout's ground: the rectangle |x| <= length / 2, |y| <= `_GROUND_RADIUS`, a checker whose dark
    cells change hue along x (so that every stretch has its own colours)."""

    def __init__(self, length: float) -> None:
        self.half = np.array([length / 2.0, _GROUND_RADIUS])  # [2]
        self.area = float(4.0 * self.half.prod())

    def _inside(self, xy: Array) -> Array:
        return (np.abs(xy) <= self.half).all(-1)

    def _beyond(self, xy: Array) -> Array:
        return np.linalg.norm(np.maximum(np.abs(xy) - self.half, 0.0), axis=-1)

    def albedo(self, points: Array) -> Array:
        """[R, 3] surface colour at points on the ground."""
        checker = _soft_checker(points[:, :2] / self.cell, sharpness=4.0)
        along = (points[:, 0] + self.half[0]) / (2.0 * self.half[0])  # [R], 0 -> 1 from one end to the other
        return _mix((0.85, 0.82, 0.74), _hsv(0.8 * along, 0.55, 0.5), checker)

    def sample(self, rng: np.random.Generator, n: int) -> Array:
        """[n, 3] points uniform on the surface."""
        xy = (2.0 * rng.random((n, 2)) - 1.0) * self.half
        return np.concatenate([xy, np.zeros((n, 1))], axis=-1)


_Primitive = _Ground | _Sphere | _Box

_STREET_SPACING = 1.3  # metres along x from one object to the next
_STREET_DRAW = 30  # seed of the street's fixed draw of objects (the config's `seed` drives the point cloud only)


def _orbit_primitives() -> tuple[_Primitive, ...]:
    """The orbit layout: the ground disc and four objects near the origin."""
    return (
        _Disc(),
        _Sphere((-0.65, -0.35, 0.55), 0.55, "stripes"),
        _Sphere((0.75, 0.45, 0.42), 0.42, "normal"),
        _Box((0.35, -0.75, 0.35), (0.35, 0.35, 0.35), 30.0, "checker"),
        _Box((-0.35, 0.8, 0.6), (0.15, 0.15, 0.6), -20.0, "gradient"),
    )


def _street_primitives(length: float) -> tuple[_Primitive, ...]:
    """The street layout: the ground strip and an object every `_STREET_SPACING` metres along it, standing on the
    ground, of a kind, size, place across the street, texture and colours drawn once (the same for every call)."""
    rng = np.random.default_rng(_STREET_DRAW)
    count = int(length // _STREET_SPACING)
    objects: list[_Primitive] = []
    for j in range(count):
        x = -length / 2.0 + (j + 0.5) * length / count + rng.uniform(-0.15, 0.15)
        kind = rng.integers(5)
        hue = rng.random()
        colors = (tuple(_hsv(np.array([hue]), 0.75, 0.85)[0]), tuple(_hsv(np.array([hue + 0.45]), 0.25, 0.95)[0]))
        if kind < 2:  # a striped sphere or one coloured by its normal
            radius = rng.uniform(0.25, 0.55)
            y = rng.uniform(-1.0, 1.0) * (_GROUND_RADIUS - radius - 0.1)
            objects.append(_Sphere((x, y, radius), radius, ("stripes", "normal")[kind], colors))
        else:  # a checkered box, a low gradient box or a tall gradient pillar
            side = rng.uniform(0.12, 0.2) if kind == 4 else rng.uniform(0.2, 0.45)
            half_height = rng.uniform(0.5, 0.8) if kind == 4 else side * rng.uniform(0.6, 1.4)
            y = rng.uniform(-1.0, 1.0) * (_GROUND_RADIUS - 1.5 * side - 0.1)
            texture = "checker" if kind == 2 else "gradient"
            objects.append(_Box((x, y, half_height), (side, side, half_height), rng.uniform(0, 90), texture, colors))
    return (_Strip(length), *objects)


def _primitives(cfg: SyntheticConfig) -> tuple[_Primitive, ...]:
    """The surfaces of `cfg`'s scene; the first is the ground."""
    return _orbit_primitives() if cfg.layout == "orbit" else _street_primitives(cfg.street_length)


# ----------------------------------------------------------------------------- ray casting


def _trace(prims: tuple[_Primitive, ...], origins: Array, dirs: Array) -> tuple[Array, Array]:
    """First hit on `prims` along unit rays: distance [R] (inf on a miss), primitive index [R] (-1: miss)."""
    t_best = np.full(len(origins), np.inf)
    index = np.full(len(origins), -1)
    for i, prim in enumerate(prims):
        t = prim.intersect(origins, dirs)
        closer = t < t_best
        t_best, index = np.where(closer, t, t_best), np.where(closer, i, index)
    return t_best, index


def _surface(prims: tuple[_Primitive, ...], points: Array, index: Array) -> tuple[Array, Array]:
    """Albedo [R, 3] and outward normal [R, 3] at points on the primitives ``prims[index]`` (all >= 0)."""
    albedo, normals = np.zeros_like(points), np.zeros_like(points)
    for i, prim in enumerate(prims):
        sel = index == i
        if sel.any():
            albedo[sel], normals[sel] = prim.albedo(points[sel]), prim.normal(points[sel])
    return albedo, normals


def _shade(prims: tuple[_Primitive, ...], points: Array, index: Array) -> Array:
    """[R, 3] Lambertian colour in [0, 1] at points on ``prims[index]``: ambient + shadowed sunlight."""
    albedo, normals = _surface(prims, points, index)
    lambert = np.maximum(normals @ _LIGHT_DIR, 0.0)  # [R]
    lit = np.flatnonzero(lambert > 0.0)
    shadow_origins = points[lit] + 1e-4 * normals[lit]
    occluded = np.isfinite(_trace(prims, shadow_origins, np.broadcast_to(_LIGHT_DIR, shadow_origins.shape))[0])
    lambert[lit[occluded]] = 0.0
    return np.clip(albedo * (_AMBIENT + (1.0 - _AMBIENT) * lambert)[:, None], 0.0, 1.0)


def _radiance(prims: tuple[_Primitive, ...], origins: Array, dirs: Array) -> tuple[Array, Array]:
    """Colour seen along unit rays [R, 3] (0 on a miss) and whether they hit `prims` [R]."""
    dist, index = _trace(prims, origins, dirs)
    hit = np.isfinite(dist)
    color = np.zeros_like(dirs)
    color[hit] = _shade(prims, origins[hit] + dist[hit, None] * dirs[hit], index[hit])
    return color, hit


def surface_distance(points: torch.Tensor, cfg: SyntheticConfig | None = None) -> torch.Tensor:
    """Distance from world points [P, 3] to the nearest surface of `cfg`'s scene (None: the default orbit scene) [P]."""
    p = points.detach().cpu().double().numpy()
    dist = np.min([prim.distance(p) for prim in _primitives(cfg or SyntheticConfig())], axis=0)
    return torch.from_numpy(dist).to(points.dtype)


# ----------------------------------------------------------------------------- cameras


def pinhole_intrinsics(cfg: SyntheticConfig) -> Array:
    """[3, 3] pinhole K with square pixels and the principal point at the image centre."""
    focal = fov_to_focal(math.radians(cfg.fov_deg), cfg.width)
    return intrinsics_matrix(focal, focal, cfg.width / 2.0, cfg.height / 2.0)


def orbit_viewmats(cfg: SyntheticConfig) -> Array:
    """[N, 4, 4] OpenCV world-to-camera matrices on the orbit, each looking at `look_at` (world z up)."""
    target = np.asarray(cfg.look_at, dtype=np.float64)
    offsets = np.zeros((cfg.num_views, 3))  # [N, 3] unit vectors from the target to the cameras
    for i in range(cfg.num_views):
        azimuth = math.radians(cfg.arc_deg) * i / cfg.num_views
        elevation = math.radians(cfg.elevations_deg[i % len(cfg.elevations_deg)])
        horizontal = math.cos(elevation)
        offsets[i] = [horizontal * math.cos(azimuth), horizontal * math.sin(azimuth), math.sin(elevation)]
    eyes = torch.from_numpy(target + cfg.orbit_radius * offsets)  # [N, 3]
    up = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    return look_at(eyes, torch.from_numpy(target), up).numpy()


_STREET_HEIGHTS = (2.2, 3.0)  # metres: view i flies at _STREET_HEIGHTS[i % 2]
_STREET_SIDE = 1.2  # metres off the centre line, left and right in turn every two views
_STREET_AHEAD = 2.5  # metres along x from a camera to the point it looks at
_STREET_AIM_HEIGHT = 0.3  # the height of that point on the centre line
_STREET_SKY_AIM = 0.5  # with a sky: metres below the camera's height it aims at instead, nearer the horizon


def street_viewmats(cfg: SyntheticConfig) -> Array:
    """[N, 4, 4] OpenCV world-to-camera matrices moving along the street (world x, z up), evenly spaced from where
    the first sees the street's start at the bottom of its image to where the last sees its end at the top; each
    looks at the centre line `_STREET_AHEAD` metres ahead, at alternating heights and sides."""
    i = np.arange(cfg.num_views)
    first, last = -cfg.street_length / 2.0 - _STREET_VIEW[0], cfg.street_length / 2.0 - _STREET_VIEW[1]
    eye_x = first + (i + 0.5) * (last - first) / cfg.num_views  # [N]
    side = np.where(i // 2 % 2 == 0, -_STREET_SIDE, _STREET_SIDE)
    height = np.asarray(_STREET_HEIGHTS)[i % len(_STREET_HEIGHTS)]
    eyes = np.stack([eye_x, side, height], axis=-1)  # [N, 3]
    aim_x = eye_x + _STREET_AHEAD
    aim_z = height - _STREET_SKY_AIM if cfg.sky != "none" else np.full_like(aim_x, _STREET_AIM_HEIGHT)
    targets = np.stack([aim_x, np.zeros_like(aim_x), aim_z], axis=-1)
    up = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    return look_at(torch.from_numpy(eyes), torch.from_numpy(targets), up).numpy()


def layout_viewmats(cfg: SyntheticConfig) -> Array:
    """[N, 4, 4] world-to-camera matrices of `cfg`'s views (its layout's cameras)."""
    return orbit_viewmats(cfg) if cfg.layout == "orbit" else street_viewmats(cfg)


def _camera_center(viewmat: Array) -> Array:
    """[3] world position of the camera of a world-to-camera ``viewmat`` [4, 4]."""
    return camera_centers(torch.from_numpy(viewmat)).numpy()


def render_view(
    viewmat: Array, K: Array, cfg: SyntheticConfig, lens: lens_maths.Distortion | None = None
) -> NDArray[np.uint8]:
    """[H, W, 3|4] uint8 image of the scene from one camera (world-to-camera ``viewmat`` [4, 4], intrinsics
    ``K`` [3, 3], distorted by ``lens``; None: a pinhole), box-filtered over s x s samples."""
    s, H, W = cfg.supersample, cfg.height, cfg.width
    sub = (np.arange(s) + 0.5) / s
    u = (np.arange(W)[:, None] + sub).reshape(-1)  # [W*s] pixel x coordinates of the samples
    v = (np.arange(H)[:, None] + sub).reshape(-1)  # [H*s]
    uu, vv = np.meshgrid(u, v)  # [H*s, W*s]
    x, y = (uu - K[0, 2]) / K[0, 0], (vv - K[1, 2]) / K[1, 1]
    if lens is not None:
        x, y = lens_maths.undistort_points(x, y, lens)
    cam = np.stack([x, y, np.ones_like(uu)], -1)
    R = viewmat[:3, :3]
    dirs = cam.reshape(-1, 3) @ R  # [S, 3] world directions (R^T applied to each)
    dirs /= np.linalg.norm(dirs, axis=-1, keepdims=True)
    origins = np.broadcast_to(_camera_center(viewmat), dirs.shape)
    prims = _primitives(cfg)
    color, hit = np.zeros_like(dirs), np.zeros(len(dirs), dtype=bool)  # [S, 3], [S]
    for start in range(0, len(dirs), _CHUNK):
        rays = slice(start, start + _CHUNK)
        color[rays], hit[rays] = _radiance(prims, origins[rays], dirs[rays])
    coverage = hit.astype(np.float64).reshape(H, s, W, s).mean((1, 3))  # [H, W]
    if cfg.sky != "none":
        color[~hit] = sky_colors(dirs[~hit])
    color = color.reshape(H, s, W, s, 3).mean((1, 3))  # [H, W, 3], sky samples count as 0 (without a sky)
    background = np.asarray(cfg.background)
    if cfg.alpha:
        rgb = np.where(coverage[..., None] > 0.0, color / np.maximum(coverage, _EPS)[..., None], background)
        image = np.concatenate([rgb, coverage[..., None]], axis=-1)
    else:
        image = color + (1.0 - coverage[..., None]) * background
    return np.round(np.clip(image, 0.0, 1.0) * 255.0).astype(np.uint8)


def render_depth(viewmat: Array, K: Array, cfg: SyntheticConfig) -> NDArray[np.float32]:
    """[H, W] float32 depth (camera z, metres) of the surface seen through each pixel's centre of a pinhole camera
    (world-to-camera ``viewmat`` [4, 4], intrinsics ``K`` [3, 3]); 0 where the ray misses the scene."""
    uu, vv = np.meshgrid(np.arange(cfg.width) + 0.5, np.arange(cfg.height) + 0.5)  # [H, W]
    cam = np.stack([(uu - K[0, 2]) / K[0, 0], (vv - K[1, 2]) / K[1, 1], np.ones_like(uu)], -1).reshape(-1, 3)
    length = np.linalg.norm(cam, axis=-1)  # [S] camera z of a unit step along each ray is 1 / length
    dirs = cam @ viewmat[:3, :3] / length[:, None]  # [S, 3] unit world directions
    origins = np.broadcast_to(_camera_center(viewmat), dirs.shape)
    prims = _primitives(cfg)
    distance = np.concatenate(
        [_trace(prims, origins[i : i + _CHUNK], dirs[i : i + _CHUNK])[0] for i in range(0, len(dirs), _CHUNK)]
    )
    depth = np.where(np.isfinite(distance), distance / length, 0.0)
    return depth.reshape(cfg.height, cfg.width).astype(np.float32)


# ----------------------------------------------------------------------------- point cloud


def _pixels(points: Array, viewmat: Array, K: Array, cfg: SyntheticConfig) -> tuple[Array, Array]:
    """Where one pinhole camera (world-to-camera ``viewmat`` [4, 4], ``K`` [3, 3]) sees ``points`` [P, 3]: pixel x,
    y [P, 2], and [P] bool, whether each lies in front of it and inside its image."""
    cam = points @ viewmat[:3, :3].T + viewmat[:3, 3]  # [P, 3]
    _, _, u, v = pinhole_project(cam[:, 0], cam[:, 1], np.maximum(cam[:, 2], _EPS), K)  # [P] pixels each
    inside = (cam[:, 2] > _EPS) & (u >= 0) & (u < cfg.width) & (v >= 0) & (v < cfg.height)
    return np.stack([u, v], -1), inside


def _sightings(
    prims: tuple[_Primitive, ...], points: Array, normals: Array, viewmats: Array, K: Array, cfg: SyntheticConfig
) -> Array:
    """[V, P] bool: whether camera v sees point p on the surface of `prims` (facing it, unoccluded, inside its
    image)."""
    seen = np.zeros((len(viewmats), len(points)), dtype=bool)
    for view, viewmat in enumerate(viewmats):
        _, in_image = _pixels(points, viewmat, K, cfg)
        eye = _camera_center(viewmat)  # [3]
        to_point = points - eye  # [P, 3]
        length = np.linalg.norm(to_point, axis=-1)
        facing = np.einsum("pk,pk->p", normals, to_point) < 0.0
        cand = np.flatnonzero(in_image & facing)
        dirs = to_point[cand] / length[cand, None]
        dist = _trace(prims, np.broadcast_to(eye, dirs.shape), dirs)[0]
        seen[view, cand[dist > length[cand] - 1e-4]] = True
    return seen


KEYPOINT_NOISE_PX = 0.2  # std of each keypoint coordinate about its point's projection (a detector's error)


def _point_cloud(viewmats: Array, K: Array, cfg: SyntheticConfig) -> dict[str, Array]:
    """`num_points` jittered visible surface points ``points`` [P, 3], their noisy shaded ``colors`` [P, 3], and
    their tracks: ``sightings`` [V, P] bool (the views that see each point's surface) and ``keypoints`` [V, P, 2]
    (where: its projection plus a detector's noise, as bundle adjustment leaves an SfM point's sightings; 0 where
    not seen)."""
    rng = np.random.default_rng(cfg.seed)
    prims = _primitives(cfg)
    areas = np.array([prim.area for prim in prims])
    points, index = [], []
    count = 0
    while count < cfg.num_points:  # rejection sampling: area-proportional over the visible surface
        per_prim = rng.multinomial(2 * cfg.num_points, areas / areas.sum())
        for i, (prim, n) in enumerate(zip(prims, per_prim, strict=True)):
            p = prim.sample(rng, int(n))  # [n, 3]
            keep = _sightings(prims, p, prim.normal(p), viewmats, K, cfg).any(0)
            points.append(p[keep])
            index.append(np.full(int(keep.sum()), i))
        found = sum(len(p) for p in points)
        if found == count:
            cameras = ", ".join(f"{name}={getattr(cfg, name)!r}" for name in (*_LAYOUT_OPTIONS[cfg.layout], "fov_deg"))
            raise InputError(f"SyntheticConfig: no camera sees the scene (layout={cfg.layout!r}, {cameras})")
        count = found
    pick = rng.permutation(count)[: cfg.num_points]
    p_all, i_all = np.concatenate(points)[pick], np.concatenate(index)[pick]
    colors = _shade(prims, p_all, i_all) + 0.02 * rng.standard_normal(p_all.shape)
    jitter = cfg.point_noise * _GROUND_RADIUS * rng.standard_normal(p_all.shape)
    normals = np.empty_like(p_all)
    for i, prim in enumerate(prims):
        normals[i_all == i] = prim.normal(p_all[i_all == i])
    sightings = _sightings(prims, p_all, normals, viewmats, K, cfg)  # [V, P]
    noisy = p_all + jitter
    keypoints = np.zeros((len(viewmats), len(noisy), 2))
    for view, viewmat in enumerate(viewmats):
        pixels, inside = _pixels(noisy, viewmat, K, cfg)
        keypoints[view] = pixels + KEYPOINT_NOISE_PX * rng.standard_normal((len(noisy), 2))
        sightings[view] &= inside
    keypoints[~sightings] = 0.0
    return {"points": noisy, "colors": np.clip(colors, 0.0, 1.0), "sightings": sightings, "keypoints": keypoints}


# ----------------------------------------------------------------------------- loading + cache


def generator_digest(sources: list[bytes]) -> str:
    """Hex SHA-256 of the generator's source files (their bytes, in order)."""
    digest = hashlib.sha256()
    for source in sources:
        digest.update(hashlib.sha256(source).digest())
    return digest.hexdigest()


def generator_sources() -> list[bytes]:
    """The bytes of the files whose code decides the generated data: this module, geometry.py, data/formats/lens.py."""
    return [Path(path).read_bytes() for path in (__file__, geometry.__file__, lens_maths.__file__)]


_GENERATOR_DIGEST = generator_digest(generator_sources())


def cache_path(cfg: SyntheticConfig, generator: str = _GENERATOR_DIGEST) -> Path:
    """Where `load_synthetic` caches `cfg`'s data: named by a hash of its data fields and of ``generator``.

    ``generator`` is the `generator_digest` of the generator's source files, by default of the installed
    ones, so any change to the generator's code names a new file. The folder is ``cfg.cache_dir`` or else
    ``synthetic/`` under gsrecon's cache root (``$GSRECON_CACHE``, ``$XDG_CACHE_HOME/gsrecon`` or
    ``~/.cache/gsrecon``); it may not exist yet.
    """
    not_data = ("val_every", "depth_noise", "tracks", "cache_dir", *_ignored_options(cfg.layout))
    if cfg.sky == "none":  # the key a scene had before there were skies
        not_data += ("sky",)
    if cfg.layout == "orbit":  # the key an orbit scene had before there were layouts
        not_data += ("layout",)
    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in not_data}
    folder = Path(cfg.cache_dir).expanduser() if cfg.cache_dir is not None else None
    return cache_file("synthetic", {"generator": generator, **fields}, ".npz", folder)


def _generate(cfg: SyntheticConfig) -> dict[str, np.ndarray]:
    """Scene arrays: images [N, H, W, C] uint8, viewmats [N, 4, 4], Ks [N, 3, 3], points, colors, and with
    ``cfg.depth`` depths [N, H, W] float32."""
    K = pinhole_intrinsics(cfg)
    viewmats = layout_viewmats(cfg)
    images = np.stack([render_view(viewmat, K, cfg) for viewmat in viewmats])
    cloud = _point_cloud(viewmats, K, cfg)
    depths = {"depths": np.stack([render_depth(viewmat, K, cfg) for viewmat in viewmats])} if cfg.depth else {}
    return {
        "images": images,
        "viewmats": viewmats.astype(np.float32),
        "Ks": np.broadcast_to(K, (cfg.num_views, 3, 3)).astype(np.float32),
        "points": cloud["points"].astype(np.float32),
        "colors": cloud["colors"].astype(np.float32),
        "sightings": cloud["sightings"],
        "keypoints": cloud["keypoints"].astype(np.float32),
    } | depths


def _read_cache(path: Path, cfg: SyntheticConfig) -> dict[str, np.ndarray] | None:
    """The cached arrays, or None when the file is missing, unreadable or of the wrong shape."""
    channels = 4 if cfg.alpha else 3
    expected = {
        "images": (cfg.num_views, cfg.height, cfg.width, channels),
        "viewmats": (cfg.num_views, 4, 4),
        "Ks": (cfg.num_views, 3, 3),
        "points": (cfg.num_points, 3),
        "colors": (cfg.num_points, 3),
        "sightings": (cfg.num_views, cfg.num_points),
        "keypoints": (cfg.num_views, cfg.num_points, 2),
    } | ({"depths": (cfg.num_views, cfg.height, cfg.width)} if cfg.depth else {})
    try:
        with open(path, "rb") as f, np.load(f, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in expected}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    if any(arrays[name].shape != shape for name, shape in expected.items()):
        return None
    if arrays["images"].dtype != np.uint8:
        return None
    return arrays


def _write_cache(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write the arrays atomically; an unwritable cache is skipped (it only saves time)."""
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, **arrays)
    except OSError:
        return


def load_synthetic(cfg: SyntheticConfig, factor: int = 1, eval_split: str = "dataset", max_images: int = 0) -> Scene:
    """The synthetic scene for `cfg`, from the cache when present, else generated (and cached).

    Args:
        cfg: the scene; the same config always gives bitwise-identical data.
        factor: generate at 1/``factor`` of ``cfg.width`` x ``cfg.height`` (as ``data.factor`` downscales photos).
        eval_split: ``"none"`` puts every view in train; ``"every_8"`` and ``"dataset"`` use the scene's own
            split: views whose index is a multiple of ``cfg.val_every`` are test views (none if it is 0).
        max_images: if > 0, keep this many evenly spaced views before splitting.

    Images are uint8 ``[H, W, 3]`` (``[H, W, 4]`` with ``cfg.alpha``); the point cloud has
    ``cfg.num_points`` points with colours in [0, 1].
    """
    check_eval_split(eval_split)
    if factor > 1:
        if cfg.width < factor or cfg.height < factor:
            raise InputError(f"data.factor={factor} leaves no pixels of the {cfg.width}x{cfg.height} synthetic scene")
        cfg = dataclasses.replace(cfg, width=cfg.width // factor, height=cfg.height // factor)
    path = cache_path(cfg)
    arrays = _read_cache(path, cfg)
    if arrays is None:
        arrays = _generate(cfg)
        _write_cache(path, arrays)
    keep = evenly_spaced(cfg.num_views, max_images)
    is_test = [eval_split != "none" and cfg.val_every > 0 and i % cfg.val_every == 0 for i in range(cfg.num_views)]
    depths = _noisy_depths(arrays["depths"], is_test, cfg) if cfg.depth else [None] * cfg.num_views
    frames = [
        Frame(
            name=f"view_{i:03d}",
            viewmat=torch.from_numpy(arrays["viewmats"][i].copy()),
            K=torch.from_numpy(arrays["Ks"][i].copy()),
            pixels=torch.from_numpy(arrays["images"][i].copy()),
            source="generated",
            depth=depths[i],
        )
        for i in keep
    ]
    train, test = split_frames(frames, "none" if eval_split == "none" else "dataset", [is_test[i] for i in keep])
    tracks = (
        {  # frame name -> (the view's row in the arrays, the points it sees [P_i])
            frame.name: (i, np.flatnonzero(arrays["sightings"][i])) for i, frame in zip(keep, frames, strict=True)
        }
        if cfg.tracks
        else {}
    )
    return Scene(
        train=train,
        test=test,
        points=torch.from_numpy(arrays["points"]),
        colors=torch.from_numpy(arrays["colors"]),
        observed={name: torch.from_numpy(rows.astype(np.int64)) for name, (_, rows) in tracks.items()},
        keypoints={name: torch.from_numpy(arrays["keypoints"][i, rows]) for name, (i, rows) in tracks.items()},
        keypoint_scale=dict.fromkeys(tracks, 1.0),
    )


def _noisy_depths(depths: np.ndarray, is_test: list[bool], cfg: SyntheticConfig) -> list[torch.Tensor]:
    """The views' depth maps [H, W] from the true ones ``depths`` [N, H, W], those of training views (not
    ``is_test``) with ``cfg.depth_noise`` (relative, drawn with ``cfg.seed``; 0 stays 0)."""
    noise = 1.0 + cfg.depth_noise * np.random.default_rng(cfg.seed).standard_normal(depths.shape)  # [N, H, W]
    return [
        torch.from_numpy(depth.copy() if test or cfg.depth_noise == 0 else (depth * noise[i]).astype(np.float32))
        for i, (depth, test) in enumerate(zip(depths, is_test, strict=True))
    ]


@DATASET_REGISTRY.register("synthetic")
class SyntheticReader:
    """``data.dataset: synthetic``: the built-in scene, its options in ``data.synthetic`` (:class:`SyntheticConfig`)."""

    Config = SyntheticConfig

    def __init__(self, cfg: SyntheticConfig) -> None:
        self.cfg = cfg

    def read(self, data: DataPipeline.Config) -> Scene:
        return load_synthetic(self.cfg, data.factor, data.eval_split, data.max_images)
