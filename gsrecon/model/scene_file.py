"""Reading a scene file of Gaussians by its kind: a reference 3DGS ``.ply`` or a ``KHR_gaussian_splatting`` glTF."""

from __future__ import annotations

import os
from pathlib import Path

from torch import Tensor

from gsrecon.model.gltf import load_gltf
from gsrecon.model.ply import load_ply

GLTF_SUFFIXES = (".glb", ".gltf")


def load_gaussians(path: str | os.PathLike) -> dict[str, Tensor]:
    """Gaussian parameters from ``path``: a ``.glb`` or ``.gltf`` by `load_gltf`, any other file by `load_ply`."""
    return load_gltf(path) if Path(path).suffix.lower() in GLTF_SUFFIXES else load_ply(path)
