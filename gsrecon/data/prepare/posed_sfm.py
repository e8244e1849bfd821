"""Sparse points for a capture that comes posed (a transforms.json scene) from its known poses: pycolmap's SIFT
features, matching and triangulation with the cameras and poses held fixed.

instant-ngp / nerfstudio captures come posed but without SfM points, so training would start from random
points. :func:`triangulate_frames` takes the frames as training reads them (the reader's undistorted pinhole
cameras, and world-to-camera OpenCV poses, which are COLMAP's ``cam_from_world``) and triangulates points from
them. With ``model.init: auto``, training gets them from :func:`training_points`, cached outside the user's folder
(``gsrecon/cache.py``), the folder left untouched; ``gsrecon data triangulate`` writes them into the folder instead
(:mod:`gsrecon.data.prepare.triangulate`).

Frames: every frame the transforms file lists, test views included, as the 3DGS convention triangulates
from all images (a point's position carries no test pixel into the metrics); nerf_synthetic's
``transforms_test.json`` is left out, as training leaves it out.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
from PIL import Image

from gsrecon.atomic import atomic_path
from gsrecon.cache import cache_dir, cache_file
from gsrecon.data.errors import DatasetError
from gsrecon.data.formats.images import FACTORS
from gsrecon.data.formats.transforms_json import image_path, read_transforms, transforms_file
from gsrecon.data.prepare.sfm import (
    MATCHERS,
    MIN_FEATURES,
    database_counts,
    exit_on_signal,
    import_pycolmap,
    listing,
    mapping_options,
    match_features,
    pycolmap_logging,
    remove_partial,
)
from gsrecon.data.scene import Frame, first_sightings

POINTS_CACHE = "points"  # the cache of points triangulated for training (:func:`training_points`)
STAGES = ("features", "matching", "triangulation")  # triangulate_frames' stages, in order
MAX_SIDE = 1600  # px: the automatic factor is the smallest that brings the longest image side to at most this
# (factor, max_images) -> every frame of the capture as training reads it at ``factor`` (``max_images`` > 0: that
# many of them), e.g. :func:`gsrecon.data.readers.transforms.every_frame`
FramesAt = Callable[[int, int], list[Frame]]
MIN_POINTS = 100  # a sparser cloud is no start for training: refused, and the transforms file is left alone
_RIGID_TOLERANCE = 1e-3  # how far a pose's rotation may be from orthonormal (float32 matrices from JSON)


@dataclass
class Triangulation:
    """Points triangulated from a scene's frames and known poses (:func:`triangulate_frames`)."""

    points: np.ndarray  # [P, 3] float32, in the frames' world coordinates
    colors: np.ndarray  # [P, 3] uint8
    observed: dict[str, np.ndarray]  # frame name -> [P_i] int64 rows of ``points`` that frame's image observed
    keypoints: dict[str, np.ndarray]  # frame name -> [P_i, 2] float32 pixel x, y where its image saw each, row for row
    sizes: dict[str, tuple[int, int]]  # frame name -> (width, height) of the image its keypoints were found in
    factor: int  # the images' downscale factor features were extracted at
    num_images: int
    mean_track_length: float  # images per point
    mean_reprojection_error: float  # pixels, at ``factor``

    def describe(self) -> str:
        """One line: how many points from how many images, and how well they fit."""
        return (
            f"triangulated {len(self.points)} points from {self.num_images} images at factor {self.factor} (mean "
            f"track length {self.mean_track_length:.1f} images, mean reprojection error "
            f"{self.mean_reprojection_error:.2f} px)"
        )


