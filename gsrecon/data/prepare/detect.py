"""What a capture is, and so which shipped config trains it (``gsrecon train --data``): decided by what the files
hold, not by their names alone (docs/training.md, "What `--data` decides").

* A transforms file whose first image has a transparent background is a NeRF-synthetic scene (RGBA renders):
  ``blender_lego.yaml``, random points. Any other transforms file is a capture of photos with known poses
  (nerfstudio, Polycam, Record3D, instant-ngp, a phone capture published with its own split files):
  ``phone.yaml``, starting from the points its ``ply_file_path`` (or ``colmap/sparse/0/``) holds, else from points
  triangulated from its poses.
* A COLMAP model (``sparse/0/``): ``mipnerf360.yaml``, its SfM points.
* Photos, or videos, without poses: structure from motion first, into gsrecon's cache
  (:mod:`gsrecon.data.prepare.unposed`), then ``phone.yaml`` on the COLMAP scene it made.

A capture's own split (``transforms_train.json`` + ``transforms_test.json``, nerfstudio's ``test_filenames`` /
``train_filenames``, COLMAP's ``test.txt`` / ``train.txt``) is kept: ``data.eval_split=dataset``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gsrecon.config import apply_overrides
from gsrecon.data.errors import DatasetError, why_missing
from gsrecon.data.formats.colmap_model import find_sparse_dir
from gsrecon.data.formats.images import read_image
from gsrecon.data.formats.transforms_json import image_path, read_transforms, transforms_file
from gsrecon.data.prepare.unposed import StageAnnouncer, Unposed, are_videos, find_unposed, sfm_scene

CONFIGS_DIR = Path(__file__).resolve().parents[3] / "configs"  # the shipped configs, beside the package
SPLIT_LISTS = ("test_filenames", "train_filenames")  # nerfstudio's split, inside transforms.json
_INTRINSICS = ("fl_x", "fl_y", "cx", "cy", "w", "h", "camera_angle_x")
_DISTORTION = ("k1", "k2", "k3", "k4", "p1", "p2")


@dataclass
class Recipe:
    """How ``gsrecon train --data`` trains a capture (:func:`detect_capture`)."""

    config: Path  # the shipped config
    overrides: list[str]  # key=value pairs the capture needs on top of the config (the command line's still win)
    why: str  # what the capture is and what decided it
    start: str  # what training starts from: SfM points, points triangulated from the poses, random points
    name: str  # the capture's name: the run goes to outputs/<name> unless exp_dir is set
    unposed: Unposed | None = None  # photos or videos that structure from motion poses first
    folder: Path | None = None  # the scene folder to train (None: the one structure from motion makes)

    @property
    def exp_dir(self) -> str:
        return f"outputs/{self.name}"

    def describe(self, data: str) -> str:
        """The line that says which config trains ``data`` and why."""
        keys = "".join(f" {key}" for key in self.overrides)
        start = f"starts from {self.start}"
        return f"using {self.config}{keys} for {data}: {self.why}; {start} (exp_dir {self.exp_dir} unless set)"


@dataclass
class _Evidence:
    """What decided, in words, in the order found."""

    found: list[str] = field(default_factory=list)

    def add(self, what: str, present: object = True) -> None:
        if present:
            self.found.append(what)

    def __str__(self) -> str:
        return "; ".join(self.found)


def config_for_capture(
    data: Sequence[str],
    config: str | None,
    announce: Callable[[str], None],
    announcer: StageAnnouncer,
    log: Callable[[str], None],
    overrides: Sequence[str] = (),
) -> tuple[str, list[str]]:
    """(the config, the key=value pairs) that train the capture ``data`` names (``gsrecon train --data``): ``config``
    with ``data.path`` where given, else the recipe :func:`detect_capture` picks, announced in one line. Photos and
    videos without poses go through structure from motion first (:func:`~gsrecon.data.prepare.unposed.sfm_scene`);
    with ``config`` given, only video files do (a folder is ``data.path`` as it is, for the config's reader).
    ``overrides``: the command line's key=value pairs (detection honours ``data.outside_capture``).

    Raises:
        DatasetError: what :func:`detect_capture` refuses; PycolmapUnavailableError and DatasetError from
            structure from motion.
    """
    paths = [Path(path) for path in data]
    if config is not None:
        if are_videos(paths):
            scene = sfm_scene(find_unposed(paths), announcer, log)
            return config, [_key("data.path", str(scene)), "data.dataset=colmap"]
        if len(paths) > 1:
            raise DatasetError("several --data name video files only; a scene folder is one --data")
        return config, [_key("data.path", data[0])]
    outside = apply_overrides({}, overrides).get("data", {}).get("outside_capture") is True
    recipe = detect_capture(paths, outside)
    announce(recipe.describe(" ".join(data)))
    folder = recipe.folder if recipe.unposed is None else sfm_scene(recipe.unposed, announcer, log)
    return str(recipe.config), [_key("data.path", str(folder)), _key("exp_dir", recipe.exp_dir), *recipe.overrides]


def _key(name: str, value: str) -> str:
    return f"{name}={json.dumps(value)}"  # quoted: the value stays a string


def detect_capture(paths: Sequence[Path], outside: bool = False) -> Recipe:
    """The recipe for the capture at ``paths``: one scene folder, one folder of photos or videos, or video files;
    ``outside``: a transforms file's images may lie outside its folder (``data.outside_capture``).

    Raises:
        DatasetError: a missing path, a folder holding no capture gsrecon knows, photos too few or unreadable,
            a video ffmpeg cannot read, malformed transforms files, or the configs not beside the package.
    """
    if not paths:
        raise DatasetError("--data names no capture")
    root = paths[0]
    if len(paths) == 1:
        if not root.exists():
            raise DatasetError(
                f"{root}: --data must be a scene folder, photos or videos, and this path {why_missing(root)}"
            )
        sparse_dir = _colmap_model(root)
        if any((root / name).is_file() for name in ("transforms.json", "transforms_train.json")):
            recipe = _transforms_recipe(root, outside)
            if sparse_dir is not None:
                recipe.why += (
                    f"; not the COLMAP model beside it ({sparse_dir.relative_to(root).as_posix()}/), which "
                    f"--config {_shipped('mipnerf360.yaml')} --data {root} trains"
                )
            return recipe
        if sparse_dir is not None:
            return _colmap_recipe(root, sparse_dir)
    unposed = find_unposed(paths)
    if unposed is None:
        raise DatasetError(
            f"{root}: no capture gsrecon knows: a COLMAP model (sparse/0/), a transforms.json (or "
            "transforms_train.json + transforms_test.json), photos or videos; pass --config for your own layout"
        )
    name = root.resolve().name if root.is_dir() else root.stem
    return Recipe(
        _shipped("phone.yaml"),
        ["data.dataset=colmap"],
        f"{unposed.describe()} without poses: structure from motion first (gsrecon data colmap, into gsrecon's cache)",
        "the SfM points of structure from motion",
        name,
        unposed=unposed,
    )


def _colmap_model(root: Path) -> Path | None:
    """The folder of the COLMAP model in the scene folder ``root`` (``sparse/0/`` or ``sparse/``), None without one."""
    if root.is_dir() and any((root / sub).is_dir() for sub in ("sparse/0", "sparse")):
        with contextlib.suppress(DatasetError):  # no cameras file there: not a COLMAP model
            return find_sparse_dir(root)
    return None


def _transforms_recipe(root: Path, outside: bool) -> Recipe:
    """A NeRF-synthetic scene (RGBA renders with a transparent background) or a capture of photos with known poses."""
    json_path = transforms_file(root)
    content = read_transforms(json_path)
    frames = content["frames"]
    if not frames:
        raise DatasetError(f"{json_path}: the file lists no frames")
    first = image_path(root, json_path, str(frames[0]["file_path"]), outside)
    pixels = read_image(first)  # [H, W, 3] or [H, W, 4]
    transparent = pixels.shape[2] == 4 and int(pixels[..., 3].min()) < 255
    kind = first.suffix.lstrip(".").upper()
    split_files = json_path.name == "transforms_train.json" and (root / "transforms_test.json").is_file()
    split_lists = [key for key in SPLIT_LISTS if key in content]
    evidence = _Evidence()
    evidence.add("transforms_train.json + transforms_test.json" if split_files else json_path.name)
    evidence.add(f"{kind} images with a transparent background" if transparent else f"{kind} photos without alpha")
    if "camera_model" in content:
        evidence.add(f"camera_model {content['camera_model']}")
    per_frame = any(key in frame for frame in frames for key in _INTRINSICS)
    evidence.add("per-frame intrinsics" if per_frame else "fl_x", per_frame or "fl_x" in content)
    evidence.add("camera_angle_x", "camera_angle_x" in content and "fl_x" not in content)
    evidence.add("distortion", any(_nonzero(f.get(k)) for f in (content, *frames) for k in _DISTORTION))
    evidence.add(f"ply_file_path {content.get('ply_file_path')}", "ply_file_path" in content)
    evidence.add("aabb_scale", "aabb_scale" in content)
    evidence.add("masks", (root / "masks").is_dir() or any("mask_path" in frame for frame in frames))
    evidence.add("depth maps", (root / "depth").is_dir() or any("depth_file_path" in frame for frame in frames))
    evidence.add(" + ".join(split_lists), split_lists)
    own_split = split_files or bool(split_lists)
    if transparent:
        overrides = [] if own_split else ["data.eval_split=every_8"]
        return Recipe(
            _shipped("blender_lego.yaml"),
            overrides,
            f"a NeRF-synthetic scene ({evidence})",
            "random points",
            root.resolve().name,
            folder=root,
        )
    overrides = ["data.eval_split=dataset"] if own_split else []
    return Recipe(
        _shipped("phone.yaml"),
        overrides,
        f"photos with known poses ({evidence})",
        _posed_start(root, content),
        root.resolve().name,
        folder=root,
    )


def _nonzero(value: object) -> bool:
    return isinstance(value, (int, float)) and value != 0


def _posed_start(root: Path, content: dict) -> str:
    """What training a capture of photos with known poses starts from (``model.init: auto``)."""
    if "ply_file_path" in content:
        return f"the SfM points of its ply_file_path ({content['ply_file_path']})"
    if any((root / "colmap" / "sparse" / "0" / f"points3D{ext}").is_file() for ext in (".bin", ".txt")):
        return "the SfM points of colmap/sparse/0/"
    if importlib.util.find_spec("pycolmap") is None:
        return "random points (with pycolmap installed: points triangulated from its poses)"
    return "points triangulated from its poses (once: the next run reads them from gsrecon's cache)"


def _colmap_recipe(root: Path, sparse_dir: Path) -> Recipe:
    """A COLMAP scene: its model, the downscaled image folders and masks beside it, its own split lists."""
    evidence = _Evidence()
    evidence.add(f"{sparse_dir.relative_to(root).as_posix()}/ holds a COLMAP model")
    prescaled = sorted(p.name + "/" for p in root.glob("images_*") if p.is_dir())
    evidence.add(", ".join(prescaled), prescaled)
    evidence.add("masks", (root / "masks").is_dir())
    lists = [name for name in ("test.txt", "train.txt") if (root / name).is_file()]
    evidence.add(" + ".join(lists), lists)
    return Recipe(
        _shipped("mipnerf360.yaml"),
        ["data.eval_split=dataset"] if lists else [],
        f"a COLMAP scene ({evidence})",
        "its SfM points",
        root.resolve().name,
        folder=root,
    )


def _shipped(name: str) -> Path:
    config = CONFIGS_DIR / name
    if not config.is_file():
        raise DatasetError(f"{config}: missing (gsrecon's configs/ is not beside its package here); pass --config")
    return config
