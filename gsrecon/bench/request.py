"""What a suite run is asked to do: the suite, the folder of scenes, the steps, the schedule, the peers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gsrecon.bench.peers import PeerSetup
from gsrecon.bench.protocol import Suite

SCHEDULES = ("config", "3dgs")  # the config's own schedule, or the 3DGS paper's scaled to the steps (both trainers)
STRATEGIES = ("default", "mcmc")
SETTINGS_FILE = "suite.json"  # what the suite was started with: a resumed suite must match it


@dataclass(frozen=True)
class SuiteRun:
    """One suite over a folder of scenes: what trains, how long, and where the results go."""

    suite: Suite
    data: Path  # the folder holding a folder per scene
    out: Path  # the results folder
    steps: int
    config: str  # the YAML gsrecon trains with
    scenes: tuple[str, ...]  # the suite's scenes to run, in order
    peers: tuple[str, ...] = ()
    schedule: str = "config"
    strategy: str = "default"
    cap_max: int = 1_000_000  # MCMC's Gaussian budget (gsrecon and gsplat alike)
    seed: int = 0
    curve_points: int = 4  # validations over the run: the points of the PSNR-against-time plot
    overrides: tuple[str, ...] = ()  # the user's key=value pairs, applied last
    peer_setup: PeerSetup = field(default_factory=PeerSetup)

    def settings(self) -> dict[str, Any]:
        """What decides the results (a resumed suite must have the same)."""
        return {
            "suite": self.suite.name, "data": str(self.data.resolve()), "steps": self.steps, "config": self.config,
            "peers": list(self.peers), "schedule": self.schedule, "strategy": self.strategy, "cap_max": self.cap_max,
            "seed": self.seed, "curve_points": self.curve_points, "overrides": list(self.overrides),
        }  # fmt: skip

    @property
    def val_interval(self) -> int:
        return max(1, self.steps // max(1, self.curve_points))
