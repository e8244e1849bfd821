"""The top folder of a block-training run: the file that marks it (its plan), and the runs that may not start there.
Light to import: ``gsrecon train`` checks every run against it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gsrecon.config import ConfigError

if TYPE_CHECKING:
    from gsrecon.engine.resolve import RunConfig

PLAN_FILE = "partition.json"  # in exp_dir: the plan the blocks were trained on


def refuse_plain_resume(cfg: RunConfig, source: str) -> None:
    """Refuse to resume a run without ``partition.blocks`` in a folder that holds a block-training run: it would take
    the merged scene for a plain run's checkpoint and rewrite the folder's ``config.yaml`` as a plain run's."""
    folder = Path(cfg.exp_dir)
    if cfg.resume not in (False, None) and not cfg.partition.enabled and (folder / PLAN_FILE).is_file():
        raise ConfigError(
            f"{source}: exp_dir '{folder}' holds a block-training run ({PLAN_FILE}) but this config has no "
            f"partition.blocks; resume it with its own config: gsrecon train --config {folder / 'config.yaml'} "
            "--resume (or set another exp_dir)"
        )
