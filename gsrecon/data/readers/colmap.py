"""COLMAP scene folders (the 3DGS / Mip-NeRF 360 layout) as a :class:`Scene`.

Layout::

    <scene>/images/<name>              full-resolution images, named as in the model
    <scene>/images_<f>/<name>          optional, the same images downscaled by f (2, 4, 8)
    <scene>/sparse/0/ or <scene>/sparse/
        cameras.bin  images.bin  points3D.bin     (or the .txt versions)
    <scene>/test.txt, <scene>/train.txt  optional image-name lists for ``eval_split="dataset"``
    <scene>/masks/<stem>.png           optional per-image masks (or <name>.png; :mod:`gsrecon.data.formats.masks`),
    <scene>/masks_<f>/<stem>.png       at 1/f beside images_<f>/
    <scene>/depths/<stem>.png          optional per-image depth maps: 16-bit PNG in millimetres (or <stem>.npy in
                                       metres), any resolution of the image's shape (:mod:`gsrecon.data.formats.depths`)
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import numpy as np
import torch
from torch import Tensor

from gsrecon.data.errors import DatasetError
from gsrecon.data.formats.colmap_model import ColmapCamera, ColmapImage, SparseModel, find_sparse_dir, read_model
from gsrecon.data.formats.depths import DEPTHS_FOLDER, DepthFile, depth_file, find_depth
from gsrecon.data.formats.images import ImageFile, ImageTransform, camera_frame, camera_image_file, check_factor
from gsrecon.data.formats.lens import camera_intrinsics
from gsrecon.data.formats.masks import MASKS_FOLDER, MaskFile, find_mask, mask_file
from gsrecon.data.pipeline import DataPipeline, folder_arguments
from gsrecon.data.scene import Frame, Scene, first_sightings
from gsrecon.data.splits import NameList, check_eval_split, evenly_spaced, frame_name, listed_as_test, split_frames
from gsrecon.registry import DATASET_REGISTRY


@DATASET_REGISTRY.register("colmap")
class ColmapReader:
    """``data.dataset: colmap``: a COLMAP scene folder at ``data.path`` (no options of its own: ``data.colmap`` takes
    none)."""

    def read(self, data: DataPipeline.Config) -> Scene:
        return load_colmap(**folder_arguments(data, "a folder with images/ and sparse/0/"))


def load_colmap(
    path: str,
    factor: int = 1,
    eval_split: str = "every_8",
    max_images: int = 0,
    *,
    lazy: bool = False,
    keep_fisheye: bool = False,
) -> Scene:
    """Read a COLMAP scene folder: undistorted pinhole frames at 1/``factor`` resolution, split, and SfM points.

    Args:
        path: the scene folder (holding ``images/`` and ``sparse/``).
        factor: downscale factor (1, 2, 4 or 8); ``images_<factor>/`` is used when present.
        eval_split: ``"every_8"`` (names sorted, index % 8 == 0 is test), ``"none"`` (all train) or
            ``"dataset"`` (``test.txt``, else ``train.txt``: image names in the scene folder, one per line,
            the extension optional).
        max_images: if > 0, keep this many evenly spaced images (in name order) before splitting.
        lazy: leave the pixels in their files (read headers only), to be decoded when needed (``data.cache: disk``).
        keep_fisheye: keep fisheye photos as the lens saw them (their ``Frame.camera_model`` a fisheye
            :class:`~gsrecon.cameras.CameraModel`), instead of undistorting them.

    The point cloud may be empty (a model without SfM points); the Gaussians then need ``model.init=random``.

    Raises:
        DatasetError: missing or malformed files, impossible values (see :mod:`gsrecon.data.formats.colmap_model`),
            unsupported cameras, images that disagree with their camera; the message names the file.
    """
    check_factor(factor)
    check_eval_split(eval_split)
    root = Path(path)
    if not root.is_dir():
        raise DatasetError(f"{root}: scene folder does not exist")
    sparse_dir = find_sparse_dir(root)
    model = read_model(sparse_dir)
    ext = ".bin" if (sparse_dir / "cameras.bin").is_file() else ".txt"
    images_file = sparse_dir / f"images{ext}"
    if not model.images:
        raise DatasetError(f"{images_file}: the model has no registered images")

    all_images = sorted(model.images.values(), key=lambda image: image.name)
    keep = evenly_spaced(len(all_images), max_images)
    is_test = None
    if eval_split == "dataset":  # the lists may name images that max_images leaves out
        listed = _dataset_split(root, [image.name for image in all_images])
        is_test = [listed[i] for i in keep]
    prepared = [_frame(root, all_images[i], model, sparse_dir, ext, factor, lazy, keep_fisheye) for i in keep]
    frames = [frame for frame, _ in prepared]
    if len({f.name for f in frames}) < len(frames):
        raise DatasetError(f"{images_file}: image names differ only by extension or '/' vs '_'; rename them")
    train, test = split_frames(frames, eval_split, is_test)
    row_of = {int(point_id): row for row, point_id in enumerate(model.points.ids)}
    tracks = {
        frame.name: _observations(all_images[i], row_of, model.cameras[all_images[i].camera_id], transform)
        for i, (frame, transform) in zip(keep, prepared)
    }
    return Scene(
        train=train,
        test=test,
        points=torch.from_numpy(model.points.xyz.astype(np.float32)),  # [P, 3]
        colors=torch.from_numpy(model.points.rgb.astype(np.float32) / 255.0),  # [P, 3]
        observed={name: rows for name, (rows, _) in tracks.items()},
        keypoints={name: keypoints for name, (_, keypoints) in tracks.items()},
        keypoint_scale={
            frame.name: model.cameras[all_images[i].camera_id].width / frame.width for i, frame in zip(keep, frames)
        },
    )


def _observations(
    image: ColmapImage, row_of: dict[int, int], camera: ColmapCamera, transform: ImageTransform
) -> tuple[Tensor, Tensor]:
    """The [P_i] int64 rows of the model's points that ``image`` observed (its keypoints with a 3D point; ``row_of``
    maps point ids to rows), and [P_i, 2] float32 where it saw each (its first keypoint of the point) in the
    frame's image that ``transform`` makes of it."""
    known = np.array([int(i) in row_of for i in image.point3D_ids], bool)
    rows = np.array([row_of[int(i)] for i in image.point3D_ids[known]], np.int64)
    rows, xy = first_sightings(rows, image.xys[known].reshape(-1, 2))
    pixels = transform.points(xy, (camera.width, camera.height))
    return torch.from_numpy(rows), torch.from_numpy(pixels.astype(np.float32))