def triangulate_frames(
    root: Path,
    frames_at: FramesAt,
    work: Path,
    factor: int = 0,
    matcher: str = "exhaustive",
    use_gpu: bool = True,
    verbose: bool = False,
    on_stage: Callable[[str, str], None] | None = None,
) -> Triangulation:
    """Triangulate points from ``frames_at``'s frames of the transforms.json scene in ``root`` with their cameras and
    poses held fixed, leaving pycolmap's work files in ``work`` (``database.db``, ``sparse/``; replaced).

    Arguments as for :func:`gsrecon.data.prepare.triangulate.triangulate_scene`.

    Raises:
        ValueError: unknown ``matcher`` or ``factor``.
        DatasetError: frames ``frames_at`` refuses (missing images, bad cameras), fewer than 2 frames, poses
            that are not rigid, or fewer than :data:`MIN_POINTS` points triangulated (the message names the
            causes the database shows).
        PycolmapUnavailableError: pycolmap is not installed.
    """
    if matcher not in MATCHERS:
        raise ValueError(f"matcher must be one of {MATCHERS}, got {matcher!r}")
    if factor not in (0, *FACTORS):
        raise ValueError(f"factor must be 0 (automatic) or one of {FACTORS}, got {factor!r}")
    json_path = transforms_file(root)
    pycolmap = import_pycolmap("gsrecon data triangulate")
    factor = factor or _auto_factor(frames_at)
    frames = frames_at(factor, 0)
    if len(frames) < 2:
        raise DatasetError(f"{json_path}: triangulation needs at least 2 frames, the file lists {len(frames)}")
    for frame in frames:
        _check_rigid(json_path, frame)

    images_dir, database, model_dir = work / "images", work / "database.db", work / "sparse"
    for stale in (images_dir, model_dir):
        shutil.rmtree(stale, ignore_errors=True)
    database.unlink(missing_ok=True)
    report_stage = on_stage or (lambda name, what: None)
    device = pycolmap.Device.auto if use_gpu else pycolmap.Device.cpu
    try:
        sizes = sorted({(frame.width, frame.height) for frame in frames}, key=lambda size: size[0] * size[1])
        at = "x".join(map(str, sizes[0])) + ("" if len(sizes) == 1 else " to " + "x".join(map(str, sizes[-1])))
        report_stage("features", f"SIFT features of {len(frames)} images at {at} (factor {factor})")
        reconstruction = _posed_reconstruction(pycolmap, frames, images_dir)
        _write_database(pycolmap, reconstruction, database)
        extraction = pycolmap.FeatureExtractionOptions()
        extraction.max_image_size = max(MAX_SIDE, *(max(frame.width, frame.height) for frame in frames))
        names = [image.name for image in reconstruction.images.values()]
        with pycolmap_logging(pycolmap, verbose):
            pycolmap.extract_features(
                database, images_dir, image_names=names, extraction_options=extraction, device=device
            )
            report_stage("matching", f"{matcher} matching")
            match_features(pycolmap, database, matcher, device)
            report_stage("triangulation", "points from the matches, cameras and poses held fixed")
            options = mapping_options(pycolmap)
            model_dir.mkdir()
            reconstruction = pycolmap.triangulate_points(
                reconstruction, database, images_dir, model_dir, options=options
            )
    finally:
        shutil.rmtree(images_dir, ignore_errors=True)
    points3d = list(reconstruction.points3D.values())
    if len(points3d) < MIN_POINTS:
        causes = "".join(f"; {cause}" for cause in _failure_causes(pycolmap, database, options.min_num_matches))
        raise DatasetError(
            f"{json_path}: triangulated {len(points3d)} points from {len(frames)} images (at least {MIN_POINTS} "
            f"needed){causes}; the images need overlap, texture and sharpness (a smaller --factor gives SIFT more "
            "pixels)"
        )
    row_of = {point_id: row for row, point_id in enumerate(reconstruction.points3D)}
    tracks = {
        frame.name: _observations(reconstruction.images[index], row_of) for index, frame in enumerate(frames, start=1)
    }
    return Triangulation(
        points=np.array([point.xyz for point in points3d], dtype=np.float32),
        colors=np.array([point.color for point in points3d], dtype=np.uint8),
        observed={name: rows for name, (rows, _) in tracks.items()},
        keypoints={name: keypoints for name, (_, keypoints) in tracks.items()},
        sizes={frame.name: (frame.width, frame.height) for frame in frames},
        factor=factor,
        num_images=len(frames),
        mean_track_length=float(reconstruction.compute_mean_track_length()),
        mean_reprojection_error=float(reconstruction.compute_mean_reprojection_error()),
    )


