"""COLMAP scene folders (the 3DGS / Mip-NeRF 360 layout) as a :class:`Scene`.

Layout::

    <scene>/images/<name>              full-resolution images, named as in the model
    <scene>/images_<f>/<name>          optional, the same images downscaled by f (2, 4, 8)
    <scene>/sparse/0/ or <scene>/sparse/
        cameras.bin  images.bin  points3D.bin     (or the .txt versions)
    <scene>/test.txt, <scene>/train.txt  optional image-name lists for ``eval_split="dataset"``
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import numpy as np
import torch

from gsrecon.data.cameras import Frame, Scene
from gsrecon.data.colmap_format import ColmapImage, SparseModel, find_sparse_dir, read_model
from gsrecon.data.errors import DatasetError
from gsrecon.data.images import check_factor, load_camera_image
from gsrecon.data.splits import check_eval_split, evenly_spaced, every_nth_is_test, frame_name
from gsrecon.data.undistort import camera_intrinsics


def load_colmap(path: str, factor: int = 1, eval_split: str = "every_8", max_images: int = 0) -> Scene:
    """Read a COLMAP scene folder: undistorted pinhole frames at 1/``factor`` resolution, split, and SfM points.

    Args:
        path: the scene folder (holding ``images/`` and ``sparse/``).
        factor: downscale factor (1, 2, 4 or 8); ``images_<factor>/`` is used when present.
        eval_split: ``"every_8"`` (names sorted, index % 8 == 0 is test), ``"none"`` (all train) or
            ``"dataset"`` (``test.txt`` / ``train.txt`` name lists in the scene folder).
        max_images: if > 0, keep this many evenly spaced images (in name order) before splitting.

    Raises:
        DatasetError: missing or malformed files, unsupported cameras, images that disagree with
            their camera, an empty point cloud; the message names the file.
    """
    check_factor(factor)
    check_eval_split(eval_split)
    root = Path(path)
    if not root.is_dir():
        raise DatasetError(f"{root}: scene folder does not exist")
    sparse_dir = find_sparse_dir(root)
    model = read_model(sparse_dir)
    ext = ".bin" if (sparse_dir / "cameras.bin").is_file() else ".txt"
    images_file, points_file = sparse_dir / f"images{ext}", sparse_dir / f"points3D{ext}"
    if not model.images:
        raise DatasetError(f"{images_file}: the model has no registered images")
    if len(model.points) == 0:
        raise DatasetError(f"{points_file}: the point cloud is empty (rerun the reconstruction)")

    all_images = sorted(model.images.values(), key=lambda image: image.name)
    images = [all_images[i] for i in evenly_spaced(len(all_images), max_images)]
    is_test = _split(root, [image.name for image in images], [image.name for image in all_images], eval_split)
    frames = [_frame(root, image, model, sparse_dir, ext, factor) for image in images]
    if len({f.name for f in frames}) < len(frames):
        raise DatasetError(f"{images_file}: image names differ only by extension or '/' vs '_'; rename them")
    return Scene(
        train=[f for f, test in zip(frames, is_test) if not test],
        test=[f for f, test in zip(frames, is_test) if test],
        points=torch.from_numpy(model.points.xyz.astype(np.float32)),  # [P, 3]
        colors=torch.from_numpy(model.points.rgb.astype(np.float32) / 255.0),  # [P, 3]
    )


def _frame(root: Path, image: ColmapImage, model: SparseModel, sparse_dir: Path, ext: str, factor: int) -> Frame:
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
    K, dist = camera_intrinsics(camera, str(sparse_dir / f"cameras{ext}"))
    path = root / "images" / image.name
    if not path.is_file():
        raise DatasetError(f"{path}: image file is missing (referenced by {images_file})")
    pixels, K = load_camera_image(
        path, (camera.width, camera.height), K, dist, factor, root / f"images_{factor}" / image.name
    )
    return Frame(
        name=frame_name(image.name),
        viewmat=torch.from_numpy(viewmat.astype(np.float32)),
        K=torch.from_numpy(K.astype(np.float32)),
        image=torch.from_numpy(pixels),
    )


def _split(root: Path, names: list[str], all_names: list[str], eval_split: str) -> list[bool]:
    """Per name in ``names`` (a subset of the model's ``all_names``), whether it is a test image."""
    if eval_split == "none":
        return [False] * len(names)
    if eval_split == "every_8":
        return every_nth_is_test(len(names))
    lists = {kind: root / f"{kind}.txt" for kind in ("test", "train")}
    if not any(p.is_file() for p in lists.values()):
        raise DatasetError(
            f"{root}: eval_split 'dataset' needs a test.txt or train.txt list of image names in the scene "
            "folder; use eval_split 'every_8' or 'none' otherwise"
        )
    lookup = {key: name for name in all_names for key in (name, str(PurePosixPath(name).with_suffix("")))}
    listed = {}
    for kind, list_path in lists.items():
        if list_path.is_file():
            entries = [line.strip() for line in list_path.read_text(encoding="utf-8").splitlines() if line.strip()]
            unknown = [e for e in entries if e not in lookup]
            if unknown:
                raise DatasetError(f"{list_path}: names no image of the model: {', '.join(unknown[:5])}")
            listed[kind] = {lookup[e] for e in entries}
    if "test" in listed:
        return [name in listed["test"] for name in names]
    return [name not in listed["train"] for name in names]
