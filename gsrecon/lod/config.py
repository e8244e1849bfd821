"""What ``gsrecon lod`` builds (a light module: the command line reads its defaults)."""

from __future__ import annotations

from dataclasses import dataclass

from gsrecon.errors import InputError


@dataclass(frozen=True)
class LodConfig:
    """What ``gsrecon lod`` builds."""

    levels: int = 2  # levels 1..levels below the trained scene, each about half the Gaussians of the one above
    steps: int = 100  # training steps of each level after its merge (BENCHMARKS.md: more overfit the statuette)
    scale: int = 2  # each level is trained at this many times the resolution divisor of the one above

    def __post_init__(self) -> None:
        if self.levels < 1:
            raise InputError(f"--levels must be >= 1 (levels below the trained scene), got {self.levels}")
        if self.steps < 1:
            raise InputError(f"--steps must be >= 1 (training steps per level), got {self.steps}")
        if self.scale not in (1, 2):
            raise InputError(f"--scale must be 1 (every level at the run's resolution) or 2 (halved), got {self.scale}")