def _observations(image, row_of: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The [P_i] int64 rows of the points that the pycolmap ``image`` observed (``row_of`` maps point ids to rows),
    and [P_i, 2] float32 pixel x, y where it saw each (its first keypoint of the point)."""
    seen = [(row_of[p.point3D_id], p.xy) for p in image.points2D if p.has_point3D()]
    rows, xy = first_sightings(np.array([row for row, _ in seen], np.int64), np.array([xy for _, xy in seen]))
    return rows, xy.reshape(-1, 2).astype(np.float32)


def training_points(
    root: Path, frames_at: FramesAt, log: Callable[[str], None], outside: bool = False
) -> Triangulation:
    """The points triangulated from the transforms.json scene in ``root`` (:func:`triangulate_frames`), for training
    to start from; the user's folder is left as it is (``outside``: its images may lie outside it).

    The result is cached under ``cache_dir("points")``, keyed by the transforms file's bytes and the path, size
    and modification time of every image it lists, so that the next run of the same capture reads it back.
    ``log`` receives the stages and a summary line with the seconds the step took.

    Raises:
        DatasetError, PycolmapUnavailableError: as :func:`triangulate_frames`.
    """
    path = cache_file(POINTS_CACHE, _points_cache_key(root, outside), ".npz")
    with contextlib.suppress(OSError, ValueError, KeyError, zipfile.BadZipFile):  # no (usable) cache entry
        with np.load(path, allow_pickle=False) as cached:
            triangulation = _from_arrays(dict(cached))
        log(f"SfM points: {len(triangulation.points)} triangulated points of this capture from the cache ({path})")
        return triangulation
    started = time.perf_counter()
    with _work_dir() as work, exit_on_signal("triangulation", cleanup=lambda: remove_partial(Path(work))):
        triangulation = triangulate_frames(
            root,
            frames_at,
            work,
            on_stage=lambda name, what: log(f"triangulating SfM points [{STAGES.index(name) + 1}/3]: {what}"),
        )
    log(f"SfM points: {triangulation.describe()} in {time.perf_counter() - started:.1f} s")
    with contextlib.suppress(OSError), atomic_path(path) as tmp, tmp.open("wb") as f:
        np.savez(f, **_to_arrays(triangulation))
    return triangulation


def _to_arrays(triangulation: Triangulation) -> dict[str, np.ndarray]:
    """``triangulation`` as plain arrays for ``np.savez`` (the tracks flattened, with offsets per frame name)."""
    names = list(triangulation.observed)
    counts = [len(triangulation.observed[name]) for name in names]
    arrays = {name: getattr(triangulation, name) for name in ("points", "colors")}
    arrays["numbers"] = np.array(
        [triangulation.factor, triangulation.num_images, triangulation.mean_track_length,
         triangulation.mean_reprojection_error]
    )  # fmt: skip
    arrays["observed_names"] = np.array(names, dtype=str)
    arrays["observed_offsets"] = np.cumsum([0, *counts]).astype(np.int64)
    arrays["observed_rows"] = np.concatenate([np.zeros(0, np.int64), *(triangulation.observed[n] for n in names)])
    arrays["observed_sizes"] = np.array([triangulation.sizes[n] for n in names], np.int64).reshape(-1, 2)
    arrays["observed_keypoints"] = np.concatenate(
        [np.zeros((0, 2), np.float32), *(triangulation.keypoints[n] for n in names)]
    )
    return arrays


def _from_arrays(arrays: dict[str, np.ndarray]) -> Triangulation:
    """The :class:`Triangulation` that :func:`_to_arrays` flattened (KeyError for an entry of an older version)."""
    offsets, rows, keypoints = arrays["observed_offsets"], arrays["observed_rows"], arrays["observed_keypoints"]
    spans = list(zip(arrays["observed_names"], offsets[:-1], offsets[1:]))
    factor, num_images, track_length, error = arrays["numbers"].tolist()
    return Triangulation(
        points=arrays["points"],
        colors=arrays["colors"],
        observed={str(n): rows[a:b] for n, a, b in spans},
        keypoints={str(n): keypoints[a:b] for n, a, b in spans},
        sizes={str(n): (int(w), int(h)) for n, (w, h) in zip(arrays["observed_names"], arrays["observed_sizes"])},
        factor=int(factor),
        num_images=int(num_images),
        mean_track_length=track_length,
        mean_reprojection_error=error,
    )


def _points_cache_key(root: Path, outside: bool) -> dict:
    """What the triangulated points of the scene in ``root`` (its images possibly ``outside`` it) depend on (see
    :func:`training_points`)."""
    json_path = transforms_file(root)
    images = []
    for frame in read_transforms(json_path)["frames"]:
        file = image_path(root, json_path, str(frame["file_path"]), outside)
        stat = file.stat()
        images.append([str(file.resolve()), stat.st_size, stat.st_mtime_ns])
    return {
        "transforms": hashlib.sha256(json_path.read_bytes()).hexdigest(),
        "root": str(root.resolve()),
        "images": images,
        "max_side": MAX_SIDE,
    }


@contextlib.contextmanager
def _work_dir() -> Iterator[Path]:
    """A temporary folder for pycolmap's work files: in the points cache when it can be made, else the system's."""
    parent = cache_dir(POINTS_CACHE)
    with contextlib.suppress(OSError):
        parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent if parent.is_dir() else None) as work:
        yield Path(work)


def _auto_factor(frames_at: FramesAt) -> int:
    """The smallest factor that brings the first frame's longest side to at most :data:`MAX_SIDE` pixels (else 8)."""
    frame = frames_at(1, 1)[0]
    longest = max(frame.width, frame.height)
    return next((f for f in FACTORS if longest / f <= MAX_SIDE), FACTORS[-1])


def _check_rigid(json_path: Path, frame: Frame) -> None:
    """Refuse a pose whose rotation is not a rotation (a scaled or mirrored ``transform_matrix``)."""
    rotation = frame.viewmat[:3, :3].double().numpy()
    if np.abs(rotation.T @ rotation - np.eye(3)).max() > _RIGID_TOLERANCE or np.linalg.det(rotation) < 0:
        raise DatasetError(
            f"{json_path}: frame {frame.name!r}: 'transform_matrix' is not a rotation and a translation (it scales "
            "or mirrors), so its camera cannot be used for triangulation"
        )


def _posed_reconstruction(pycolmap: ModuleType, frames: list[Frame], images_dir: Path):
    """A pycolmap Reconstruction with one PINHOLE camera, trivial rig and frame per frame (ids 1, 2, ...) posed
    at the frame's viewmat, its image written to ``images_dir`` as ``<name>.png`` (alpha composited on black)."""
    reconstruction = pycolmap.Reconstruction()
    for index, frame in enumerate(frames, start=1):
        K = frame.K.double().numpy()  # [3, 3]
        camera = pycolmap.Camera(
            model="PINHOLE",
            width=frame.width,
            height=frame.height,
            params=[K[0, 0], K[1, 1], K[0, 2], K[1, 2]],
            camera_id=index,
        )
        reconstruction.add_camera_with_trivial_rig(camera)
        image = pycolmap.Image(name=f"{frame.name}.png", camera_id=index, image_id=index)
        cam_from_world = pycolmap.Rigid3d(frame.viewmat[:3, :4].double().numpy())
        reconstruction.add_image_with_trivial_frame(image, cam_from_world)
        pixels = frame.image.numpy()  # [H, W, 3] or [H, W, 4] uint8
        if pixels.shape[2] == 4:
            pixels = (pixels[..., :3] * (pixels[..., 3:] / 255.0)).round().astype(np.uint8)
        (images_dir / image.name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(images_dir / image.name, compress_level=1)  # a temporary copy: fast over small
    return reconstruction


def _write_database(pycolmap: ModuleType, reconstruction, database: Path) -> None:
    """A new COLMAP database with the reconstruction's cameras, rigs, frames and images under the same ids,
    which feature extraction then fills (it keeps the camera of an image already in the database)."""
    db = pycolmap.Database.open(database)
    try:
        for camera in reconstruction.cameras.values():
            db.write_camera(camera, use_camera_id=True)
        for rig in reconstruction.rigs.values():
            db.write_rig(rig, use_rig_id=True)
        for frame in reconstruction.frames.values():
            db.write_frame(frame, use_frame_id=True)
        for image in reconstruction.images.values():
            db.write_image(image, use_image_id=True)
    finally:
        db.close()


def _failure_causes(pycolmap: ModuleType, database: Path, min_matches: int) -> list[str]:
    """Why few points were triangulated, as far as the database shows: images with too few features, too few
    matched image pairs, or (when images do match) poses that do not fit the images."""
    features, matched = database_counts(pycolmap, database, min_matches)
    causes = []
    plain = sorted(name.removesuffix(".png") for name, count in features.items() if count < MIN_FEATURES)
    if plain:
        causes.append(f"{len(plain)} frame(s) with fewer than {MIN_FEATURES} features ({listing(plain)})")
    if matched == 0:
        causes.append(f"no two images share {min_matches} or more geometrically consistent feature matches")
    else:
        causes.append(
            f"{matched} image pair(s) match, so the poses may not fit the images (another convention or scale) or "
            "the cameras barely move between the images"
        )
    return causes
