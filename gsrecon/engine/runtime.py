"""Where a run computes: its device (``auto``, CUDA under torchrun, Apple's MPS) and torch's CPU threads, and what
a run that ran out of the device's memory says."""

from __future__ import annotations

import os

import torch

from gsrecon.config import ConfigError
from gsrecon.distributed import DistributedContext


def resolve_device(name: str, dist: DistributedContext) -> torch.device:
    """``auto`` is CUDA when available; under torchrun ``cuda`` is this process's GPU; ``mps`` an Apple GPU where
    torch reports one."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"device '{name}' was asked for but CUDA is not available; use device=cpu")
        if name == "cuda" and (dist.world_size > 1 or dist.local_rank > 0):  # a block's run under torchrun: its GPU
            name = f"cuda:{dist.local_rank}"
    elif name == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError("device 'mps' was asked for but torch reports no Apple GPU (MPS) here; use device=cpu")
    elif name != "cpu":
        raise ConfigError(f"key 'device': must be auto, cpu, cuda, cuda:N or mps, got '{name}'")
    return torch.device(name)


def set_cpu_threads(requested: int) -> str:
    """Set torch's CPU threads: ``requested``, or for 0 the cores this process may use minus the 1-minute
    load average (at least 1), since threads competing with busy processes slow a CPU render many
    times over. Returns a line saying what was chosen and why."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if requested > 0:
        torch.set_num_threads(requested)
        above = f", more than the {cores} cores this process may use" if requested > cores else ""
        return f"{requested} CPU threads (num_threads: {requested}{above})"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    threads = max(1, min(cores, round(cores - load)))
    torch.set_num_threads(threads)
    return f"{threads} CPU threads (num_threads: 0, auto: {cores} cores, load average {load:.2f})"


def out_of_memory(step: int, num_gaussians: int) -> RuntimeError:
    """The error a run that ran out of memory at ``step`` with ``num_gaussians`` Gaussians ends with: what to lower."""
    return RuntimeError(
        f"out of memory at step {step} with {num_gaussians} Gaussians; lower data.factor, data.batch_size or the "
        f"strategy's cap_max"
    )
