"""Gaussian scenes on disk: the reference 3DGS ``.ply`` layout and the ``.splat`` web-viewer layout.

The ``.ply`` layout is the one written by the reference 3DGS implementation (Inria) and read by
the common 3DGS viewers: one ``vertex`` element with the float32 properties

    x y z nx ny nz f_dc_0..2 f_rest_0..(3K-1) opacity scale_0..2 rot_0..3

where normals are zero, ``f_rest`` is channel-major (all K rest coefficients of red, then green,
then blue), ``opacity`` is a logit, ``scale_*`` are logs and ``rot_*`` is an unnormalised
quaternion (w, x, y, z). Parameters use gsrecon's convention: ``means [N,3]``, ``scales [N,3]``,
``quats [N,4]``, ``opacities [N]``, ``sh0 [N,1,3]``, ``shN [N,K,3]`` with ``K = (D+1)^2 - 1``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from plyfile import PlyData, PlyElement, PlyParseError
from torch import Tensor

from gsrecon.atomic import atomic_path
from gsrecon.model.gaussians import PARAM_NAMES, check_params
from gsrecon.render.sh import SH_C0, sh_degree_of

_F_REST = re.compile(r"f_rest_(\d+)")


def ply_property_names(num_rest: int) -> list[str]:
    """The reference 3DGS property names, in file order, for ``num_rest`` rest SH coefficients per channel."""
    names = ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
    names += [f"f_rest_{i}" for i in range(3 * num_rest)]
    return [*names, "opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]


def save_ply(path: str | os.PathLike, params: Mapping[str, Tensor]) -> None:
    """Write Gaussian parameters to ``path`` in the reference 3DGS binary little-endian layout.

    Values are stored as float32 (bit-exact for float32 parameters). The file is written atomically
    (``gsrecon.atomic.atomic_path``), so ``path`` is never left half-written.
    """
    arrays = _numpy_params(params)
    n, num_rest = arrays["means"].shape[0], arrays["shN"].shape[1]
    columns = np.concatenate(
        [
            arrays["means"],  # [N, 3]
            np.zeros((n, 3), np.float32),  # normals
            arrays["sh0"].reshape(n, 3),  # [N, 3]
            arrays["shN"].transpose(0, 2, 1).reshape(n, 3 * num_rest),  # [N, 3K] channel-major
            arrays["opacities"][:, None],  # [N, 1]
            arrays["scales"],  # [N, 3]
            arrays["quats"],  # [N, 4]
        ],
        axis=1,
    )  # [N, P]
    names = ply_property_names(num_rest)
    vertices = np.empty(n, dtype=[(name, "<f4") for name in names])
    for i, name in enumerate(names):
        vertices[name] = columns[:, i]
    ply = PlyData([PlyElement.describe(vertices, "vertex")], text=False, byte_order="<")
    with atomic_path(path) as tmp:
        ply.write(str(tmp))


def load_ply(path: str | os.PathLike) -> dict[str, Tensor]:
    """Read Gaussian parameters from a ``.ply`` in the reference 3DGS layout.

    Accepts files written by the reference implementation and by other 3DGS tools: normals may be
    absent and extra properties are ignored. The SH degree is inferred from the number of
    ``f_rest_*`` properties. Returns float32 tensors keyed ``means, scales, quats, opacities, sh0, shN``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file is not a readable PLY, or lacks a property the layout requires.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        ply = PlyData.read(str(path))
    except (PlyParseError, ValueError, EOFError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a readable PLY file ({e})") from e
    if "vertex" not in ply:
        raise ValueError(f"{path}: no 'vertex' element; not a 3DGS scene")
    vertex = ply["vertex"]
    present = {prop.name for prop in vertex.properties}
    num_rest = _num_rest_coeffs(path, present)
    required = [name for name in ply_property_names(num_rest) if name not in ("nx", "ny", "nz")]
    missing = [name for name in required if name not in present]
    if missing:
        raise ValueError(f"{path}: missing 3DGS properties {missing}")

    def stack(names: list[str]) -> np.ndarray:
        return np.stack([np.asarray(vertex[name], dtype=np.float32) for name in names], axis=1)

    n = vertex.count
    rest = stack([f"f_rest_{i}" for i in range(3 * num_rest)]) if num_rest else np.zeros((n, 0), np.float32)
    arrays = {
        "means": stack(["x", "y", "z"]),  # [N, 3]
        "scales": stack([f"scale_{i}" for i in range(3)]),  # [N, 3]
        "quats": stack([f"rot_{i}" for i in range(4)]),  # [N, 4]
        "opacities": stack(["opacity"])[:, 0],  # [N]
        "sh0": stack([f"f_dc_{i}" for i in range(3)])[:, None, :],  # [N, 1, 3]
        "shN": rest.reshape(n, 3, num_rest).transpose(0, 2, 1),  # [N, K, 3]
    }
    return {key: torch.from_numpy(np.ascontiguousarray(value)) for key, value in arrays.items()}


def save_splat(path: str | os.PathLike, params: Mapping[str, Tensor]) -> None:
    """Write Gaussians in the 32-byte-per-Gaussian ``.splat`` layout of the antimatter15 web viewer.

    Per Gaussian, little-endian: position 3 x float32, scale 3 x float32 (activated, ``exp``),
    colour RGBA 4 x uint8 (``0.5 + SH_C0 * sh0`` and ``sigmoid(opacity)``, times 255, clipped and
    truncated), rotation 4 x uint8 (normalised quaternion w, x, y, z encoded as ``q * 128 + 128``,
    clipped). View-dependent colour (``shN``) is dropped. Gaussians are ordered by decreasing
    ``volume * opacity`` (as the viewer's own converter does). Written atomically like ``save_ply``.
    """
    arrays = _numpy_params(params)
    log_scales, logit_opacity = arrays["scales"], arrays["opacities"]  # [N, 3], [N]
    opacity = 1.0 / (1.0 + np.exp(-logit_opacity))  # [N]
    order = np.argsort(-np.exp(log_scales.sum(axis=1)) * opacity, kind="stable")  # [N]
    rgba = np.concatenate([0.5 + SH_C0 * arrays["sh0"][:, 0, :], opacity[:, None]], axis=1)  # [N, 4]
    quats = arrays["quats"]
    quats = quats / np.linalg.norm(quats, axis=1, keepdims=True)  # [N, 4]
    records = np.empty(
        len(order), dtype=[("position", "<f4", 3), ("scale", "<f4", 3), ("rgba", "u1", 4), ("rot", "u1", 4)]
    )
    records["position"] = arrays["means"][order]
    records["scale"] = np.exp(log_scales[order])
    records["rgba"] = np.clip(rgba[order] * 255, 0, 255).astype(np.uint8)
    records["rot"] = np.clip(quats[order] * 128 + 128, 0, 255).astype(np.uint8)
    with atomic_path(path) as tmp:
        tmp.write_bytes(records.tobytes())


def _numpy_params(params: Mapping[str, Tensor]) -> dict[str, np.ndarray]:
    """Validate the shapes of the six Gaussian tensors and return them as float32 numpy arrays."""
    check_params(params)
    return {key: params[key].detach().to("cpu", torch.float32).numpy() for key in PARAM_NAMES}


def _num_rest_coeffs(path: Path, names: set[str]) -> int:
    """Rest SH coefficients per channel, from the ``f_rest_*`` names; must be ``(D+1)^2 - 1`` for some D."""
    indices = sorted(int(match[1]) for name in names if (match := _F_REST.fullmatch(name)))
    if indices != list(range(len(indices))):
        raise ValueError(f"{path}: f_rest_* properties must be numbered f_rest_0, f_rest_1, ...; got indices {indices}")
    if len(indices) % 3 or sh_degree_of(len(indices) // 3) is None:
        raise ValueError(f"{path}: {len(indices)} f_rest_* properties is not 3*((D+1)^2-1) for any SH degree D")
    return len(indices) // 3
