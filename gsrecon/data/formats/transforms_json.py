"""The transforms.json file of nerf_synthetic, instant-ngp and nerfstudio captures: where it is, its JSON, and the
image file a frame names (the reader: :mod:`gsrecon.data.readers.transforms`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gsrecon.data.capture_files import capture_file
from gsrecon.data.errors import DatasetError
from gsrecon.data.formats.images import IMAGE_EXTENSIONS


def read_transforms(path: Path) -> dict[str, Any]:
    """A transforms file's JSON object, with a 'frames' list of objects with 'file_path' and 'transform_matrix'."""
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DatasetError(f"{path}: invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}") from err
    except (OSError, UnicodeDecodeError) as err:
        raise DatasetError(f"{path}: cannot read ({err})") from err
    if not isinstance(content, dict) or not isinstance(content.get("frames"), list):
        raise DatasetError(f"{path}: expected a JSON object with a 'frames' list")
    for i, frame in enumerate(content["frames"]):
        if not isinstance(frame, dict) or "file_path" not in frame or "transform_matrix" not in frame:
            raise DatasetError(f"{path}: frame {i} needs 'file_path' and 'transform_matrix'")
    return content


def transforms_file(path: str | Path) -> Path:
    """The scene folder's main transforms file, whose top-level fields (``ply_file_path`` among them) are the
    scene's: nerf_synthetic's ``transforms_train.json``, else ``transforms.json``.

    Raises:
        DatasetError: the folder has neither.
    """
    root = Path(path)
    for name in ("transforms_train.json", "transforms.json"):
        if (root / name).is_file():
            return root / name
    raise DatasetError(f"{root}: no transforms_train.json or transforms.json found")


def image_path(root: Path, json_path: Path, file_path: str, outside: bool = False) -> Path:
    """The image file a frame's ``file_path`` names (relative to ``root``; the extension may be left out), inside
    ``root`` unless ``outside`` (:func:`~gsrecon.data.capture_files.capture_file`)."""
    path = capture_file(root, file_path, "image", f"{json_path}: frame {file_path!r}", outside)
    if path.is_file():
        return path
    extensions = [case(ext) for ext in IMAGE_EXTENSIONS for case in (str.lower, str.upper)]
    for ext in extensions:
        candidate = path.with_name(path.name + ext)
        if candidate.is_file():
            return candidate
    raise DatasetError(
        f"{path}: image file is missing (referenced by {json_path}; also tried adding {', '.join(extensions)})"
    )
