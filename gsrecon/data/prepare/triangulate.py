"""``gsrecon data triangulate``: sparse points for a transforms.json capture from its known poses
(:mod:`gsrecon.data.prepare.posed_sfm`), written as ``sparse_pc.ply`` (nerfstudio's name; x y z float32, red green
blue uint8) beside the transforms file, which gains ``"ply_file_path": "sparse_pc.ply"`` as its first key, the rest
of its text left as it was. The reader (:mod:`gsrecon.data.readers.transforms`) reads that key as the scene's SfM
points, so ``model.init: auto`` starts from them.

Work files, replaced by the next run and safe to delete: ``<scene>/triangulation/database.db`` (features
and matches) and ``<scene>/triangulation/sparse/`` (the COLMAP model: the given cameras and poses, and the
points with their tracks). The images handed to SIFT (``triangulation/images/``) are removed at the end.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from gsrecon.atomic import atomic_path
from gsrecon.data.errors import DatasetError
from gsrecon.data.formats.transforms_json import read_transforms, transforms_file
from gsrecon.data.prepare.posed_sfm import Triangulation, training_points, triangulate_frames
from gsrecon.data.prepare.sfm import PycolmapUnavailableError
from gsrecon.data.readers.transforms import every_frame
from gsrecon.data.scene import PosedCapture, Scene, SfmPoints
from gsrecon.io.ply import write_points_ply

PLY_NAME = "sparse_pc.ply"  # nerfstudio's name for the point cloud beside transforms.json
PLY_KEY = "ply_file_path"
WORK_DIR = "triangulation"  # under the scene folder: database.db and sparse/


@dataclass
class TriangulationReport:
    """What :func:`triangulate_scene` produced."""

    triangulation: Triangulation
    ply_path: Path  # the point cloud written
    transforms_path: Path  # the transforms file that now names it
    change: str  # what changed in the transforms file, e.g. 'added "ply_file_path": "sparse_pc.ply"'
    work_dir: Path  # database.db and sparse/ (the COLMAP model)

    def lines(self, scene: str | Path) -> list[str]:
        """The report of ``gsrecon data triangulate`` on the scene folder ``scene``."""
        return [
            self.triangulation.describe(),
            f"points: {self.ply_path}",
            f"{self.transforms_path}: {self.change}",
            f"work files: {self.work_dir} (database.db, sparse/: the COLMAP model; safe to delete)",
            f"train with data.dataset=transforms data.path={scene} (model.init: auto starts from these points)",
        ]


def triangulate_scene(
    path: str | Path,
    factor: int = 0,
    matcher: str = "exhaustive",
    overwrite: bool = False,
    use_gpu: bool = True,
    verbose: bool = False,
    on_stage: Callable[[str, str], None] | None = None,
) -> TriangulationReport:
    """Triangulate sparse points from the images and known poses of a transforms.json scene, write them as
    ``sparse_pc.ply`` beside the transforms file and name them there with ``ply_file_path``.

    Args:
        path: the scene folder (``transforms.json``, or nerf_synthetic's ``transforms_train.json``).
        factor: image downscale factor features are extracted at (1, 2, 4, 8; ``images_<f>/`` is used when
            present); 0 picks the smallest that brings the first frame's longest side to at most
            :data:`MAX_SIDE` pixels.
        matcher: "exhaustive" (any order, up to a few hundred images) or "sequential" (video frames).
        overwrite: replace a ``ply_file_path`` the transforms file already has, and a ``sparse_pc.ply`` it
            does not name; without it both are refused.
        use_gpu: use CUDA for SIFT when pycolmap was built with it.
        verbose: let pycolmap log its progress (to stderr); otherwise it logs errors only.
        on_stage: called as each stage starts with its name (:data:`STAGES`) and what it does.

    Raises:
        ValueError: unknown ``matcher`` or ``factor``.
        DatasetError: no transforms file, a ``ply_file_path`` or ``sparse_pc.ply`` already there (without
            ``overwrite``), and what :func:`triangulate_frames` refuses.
        PycolmapUnavailableError: pycolmap is not installed.
    """
    root = Path(path)
    if not root.is_dir():
        raise DatasetError(f"{root}: scene folder does not exist")
    json_path = transforms_file(root)
    content = read_transforms(json_path)
    text = json_path.read_text(encoding="utf-8")  # kept byte for byte where the key is added
    ply_path = root / PLY_NAME
    if not overwrite:
        _check_nothing_replaced(json_path, content, ply_path)
    work = root / WORK_DIR
    frames_at = partial(every_frame, root)
    triangulation = triangulate_frames(root, frames_at, work, factor, matcher, use_gpu, verbose, on_stage)
    write_points_ply(ply_path, triangulation.points, triangulation.colors)
    change = _name_point_cloud(json_path, text, content)
    return TriangulationReport(triangulation, ply_path, json_path, change, work)


def _check_nothing_replaced(json_path: Path, content: dict, ply_path: Path) -> None:
    """Refuse to replace a point cloud the transforms file names, or a ``sparse_pc.ply`` it does not name."""
    if PLY_KEY in content:
        raise DatasetError(
            f'{json_path} already names a point cloud ("{PLY_KEY}": {json.dumps(content[PLY_KEY])}); '
            "pass --overwrite to replace it with triangulated points"
        )
    if ply_path.exists():
        raise DatasetError(
            f"{ply_path}: exists although {json_path.name} does not name it; move it away or pass --overwrite "
            "to replace it"
        )


def _name_point_cloud(json_path: Path, text: str, content: dict) -> str:
    """Make the transforms file name :data:`PLY_NAME` with ``ply_file_path`` and say what changed.

    A new key goes in as the object's first key, in the file's own layout, and an existing string value is
    replaced in place: the rest of the text stays byte for byte. A file where that cannot be done (the key
    also inside a frame, a value that is not a string) is written again as JSON with its indentation.
    """
    value = json.dumps(PLY_NAME)
    if content.get(PLY_KEY) == PLY_NAME:
        return f'unchanged (it already has "{PLY_KEY}": {value})'
    expected = {**content, PLY_KEY: PLY_NAME}
    entry = f'"{PLY_KEY}": {value}'
    if PLY_KEY in content:
        old = content[PLY_KEY]
        change = f'replaced "{PLY_KEY}": {json.dumps(old)} with {value}'
        change += f" ({old} is left in place)" if isinstance(old, str) else ""
        spans = [match.span() for match in re.finditer(rf'"{PLY_KEY}"\s*:\s*"(?:[^"\\]|\\.)*"', text)]
        edit = (*spans[0], entry) if len(spans) == 1 else None  # (start, end, replacement)
    else:
        change = f'added "{PLY_KEY}": {value}'
        opening = re.match(r"\s*\{(\s*)", text)  # the object's brace and the space before its first key
        edit = (opening.end(), opening.end(), f"{entry},{opening[1] or ' '}") if opening else None
    new_text = text[: edit[0]] + edit[2] + text[edit[1] :] if edit else ""
    try:
        kept = json.loads(new_text) == expected
    except json.JSONDecodeError:
        kept = False
    if not kept:
        indent = re.search(r"\n([ \t]+)\S", text)
        new_text = json.dumps(expected, indent=indent[1] if indent else None, ensure_ascii=False) + "\n"
        change += " (the file was written again as JSON)"
    with atomic_path(json_path) as tmp:
        tmp.write_text(new_text, encoding="utf-8")
        shutil.copymode(json_path, tmp)
    return change


def points_from_poses(scene: Scene, log: Callable[[str], None]) -> None:
    """Fill ``scene.points`` / ``colors`` (and the tracks) with ``scene.triangulate`` (its progress lines to ``log``);
    where it cannot, say why in ``points_hint``."""
    try:
        sfm = scene.sfm_tracks(log)
        scene.points, scene.colors = sfm.points, sfm.colors
        scene.observed, scene.keypoints, scene.keypoint_scale = sfm.observed, sfm.keypoints, sfm.keypoint_scale
    except PycolmapUnavailableError:
        scene.points_hint = (
            "with pycolmap installed (`pip install pycolmap`) training triangulates them from the images and their "
            "known poses"
        )
    except DatasetError as err:
        scene.points_hint = f"triangulating them from the known poses failed: {err}"


def attach_triangulation(scene: Scene) -> None:
    """Let ``scene`` triangulate its SfM points (``Scene.triangulate``) where its reader says it can
    (``Scene.posed_capture``)."""
    if scene.triangulate is None and scene.posed_capture is not None:
        scene.triangulate = partial(posed_tracks, scene.posed_capture)


def posed_tracks(capture: PosedCapture, log: Callable[[str], None]) -> SfmPoints:
    """The points triangulated from ``capture``'s images and poses (cached: :func:`training_points`), and where each
    was seen, the keypoints placed in the frames of ``capture.sizes``."""
    root, sizes = capture.root, capture.sizes
    triangulation = training_points(root, partial(every_frame, root, outside=capture.outside), log, capture.outside)
    return SfmPoints(
        points=torch.from_numpy(triangulation.points),
        colors=torch.from_numpy(triangulation.colors.astype(np.float32) / 255.0),
        observed={name: torch.from_numpy(rows) for name, rows in triangulation.observed.items()},
        keypoints={
            name: torch.from_numpy(keypoints) * torch.tensor(sizes[name]) / torch.tensor(triangulation.sizes[name])
            for name, keypoints in triangulation.keypoints.items()
            if name in sizes
        },
        keypoint_scale={
            name: triangulation.sizes[name][0] / sizes[name][0] for name in triangulation.sizes if name in sizes
        },
    )
