"""What a capture folder holds, and so which shipped config trains it (``gsrecon train --data FOLDER``)."""

from __future__ import annotations

from pathlib import Path

from gsrecon.data.errors import DatasetError
from gsrecon.data.formats.colmap_model import find_sparse_dir

CONFIGS_DIR = Path(__file__).resolve().parents[3] / "configs"  # the shipped configs, beside the package


def config_for_capture(root: Path) -> tuple[str, str]:
    """(the shipped config for the capture in ``root``, why): by the files the folder holds.

    Raises:
        DatasetError: the folder holds no capture gsrecon reads, or the configs are not beside the package.
    """
    if not root.is_dir():
        raise DatasetError(f"{root}: --data must be a scene folder, and this one does not exist")
    if (root / "transforms_train.json").is_file() and (root / "transforms_test.json").is_file():
        name, why = "blender_lego.yaml", "transforms_train.json + transforms_test.json, a NeRF-synthetic scene"
    elif (root / "transforms.json").is_file() or (root / "transforms_train.json").is_file():
        name, why = "phone.yaml", "transforms.json, a phone / nerfstudio capture"
    else:
        try:
            sparse_dir = find_sparse_dir(root)
        except DatasetError:
            raise DatasetError(
                f"{root}: no capture gsrecon knows (a COLMAP sparse/0/, a transforms.json, or NeRF-synthetic's "
                "transforms_train.json + transforms_test.json); pass --config for your own layout"
            ) from None
        name, why = "mipnerf360.yaml", f"{sparse_dir.relative_to(root).as_posix()}/ holds a COLMAP model"
    config = CONFIGS_DIR / name
    if not config.is_file():
        raise DatasetError(f"{config}: missing (gsrecon's configs/ is not beside its package here); pass --config")
    return str(config), why
