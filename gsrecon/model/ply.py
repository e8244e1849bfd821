"""Gaussian scenes in the reference 3DGS ``.ply`` layout (the PLY reading and writing itself: `gsrecon.io.ply`).

The ``.ply`` layout is the one written by the reference 3DGS implementation (Inria) and read by
the common 3DGS viewers: one ``vertex`` element with the float32 properties

    x y z nx ny nz f_dc_0..2 f_rest_0..(3K-1) opacity scale_0..2 rot_0..3

where normals are zero, ``f_rest`` is channel-major (all K rest coefficients of red, then green,
then blue), ``opacity`` is a logit, ``scale_*`` are logs and ``rot_*`` is an unnormalised
quaternion (w, x, y, z). Parameters use gsrecon's convention: ``means [N,3]``, ``scales [N,3]``,
``quats [N,4]``, ``opacities [N]``, ``sh0 [N,1,3]``, ``shN [N,K,3]`` with ``K = (D+1)^2 - 1``.

The render mode is recorded in two header comments, the spellings of Brush and of Postshot that
other tools (e.g. PlayCanvas splat-transform) read: ``comment SplatRenderMode: mip`` plus
``comment antialiased 1`` for a scene trained in antialiased (Mip-Splatting) mode, and
``comment SplatRenderMode: default`` plus ``comment antialiased 0`` for the classic mode.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from gsrecon.atomic import atomic_path
from gsrecon.errors import InputError
from gsrecon.io.ply import finite_column, read_ply, read_ply_header, write_binary_ply
from gsrecon.params import PARAM_NAMES, check_params
from gsrecon.sh import MAX_SH_DEGREE, sh_degree_of

_F_REST = re.compile(r"f_rest_(\d+)")


def ply_property_names(num_rest: int) -> list[str]:
    """The reference 3DGS property names, in file order, for ``num_rest`` rest SH coefficients per channel."""
    names = ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
    names += [f"f_rest_{i}" for i in range(3 * num_rest)]
    return [*names, "opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]


def render_mode_comments(antialiased: bool) -> list[str]:
    """The header comments that record the render mode (see the module docstring)."""
    return [f"SplatRenderMode: {'mip' if antialiased else 'default'}", f"antialiased {int(antialiased)}"]


def save_ply(path: str | os.PathLike, params: Mapping[str, Tensor], antialiased: bool = False) -> None:
    """Write Gaussian parameters to ``path`` in the reference 3DGS binary little-endian layout.

    Values are stored as float32 (bit-exact for float32 parameters); ``antialiased`` is recorded in
    the header comments. The file is written atomically (``gsrecon.atomic.atomic_path``), so
    ``path`` is never left half-written.
    """
    p = cpu_params(params)
    n, num_rest = p["means"].shape[0], p["shN"].shape[1]
    names = ply_property_names(num_rest)
    dtype = np.dtype([(name, "<f4") for name in names])

    def rows(start: int, stop: int) -> np.ndarray:  # [stop - start] records of the vertex element
        m = stop - start
        columns = torch.cat(
            [
                p["means"][start:stop],  # [M, 3]
                torch.zeros(m, 3),  # normals
                p["sh0"][start:stop].reshape(m, 3),  # [M, 3]
                p["shN"][start:stop].transpose(1, 2).reshape(m, 3 * num_rest),  # [M, 3K] channel-major
                p["opacities"][start:stop, None],  # [M, 1]
                p["scales"][start:stop],  # [M, 3]
                p["quats"][start:stop],  # [M, 4]
            ],
            dim=1,
        )  # [M, P]
        return columns.numpy()

    with atomic_path(path) as tmp:
        write_binary_ply(tmp, [("vertex", dtype, n, rows)], render_mode_comments(antialiased))


def load_ply(path: str | os.PathLike) -> dict[str, Tensor]:
    """Read Gaussian parameters from a ``.ply`` in the reference 3DGS layout.

    Accepts files written by the reference implementation and by other 3DGS tools: normals may be
    absent and extra properties are ignored. The SH degree is inferred from the number of
    ``f_rest_*`` properties. Returns float32 tensors keyed ``means, scales, quats, opacities, sh0, shN``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file is not a readable PLY, its header declares more data than the file
            holds, it lacks a property the layout requires, has no Gaussians, holds NaN / inf, or an SH degree above 3.
    """
    path = Path(path)
    vertex = read_ply(path)["vertex"]
    present = {prop.name for prop in vertex.properties}
    num_rest = num_rest_coeffs(path, present)
    required = [name for name in ply_property_names(num_rest) if name not in ("nx", "ny", "nz")]
    missing = [name for name in required if name not in present]
    if missing:
        raise InputError(f"{path}: missing 3DGS properties {missing}")
    n = vertex.count
    if n == 0:
        raise InputError(f"{path}: element 'vertex' has 0 Gaussians; there is nothing to load")
    params = {
        "means": torch.empty(n, 3),
        "scales": torch.empty(n, 3),
        "quats": torch.empty(n, 4),
        "opacities": torch.empty(n),
        "sh0": torch.empty(n, 1, 3),
        "shN": torch.empty(n, num_rest, 3),
    }
    # Each property is copied from the memory-mapped file straight into its place: no whole-scene temporaries.
    for name, (key, index) in _property_places(num_rest).items():
        params[key].numpy()[(slice(None), *index)] = finite_column(path, name, vertex[name])
    return params


def _property_places(num_rest: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Where each reference 3DGS property goes: the parameter and the index within a Gaussian's row."""
    rest = {f"f_rest_{c * num_rest + k}": ("shN", (k, c)) for c in range(3) for k in range(num_rest)}  # channel-major
    return {
        **rest,
        **{name: ("means", (i,)) for i, name in enumerate(("x", "y", "z"))},
        **{f"scale_{i}": ("scales", (i,)) for i in range(3)},
        **{f"rot_{i}": ("quats", (i,)) for i in range(4)},
        "opacity": ("opacities", ()),
        **{f"f_dc_{i}": ("sh0", (0, i)) for i in range(3)},
    }


