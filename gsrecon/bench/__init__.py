"""The published protocols (a suite per dataset) and the runner that scores gsrecon by them beside the peers."""

from __future__ import annotations

from gsrecon.bench import deep_blending, llff, mipnerf360, nerf_synthetic, tanks_and_temples
from gsrecon.bench.protocol import Reference, Scene, Suite

SUITES: dict[str, Suite] = {
    module.SUITE.name: module.SUITE for module in (mipnerf360, tanks_and_temples, deep_blending, nerf_synthetic, llff)
}

__all__ = ["SUITES", "Reference", "Scene", "Suite"]
