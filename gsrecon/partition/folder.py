"""The top folder of a block-training run: the file that marks it (its plan), and the runs that may not start there.
Light to import: ``gsrecon train`` checks every run against it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gsrecon.config import ConfigError
from gsrecon.records import ListOf, read_record

if TYPE_CHECKING:
    from gsrecon.engine.resolve import RunConfig

PLAN_FILE = "partition.json"  # in exp_dir: the plan the blocks were trained on
_SIDES = ListOf(ListOf((float, None), 2), 2)  # a cell: [[u_lo, u_hi], [v_lo, v_hi]], null for an infinite side
_PLAN_SCHEMA = {
    "ground": {"origin": ListOf(float, 3), "up": ListOf(float, 3), "axes": ListOf(ListOf(float, 3), 2)},
    "blocks": ListOf({"index": int, "cell": _SIDES, "grown_cell": _SIDES}),
}


def read_plan(exp_dir: str | Path) -> dict[str, Any]:
    """The plan in ``exp_dir``'s ``partition.json`` (:meth:`~gsrecon.data.blocks.Partition.to_json`); raises
    RecordError naming the file and the key where it does not read back as gsrecon writes it."""
    folder = Path(exp_dir)
    fix = (
        f"remove it, and gsrecon train --config {folder / 'config.yaml'} partition.only=0 --resume writes it again "
        "from the config (the merge checks each block against it)"
    )
    return read_record(folder / PLAN_FILE, _PLAN_SCHEMA, fix)


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
