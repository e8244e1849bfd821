"""Which renderer a run uses: what ``renderer.name: auto`` means on a device, and which renderer draws a trained scene
on a device its own renderer cannot use. Choosing ``cpu`` builds its kernels (once per process: the renderer's
``setup`` then finds them loaded); :func:`preferred_renderer` chooses without building, for a run that builds them
only once its folder is claimed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from gsrecon.registry import RENDERER_REGISTRY
from gsrecon.render.base import RendererConfig


def auto_renderer(device: torch.device, log: Callable[[str], None] | None = None) -> str:
    """The renderer ``auto`` picks on ``device``: :func:`preferred_renderer`'s, where it is ``cpu`` only once its
    kernels are built (:func:`cpu_or_torch`)."""
    name = preferred_renderer(device)
    return cpu_or_torch(log) if name == "cpu" else name


def preferred_renderer(device: torch.device) -> str:
    """The renderer ``auto`` prefers on ``device``, nothing built: gsplat on CUDA (when installed), the compiled
    ``cpu`` renderer on the CPU and the torch renderer elsewhere (e.g. ``mps``)."""
    if device.type == "cuda" and "gsplat" in RENDERER_REGISTRY:
        return "gsplat"
    return "cpu" if device.type == "cpu" else "torch"


def cpu_or_torch(log: Callable[[str], None] | None = None) -> str:
    """``cpu`` once the cpu renderer's kernels are loaded (built first if not cached, saying so through ``log``), else
    ``torch`` with one line through ``log`` saying why they cannot be built here."""
    from gsrecon.kernels.build import kernels_unavailable

    why = kernels_unavailable(log)
    if why is None:
        return "cpu"
    if log is not None:
        log(f"renderer auto: the torch renderer, since the cpu renderer's C++ kernels cannot be built here ({why})")
    return "torch"


def renderer_on_device(entry: dict[str, Any], device: torch.device, log: Callable[[str], None]) -> dict[str, Any]:
    """A resolved renderer ``entry`` that a trained scene renders with on ``device``: itself, or where it cannot run
    there (gsplat without CUDA; cpu on another device or where its kernels cannot be built) the torch renderer with
    the same shared settings (`RendererConfig`) and the trained renderer's alpha clamp, so that it sees the same
    image; ``log`` hears why."""
    from gsrecon.kernels.build import kernels_unavailable
    from gsrecon.render.cpu.renderer import CpuRenderer
    from gsrecon.render.gsplat_renderer import GSPLAT_ALPHA_MAX

    shared = {f.name for f in dataclasses.fields(RendererConfig)}
    shared.discard("tile_size")  # the torch renderer's own tiling gives the same image
    if entry["name"] == "gsplat" and device.type != "cuda":
        entry = {"name": "torch", **{k: v for k, v in entry.items() if k in shared}, "alpha_max": GSPLAT_ALPHA_MAX}
        log("trained with renderer gsplat, which needs CUDA: rendering with the torch renderer (same settings)")
    elif entry["name"] == "cpu":
        why = f"renders on the CPU, not on {device}" if device.type != "cpu" else kernels_unavailable(log)
        if why is not None:
            alpha_max = entry.get("alpha_max", CpuRenderer.Config.alpha_max)
            entry = {"name": "torch", **{k: v for k, v in entry.items() if k in shared}, "alpha_max": alpha_max}
            log(f"trained with renderer cpu ({why}): rendering with the torch renderer (same settings)")
    return entry
