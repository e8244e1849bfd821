"""Fixed-point pieces shared by the compressed formats: rounding, 8-bit opacity, smallest-three quaternions."""

from __future__ import annotations

import torch
from torch import Tensor

# Indices of the three components other than the largest, ascending, for each index of the largest.
_OTHERS = torch.tensor([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])


def round_clamp(x: Tensor, top: int) -> Tensor:
    """``x`` rounded half up and clamped to ``[0, top]``, as int64 (the reference encoders' rounding)."""
    return torch.floor(x + 0.5).clamp(0, top).long()


def byte_logit(alpha: Tensor) -> Tensor:
    """Logit opacity of 8-bit alphas ``alpha / 255``; 0 and 255 decode to their bucket's inner edge (finite)."""
    return torch.logit(alpha.double().clamp(0.5, 254.5) / 255).float()


def smallest_three(quats: Tensor) -> tuple[Tensor, Tensor]:
    """Split unit quaternions [N, 4] into the index of the largest |component| [N] (made positive by
    negating the quaternion, the same rotation) and the other three components in index order [N, 3]."""
    largest = quats.abs().argmax(dim=1)  # [N]; the first of equal maxima, like the reference encoders
    sign = torch.where(quats.gather(1, largest[:, None]) < 0, -1.0, 1.0)  # [N, 1]
    return largest, (quats * sign).gather(1, _OTHERS[largest])


def from_smallest_three(largest: Tensor, rest: Tensor) -> Tensor:
    """Unit quaternions [N, 4] from `smallest_three`'s parts; the largest component is ``sqrt(1 - |rest|^2)``."""
    quats = torch.zeros(largest.shape[0], 4)
    quats.scatter_(1, _OTHERS[largest], rest.float())
    big = (1.0 - rest.float().square().sum(dim=1)).clamp_min(0.0).sqrt()  # [N]
    return quats.scatter_(1, largest[:, None], big[:, None])


def pack_2_10_10_10(largest: Tensor, fields: Tensor) -> Tensor:
    """A uint32 (as int64) [N]: ``largest`` [N] in the top 2 bits, then the 10-bit ``fields`` [N, 3], first highest."""
    word = largest.long()
    for i in range(3):
        word = (word << 10) | fields[:, i].long()
    return word


def unpack_2_10_10_10(words: Tensor) -> tuple[Tensor, Tensor]:
    """Inverse of `pack_2_10_10_10`: ``largest`` [N] and ``fields`` [N, 3]."""
    words = words.long()
    fields = torch.stack([(words >> shift) & 1023 for shift in (20, 10, 0)], dim=1)  # [N, 3]
    return words >> 30, fields