def ply_antialiased(path: str | os.PathLike) -> bool | None:
    """The render mode recorded in a PLY's header comments: True (antialiased), False (classic), None (not recorded).

    Reads both spellings of the module docstring; when several comments say it, the last one wins.
    """
    mode = None
    for comment in read_ply_header(Path(path)).comments:
        words = comment.split()
        if words[:1] == ["SplatRenderMode:"] and words[1:] in (["mip"], ["default"]):
            mode = words[1] == "mip"
        elif words[:1] == ["antialiased"] and words[1:] in (["0"], ["1"]):
            mode = words[1] == "1"
    return mode


def cpu_params(params: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Validate the shapes of the six Gaussian tensors and return them as float32 CPU tensors."""
    check_params(params)
    return {key: params[key].detach().to("cpu", torch.float32) for key in PARAM_NAMES}


def num_rest_coeffs(path: Path, names: set[str]) -> int:
    """Rest SH coefficients per channel, from the ``f_rest_*`` names; must be ``(D+1)^2 - 1`` for some D."""
    indices = sorted(int(match[1]) for name in names if (match := _F_REST.fullmatch(name)))
    if indices != list(range(len(indices))):
        raise InputError(f"{path}: f_rest_* properties must be numbered f_rest_0, f_rest_1, ...; got indices {indices}")
    degree = None if len(indices) % 3 else sh_degree_of(len(indices) // 3)
    if degree is None:
        raise InputError(f"{path}: {len(indices)} f_rest_* properties is not 3*((D+1)^2-1) for any SH degree D")
    if degree > MAX_SH_DEGREE:
        raise InputError(
            f"{path}: {len(indices)} f_rest_* properties hold SH degree {degree}; gsrecon renders degree "
            f"{MAX_SH_DEGREE} at most"
        )
    return len(indices) // 3
