"""Which renderer a run uses: what ``renderer.name: auto`` means on a device."""

from __future__ import annotations

from collections.abc import Callable

import torch

from gsrecon.registry import RENDERER_REGISTRY


def auto_renderer(device: torch.device, log: Callable[[str], None] | None = None) -> str:
    """The renderer ``auto`` picks: gsplat on CUDA (when installed), the compiled ``cpu`` renderer on the CPU (its
    kernels built first if not cached; the torch renderer where they cannot be, with one line through ``log``
    saying why), and the torch renderer elsewhere (e.g. ``mps``)."""
    if device.type == "cuda" and "gsplat" in RENDERER_REGISTRY:
        return "gsplat"
    if device.type != "cpu":
        return "torch"
    from gsrecon.render.cpu.kernels import kernels_unavailable

    why = kernels_unavailable(log)
    if why is None:
        return "cpu"
    if log is not None:
        log(f"renderer auto: the torch renderer, since the cpu renderer's C++ kernels cannot be built here ({why})")
    return "torch"
