"""Real spherical harmonics up to degree 3, in the basis and sign convention of 3DGS.

The basis, constants and ordering are those of the reference 3DGS code (``eval_sh``) and of
gsplat, so coefficients trained here can be written to, and read from, a standard 3DGS ``.ply``.
Coefficient ``k`` of a Gaussian multiplies basis function ``k`` in the order
``[Y00 | Y1-1 Y10 Y11 | Y2-2 ... Y22 | Y3-3 ... Y33]``; degree ``d`` uses the first ``(d+1)^2``.
"""

from __future__ import annotations

import torch
from torch import Tensor

SH_C0 = 0.28209479177387814
SH_C1 = 0.4886025119029199
SH_C2 = (
    1.0925484305920792,
    -1.0925484305920792,
    0.31539156525252005,
    -1.0925484305920792,
    0.5462742152960396,
)
SH_C3 = (
    -0.5900435899266435,
    2.890611442640554,
    -0.4570457994644658,
    0.3731763325901154,
    -0.4570457994644658,
    1.445305721320277,
    -0.5900435899266435,
)
MAX_SH_DEGREE = 3


def num_sh_bases(degree: int) -> int:
    """Number of SH coefficients per colour channel used by degree ``degree``: ``(degree+1)^2``."""
    return (degree + 1) ** 2


def sh_degree_of(num_rest: int) -> int | None:
    """The degree D whose ``(D+1)^2 - 1`` rest coefficients per channel equal ``num_rest``, or None."""
    degree = round((num_rest + 1) ** 0.5) - 1
    return degree if degree >= 0 and num_sh_bases(degree) - 1 == num_rest else None


def sh_basis(degree: int, dirs: Tensor) -> Tensor:
    """Values of the first ``(degree+1)^2`` SH basis functions at unit directions ``dirs`` [..., 3].

    Returns ``[..., (degree+1)^2]``.
    """
    if not 0 <= degree <= MAX_SH_DEGREE:
        raise ValueError(f"SH degree must be in 0..{MAX_SH_DEGREE}, got {degree}")
    x, y, z = dirs.unbind(-1)
    out = [torch.full_like(x, SH_C0)]
    if degree >= 1:
        out += [-SH_C1 * y, SH_C1 * z, -SH_C1 * x]
    if degree >= 2:
        xx, yy, zz = x * x, y * y, z * z
        xy, yz, xz = x * y, y * z, x * z
        out += [
            SH_C2[0] * xy,
            SH_C2[1] * yz,
            SH_C2[2] * (2.0 * zz - xx - yy),
            SH_C2[3] * xz,
            SH_C2[4] * (xx - yy),
        ]
    if degree >= 3:
        out += [
            SH_C3[0] * y * (3.0 * xx - yy),
            SH_C3[1] * xy * z,
            SH_C3[2] * y * (4.0 * zz - xx - yy),
            SH_C3[3] * z * (2.0 * zz - 3.0 * xx - 3.0 * yy),
            SH_C3[4] * x * (4.0 * zz - xx - yy),
            SH_C3[5] * z * (xx - yy),
            SH_C3[6] * x * (xx - 3.0 * yy),
        ]
    return torch.stack(out, dim=-1)


def axis_flip_sh_signs(flip: Tensor, num_rest: int) -> Tensor:
    """Sign ``[num_rest]`` each rest SH coefficient takes when the axes are multiplied by ``flip`` [3] (each +-1, an
    even number of -1: a rotation by 180 degrees about the axis kept): the parity of its basis function."""
    direction = torch.nn.functional.normalize(torch.tensor([0.2, 0.5, 0.8]), dim=0)  # no basis function is 0 here
    basis = sh_basis(MAX_SH_DEGREE, direction)[1 : 1 + num_rest]
    return torch.sign(sh_basis(MAX_SH_DEGREE, direction * flip)[1 : 1 + num_rest] / basis)


def spherical_harmonics(degree: int, dirs: Tensor, coeffs: Tensor) -> Tensor:
    """Evaluate SH colour functions in the given directions.

    Args:
        degree: active SH degree, 0..3. Only the first ``(degree+1)^2`` coefficients are read, so
            ``coeffs`` may hold more (a model whose maximum degree is not yet active).
        dirs: unit view directions, ``[..., 3]``.
        coeffs: SH coefficients, ``[..., K, 3]`` with ``K >= (degree+1)^2``; broadcast with ``dirs``.

    Returns:
        The raw SH value per channel, ``[..., 3]``, without the +0.5 offset of 3DGS colours
        (see `sh_to_color`).
    """
    n_bases = num_sh_bases(degree)
    if coeffs.shape[-2] < n_bases:
        raise ValueError(
            f"SH degree {degree} needs {n_bases} coefficients per channel, got coeffs of shape {tuple(coeffs.shape)}"
        )
    basis = sh_basis(degree, dirs)  # [..., n_bases]
    return (basis[..., None] * coeffs[..., :n_bases, :]).sum(-2)


def sh_to_color(degree: int, dirs: Tensor, coeffs: Tensor) -> Tensor:
    """RGB colour of 3DGS Gaussians: ``max(spherical_harmonics(...) + 0.5, 0)``, ``[..., 3]``."""
    return (spherical_harmonics(degree, dirs, coeffs) + 0.5).clamp_min(0.0)


def rgb_to_sh(rgb: Tensor) -> Tensor:
    """DC coefficient that makes a Gaussian show colour ``rgb`` (in [0, 1]) from every direction."""
    return (rgb - 0.5) / SH_C0


def sh_to_rgb(sh: Tensor) -> Tensor:
    """Colour shown by a DC coefficient alone (inverse of `rgb_to_sh`, before clamping)."""
    return sh * SH_C0 + 0.5