def _frame(
    root: Path,
    image: ColmapImage,
    model: SparseModel,
    sparse_dir: Path,
    ext: str,
    factor: int,
    lazy: bool,
    keep_fisheye: bool,
) -> tuple[Frame, ImageTransform]:
    """The frame of ``image``, and the transform that makes its image from the camera's photo."""
    images_file = sparse_dir / f"images{ext}"
    camera = model.cameras.get(image.camera_id)
    if camera is None:
        raise DatasetError(
            f"{images_file}: image {image.id} ({image.name}) uses camera {image.camera_id}, "
            f"which {sparse_dir / f'cameras{ext}'} does not define"
        )
    pose = np.concatenate([image.qvec, image.tvec])
    if not np.isfinite(pose).all() or not np.linalg.norm(image.qvec) > 0:
        raise DatasetError(f"{images_file}: image {image.id} ({image.name}) has an invalid pose {pose.tolist()}")
    viewmat = image.viewmat()  # [4, 4]
    cameras_file = sparse_dir / f"cameras{ext}"
    K, dist = camera_intrinsics(camera, str(cameras_file))
    path = root / "images" / image.name
    if not path.is_file():
        raise DatasetError(f"{path}: image file is missing (referenced by {images_file})")
    prepared = camera_image_file(
        path,
        (camera.width, camera.height),
        K,
        dist,
        factor,
        root / f"images_{factor}" / image.name,
        camera=f"camera {camera.id} of {cameras_file}",
        keep_fisheye=keep_fisheye,
    )
    mask = _mask(root, image.name, path, prepared.file, factor, lazy)
    frame = camera_frame(frame_name(image.name), viewmat, prepared, mask, lazy, _depth(root, image.name, prepared.file))
    return frame, prepared.file.transform


def _depth(root: Path, name: str, image_file: ImageFile) -> DepthFile | None:
    """The depth map of the image ``name`` in ``depths/`` (PNG in millimetres, .npy in metres), None without one."""
    depth_path = find_depth(root / DEPTHS_FOLDER, PurePosixPath(name))
    return None if depth_path is None else depth_file(depth_path, image_file.transform)


def _mask(
    root: Path, name: str, path: Path, image_file: ImageFile, factor: int, lazy: bool
) -> Tensor | MaskFile | None:
    """The mask of the image ``name`` in ``masks/`` (decoded unless ``lazy``), None without one."""
    mask_path = find_mask(root / MASKS_FOLDER, PurePosixPath(name))
    if mask_path is None:
        return None
    prescaled = find_mask(root / f"{MASKS_FOLDER}_{factor}", PurePosixPath(name)) if factor > 1 else None
    mask = mask_file(mask_path, prescaled, image_file, path)
    return mask if lazy else torch.from_numpy(mask.load())


def _dataset_split(root: Path, names: list[str]) -> list[bool]:
    """Per name of the model, whether ``test.txt`` (or, without it, ``train.txt``) makes it a test image."""
    lists = {}
    for kind in ("test", "train"):
        list_path = root / f"{kind}.txt"
        if list_path.is_file():
            lines = list_path.read_text(encoding="utf-8").splitlines()
            lists[kind] = NameList(str(list_path), tuple(line.strip() for line in lines if line.strip()))
    if not lists:
        raise DatasetError(
            f"{root}: eval_split 'dataset' needs a test.txt or train.txt list of image names in the scene "
            "folder; use eval_split 'every_8' or 'none' otherwise"
        )
    return listed_as_test(names, lists.get("test"), lists.get("train"))
