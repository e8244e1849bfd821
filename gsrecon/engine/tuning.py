"""A run that trains given Gaussians further: the merge of a block run fine-tuning its merged scene, a level of
detail trained after its merge."""

from __future__ import annotations

import dataclasses
import filecmp
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from gsrecon.atomic import atomic_path
from gsrecon.data.blocks import PartitionConfig
from gsrecon.engine.resolve import RunConfig
from gsrecon.engine.run_dir import RunDir
from gsrecon.model.optim import SchedulerConfig
from gsrecon.model.ply import save_ply


def place_start(params: Mapping[str, Tensor], ply: Path, folder: Path, antialiased: bool) -> bool:
    """Write the Gaussians a tuning run in ``folder`` starts from to ``ply`` (atomically); return whether that run
    may resume: it has a checkpoint and started from these same Gaussians (what a stopped run was tuning)."""
    with atomic_path(ply) as new:
        save_ply(new, params, antialiased=antialiased)
        same = ply.is_file() and filecmp.cmp(new, ply, shallow=False)
    return same and RunDir(folder).latest_checkpoint() is not None


def tuning_config(cfg: RunConfig, init_ply: Path, folder: Path, steps: int, resume: bool, **changes: Any) -> RunConfig:
    """``cfg`` made a run in ``folder`` that trains the Gaussians of ``init_ply`` for ``steps`` steps (validated after
    the last): no densification, each learning rate held at the value its schedule ends at, no block training,
    resuming from the folder's newest checkpoint with ``resume``; ``changes``: further RunConfig fields to replace."""
    final = cfg.scheduler.final_factor
    optimizer = dataclasses.replace(cfg.optimizer, **{k: getattr(cfg.optimizer, k) * f for k, f in final.items()})
    return dataclasses.replace(
        cfg,
        exp_dir=str(folder),
        resume=resume,
        max_steps=steps,
        val_interval=steps,
        model={**cfg.model, "init": "ply", "init_path": str(init_ply)},
        strategy={"name": "none"},
        optimizer=optimizer,
        scheduler=SchedulerConfig(final_factor={}),
        partition=PartitionConfig(),
        **changes,
    )
