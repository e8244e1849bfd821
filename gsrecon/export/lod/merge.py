"""A coarser level of detail from a finer one: neighbouring Gaussians merged in pairs by moment matching.

A merged Gaussian keeps its parents' mass (opacity × volume, the volume ``s_x s_y s_z`` of the ellipsoid), their
mass-weighted mean, the mass-weighted covariance about that mean (each parent's covariance plus the spread of
its mean) and their mass-weighted colour (all SH coefficients). Its opacity is the mass over its own volume,
capped below 1, so that a pair of far-apart parents spreads their mass over the larger ellipsoid.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch
from scipy.spatial import cKDTree
from torch import Tensor

from gsrecon.export.compressed_ply import morton_order
from gsrecon.geometry import quat_scale_to_factor, rotmat_to_quat
from gsrecon.model.ply import cpu_params

MAX_OPACITY = 0.99  # a merged Gaussian's opacity is capped here (its logit must stay finite)
MUTUAL_ROUNDS = 4  # rounds of pairing mutual nearest neighbours before the rest pair along a Morton curve
_MIN_SCALE = 1e-8  # floor of a merged Gaussian's scales (a degenerate pair of coincident flat Gaussians)


def neighbour_pairs(means: Tensor) -> Tensor:
    """Pairs [floor(N / 2), 2] of distinct row indices of ``means`` [N, 3], every row in at most one pair.

    Mutual nearest neighbours are paired first, for :data:`MUTUAL_ROUNDS` rounds over the rows still unpaired; the
    rest are paired in turn along a Morton curve, so the pairs are as close as a linear-time pass gives."""
    points = means.double().numpy()
    free = np.arange(len(points))
    pairs: list[np.ndarray] = []
    for _ in range(MUTUAL_ROUNDS):
        if len(free) < 2:
            break
        _, nearest = cKDTree(points[free]).query(points[free], k=2)  # [M, 2]: itself, then its neighbour
        partner = nearest[:, 1]
        mutual = (partner[partner] == np.arange(len(free))) & (np.arange(len(free)) < partner)
        if not mutual.any():
            break
        pairs.append(np.stack([free[mutual], free[partner[mutual]]], axis=1))
        paired = np.zeros(len(free), bool)
        paired[mutual] = True
        paired[partner[mutual]] = True
        free = free[~paired]
    rest = free[morton_order(means[torch.from_numpy(free)]).numpy()] if len(free) else free
    rest = rest[: len(rest) // 2 * 2].reshape(-1, 2)
    return torch.from_numpy(np.concatenate([*pairs, rest]).astype(np.int64))


def halve(params: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Gaussians ``params`` (pre-activation) with neighbours merged in pairs (:func:`neighbour_pairs`,
    :func:`merge_pairs`): ceil(N / 2) rows, the unpaired one (odd N) kept as it is."""
    p = cpu_params(params)
    pairs = neighbour_pairs(p["means"])  # [P, 2]
    single = torch.ones(len(p["means"]), dtype=torch.bool)
    single[pairs.reshape(-1)] = False
    merged = merge_pairs(p, pairs)
    return {key: torch.cat([merged[key], p[key][single]]) for key in p}


def merge_pairs(p: Mapping[str, Tensor], pairs: Tensor) -> dict[str, Tensor]:
    """One Gaussian per row of ``pairs`` [P, 2] (indices into the float32 CPU parameters ``p``), moment matched
    (see the module docstring); computed in float64."""
    means = p["means"].double()[pairs]  # [P, 2, 3]
    scales = torch.exp(p["scales"].double()[pairs])  # [P, 2, 3]
    opacity = torch.sigmoid(p["opacities"].double()[pairs])  # [P, 2]
    mass = opacity * scales.prod(dim=-1)  # [P, 2]
    total = mass.sum(dim=1).clamp_min(1e-300)  # [P]
    weight = torch.where(mass.sum(dim=1, keepdim=True) > 0, mass / total[:, None], 0.5)  # [P, 2]
    mean = (weight[..., None] * means).sum(dim=1)  # [P, 3]
    factor = quat_scale_to_factor(p["quats"].double()[pairs].reshape(-1, 4), scales.reshape(-1, 3))  # [2P, 3, 3]
    covariance = (factor @ factor.transpose(1, 2)).reshape(-1, 2, 3, 3)  # [P, 2, 3, 3]
    offset = means - mean[:, None]  # [P, 2, 3]
    spread = covariance + offset[..., :, None] * offset[..., None, :]
    merged_cov = (weight[..., None, None] * spread).sum(dim=1)  # [P, 3, 3]
    eigenvalues, axes = torch.linalg.eigh(merged_cov)  # ascending; columns of ``axes`` are the axes
    axes = axes * torch.where(torch.linalg.det(axes) < 0, -1.0, 1.0)[:, None, None]  # a rotation, not a reflection
    new_scales = eigenvalues.clamp_min(_MIN_SCALE**2).sqrt()  # [P, 3]
    new_opacity = (total / new_scales.prod(dim=-1)).clamp(max=MAX_OPACITY)  # [P]
    colour = {key: (weight[:, :, None, None] * p[key].double()[pairs]).sum(dim=1) for key in ("sh0", "shN")}
    return {
        "means": mean.float(),
        "scales": new_scales.log().float(),
        "quats": rotmat_to_quat(axes).float(),
        "opacities": torch.logit(new_opacity.clamp_min(math.ulp(1.0))).float(),
        "sh0": colour["sh0"].float(),
        "shN": colour["shN"].float(),
    }
