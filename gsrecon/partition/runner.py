"""Training the blocks of a partition: one after another in this process, shared by the ranks torchrun started, or
one block per call (``partition.only``) for a cluster's job array; then the merge.

Each block is a normal run in ``<exp_dir>/blocks/<i>/`` (its config says ``partition.block: i``), with its own
checkpoints, TensorBoard and exact resume; a block that has finished (``block.pt``) is not trained again. The top
folder holds ``config.yaml`` (the run as given), ``partition.json`` (the plan: cells, cameras and points per block),
``train.log`` and, once merged, the merged scene (see :mod:`gsrecon.partition.merge`).
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist
from rich.console import Console

from gsrecon.atomic import write_json
from gsrecon.config import ConfigError, load_config, save_yaml, to_container
from gsrecon.data.blocks import Partition, plan_partition
from gsrecon.data.pipeline import read_scene
from gsrecon.distributed import DistributedContext
from gsrecon.engine import build, resolve
from gsrecon.engine.checkpoints import changed_settings
from gsrecon.engine.run_dir import RUN_MARKER, RunDir, resume_command
from gsrecon.engine.trainer import DefaultTrainer
from gsrecon.errors import InputError
from gsrecon.logging.console import Logger
from gsrecon.metrics import describe_metrics
from gsrecon.model.views.environment import trained_sky
from gsrecon.partition.folder import PLAN_FILE, read_plan, refuse_plain_resume
from gsrecon.partition.merge import (
    BLOCK_RESULT,
    BLOCKS_DIR,
    MergeResult,
    block_dir,
    finished_blocks,
    merge_blocks,
    save_block_result,
)
from gsrecon.plugins import import_plugins

# Settings the blocks of one run may each choose for their machine (exp_dir: the folder, mounted or moved elsewhere)
_PER_MACHINE = ("device", "num_threads", "exp_dir")
_BLOCK_WAIT = timedelta(days=30)  # ranks wait at the end for the others' blocks, however long those train


@dataclass
class BlocksOutcome:
    """What :func:`train_blocks` did: the blocks this process trained and found finished, why it stopped early
    (None: it did not), and the merge (None where this process does not merge)."""

    trained: list[int]
    finished_before: list[int]
    stop_reason: str | None = None
    stop_signal: int | None = None
    merged: MergeResult | None = None

    def report(self, cfg: resolve.RunConfig) -> list[str]:
        """What the command line says when ``cfg``'s blocks stopped: why it stopped early and how to continue, or
        the blocks trained, the merge and where the outputs are."""
        if self.stop_reason:
            only = "" if cfg.partition.only is None else f" partition.only={cfg.partition.only}"
            return [f"{self.stop_reason}; {resume_command(cfg.exp_dir, only)}"]
        done = f"blocks trained: {', '.join(map(str, self.trained)) or 'none'}"
        if self.finished_before:
            done += f" (finished before: {', '.join(map(str, self.finished_before))})"
        if self.merged is None:
            return [done]
        return [done, describe_merge(self.merged), f"outputs: {cfg.exp_dir}"]


def describe_merge(merged: MergeResult) -> str:
    """``merged: 12345 Gaussians: psnr ...`` of a merge."""
    metrics = describe_metrics(merged.metrics)
    return f"merged: {merged.num_gaussians} Gaussians{': ' + metrics if metrics else ''}"


def merge_report(merged: MergeResult, exp_dir: str | Path) -> list[str]:
    """What ``gsrecon merge`` says: why the merge stopped early and how to continue, or what it wrote where."""
    if merged.stop_reason:
        return [f"{merged.stop_reason}; continue with: gsrecon merge --exp-dir {exp_dir}"]
    return [describe_merge(merged), f"outputs: {exp_dir} (checkpoints/last.pt, point_cloud.ply, metrics.json)"]


def train_config(
    cfg: resolve.RunConfig, source: str, overwrite: bool = False
) -> tuple[list[str], str | None, int | None]:
    """``gsrecon train`` of ``cfg``: its blocks (``partition.blocks`` without ``partition.block``:
    :func:`train_blocks`) or one run. Returns what the command line says, why training stopped early (None: it did
    not) and the signal that stopped it."""
    if cfg.partition.enabled and cfg.partition.block is None:
        outcome = train_blocks(cfg, source, overwrite)
        return outcome.report(cfg), outcome.stop_reason, outcome.stop_signal
    refuse_plain_resume(cfg, source)
    trainer = DefaultTrainer(cfg, source=source, overwrite=overwrite)
    trainer.train()
    return trainer.report(), trainer.stop_reason, trainer.stop_signal


def train_blocks(cfg: resolve.RunConfig, source: str, overwrite: bool = False) -> BlocksOutcome:
    """Train the blocks of ``cfg.partition`` this process has (all, its torchrun rank's share, or
    ``partition.only``) and, unless ``only`` is set, merge them into ``cfg.exp_dir`` (rank 0, after every rank has
    trained its share). Bad input (a partition that leaves a block with nothing to train, ranks whose configs
    differ, a plan that differs from the one the folder's blocks were trained on) raises InputError before any
    training; nothing a finished block wrote is lost."""
    import_plugins(cfg.imports, source)
    dist = DistributedContext.from_env()
    only = cfg.partition.only
    logger = Logger(console=None if dist.rank == 0 else Console(quiet=True))
    resume = bool(cfg.resume)
    run_dir = RunDir(cfg.exp_dir, source)
    device, resolved = build.resolve_run(cfg, source, dist)
    group = _wait_group(dist)
    partition, error = None, None
    try:
        partition = plan_partition(read_scene(dataclasses.replace(cfg.data, cache="disk")), cfg.partition)
    except (InputError, OSError) as exc:
        error = exc
    _agree(dist, group, resolved, error)  # every rank has this config and its plan before anything is written
    try:
        if dist.rank == 0:
            _take_folder(run_dir, resolved, partition, overwrite, resume, only is not None, logger)
    except (InputError, OSError) as exc:
        error = exc
    _agree(dist, group, resolved, error)
    try:
        outcome = _train_own_blocks(cfg, source, overwrite, partition, dist, logger)
        if outcome.stop_reason or only is not None:
            return outcome
        if group is not None:
            torch_dist.barrier(group)
        if dist.rank == 0:
            pipeline = build.build_datapipeline(dataclasses.replace(cfg.data, cache="disk"), device, cfg.seed, source)
            outcome.merged = merge_blocks(cfg, resolved, partition, pipeline, logger, dist.local_rank)
            outcome.stop_reason, outcome.stop_signal = outcome.merged.stop_reason, outcome.merged.stop_signal
        return outcome
    finally:
        logger.close()
        run_dir.release()


def _train_own_blocks(
    cfg: resolve.RunConfig,
    source: str,
    overwrite: bool,
    partition: Partition,
    dist: DistributedContext,
    logger: Logger,
) -> BlocksOutcome:
    """Train the blocks this process has (``partition.only``, or its rank's share) that have not finished."""
    only, count = cfg.partition.only, len(partition.blocks)
    mine = [only] if only is not None else list(range(dist.rank, count, dist.world_size))
    outcome = BlocksOutcome([], [])
    for index in mine:
        if (block_dir(cfg.exp_dir, index) / BLOCK_RESULT).is_file() and not (overwrite and only is not None):
            outcome.finished_before.append(index)
            logger.info(f"block {index}: finished earlier, not trained again")
            continue
        trainer = _block_trainer(cfg, source, index, overwrite and only is not None, dist, logger)
        trainer.train()
        if trainer.stop_reason:
            outcome.stop_reason, outcome.stop_signal = f"block {index}: {trainer.stop_reason}", trainer.stop_signal
            return outcome
        model = trainer.resolved_config["model"]
        sky = trained_sky(trainer.views)
        save_block_result(cfg.exp_dir, index, trainer.step, trainer.model.params, partition, model, sky)
        outcome.trained.append(index)
        del trainer  # its Gaussians and images, before the next block's
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if only is not None:
        logger.info(
            f"block {only} done; when every block is, merge them: gsrecon merge --exp-dir {cfg.exp_dir} "
            f"({len(finished_blocks(cfg.exp_dir, count))} of {count} finished)"
        )
    return outcome


def merge_run(exp_dir: str | Path, device: str = "auto", overrides: Sequence[str] = ()) -> MergeResult:
    """``gsrecon merge --exp-dir``: merge the finished blocks of the block-training run in ``exp_dir`` (trained
    with ``partition.only``, e.g. as a job array) into one scene there; ``overrides`` (``key=value``) change its
    ``config.yaml`` for the merge (e.g. ``partition.merge_steps=500``)."""
    exp_dir = Path(exp_dir)
    config = exp_dir / "config.yaml"
    if not (exp_dir / PLAN_FILE).is_file() or not config.is_file():
        raise InputError(f"{exp_dir} is not a block-training run (no {PLAN_FILE} and config.yaml)")
    machine = [f"exp_dir={exp_dir}", *([f"device={device}"] if device != "auto" else [])]
    cfg, source = resolve.load_run_config(str(config), [*machine, *overrides])
    import_plugins(cfg.imports, source)
    torch_device, resolved = build.resolve_run(cfg, source)
    pipeline = build.build_datapipeline(dataclasses.replace(cfg.data, cache="disk"), torch_device, cfg.seed, source)
    partition = plan_partition(pipeline.scene, cfg.partition)
    _check_plan(exp_dir / PLAN_FILE, partition)
    run_dir = RunDir(exp_dir, source)
    run_dir.prepare(overwrite=False, resume=True)  # the lock: one merge (or training) at a time
    logger = Logger(log_file=exp_dir / "train.log")
    try:
        return merge_blocks(cfg, resolved, partition, pipeline, logger)
    finally:
        logger.close()
        run_dir.release()


def _take_folder(
    run_dir: RunDir,
    resolved: dict[str, Any],
    partition: Partition,
    overwrite: bool,
    resume: bool,
    shared: bool,
    logger: Logger,
) -> None:
    """Make ``run_dir`` the partition's folder: its config, plan and log. ``shared`` (``partition.only``): other
    processes train other blocks there at the same time, so the folder is not locked and a config or plan already
    there must be this one."""
    folder = run_dir.path
    plan = partition.to_json()
    config = {**resolved, "partition": {**resolved["partition"], "only": None}}
    if shared:
        if (folder / PLAN_FILE).is_file():
            _check_plan(folder / PLAN_FILE, partition)
        if (folder / "config.yaml").is_file():
            _check_same_run(folder / "config.yaml", config)
        elif folder.is_dir() and any(folder.iterdir()) and not (folder / RUN_MARKER).is_file():
            run_dir.check(overwrite=False, resume=False)  # refuses a folder that is not a gsrecon run's
        folder.mkdir(parents=True, exist_ok=True)
    else:
        run_dir.check(overwrite, resume)
        if resume and (folder / PLAN_FILE).is_file():
            _check_plan(folder / PLAN_FILE, partition)
        run_dir.open_log(overwrite, resume, logger)
    run_dir.record_outputs(["config.yaml", "train.log", PLAN_FILE, BLOCKS_DIR, "metrics.json", "point_cloud.ply"])
    save_yaml(config, folder / "config.yaml")
    write_json(folder / PLAN_FILE, plan)
    logger.info(
        f"partition: {len(partition.blocks)} blocks on a {partition.grid[0]}×{partition.grid[1]} grid of the ground "
        f"plane, balanced by {partition.balance}; plan in {folder / PLAN_FILE}"
    )
    for block in partition.blocks:
        logger.info(block.describe())


def _check_plan(path: Path, partition: Partition) -> None:
    """Refuse a plan that differs from the one in ``path`` (the blocks there were trained on that one), and a
    ``path`` that does not hold one."""
    if read_plan(path.parent) != json.loads(json.dumps(partition.to_json())):
        raise ConfigError(
            f"{path}: this config splits the capture differently from the blocks already in {path.parent} (another "
            "partition, capture or data setting); use the config in that folder, or another exp_dir"
        )


def _check_same_run(path: Path, config: dict[str, Any]) -> None:
    """Refuse a block whose run differs from the one the other blocks in ``path``'s folder were trained with (apart
    from where and how fast: ``device``, ``num_threads``, and the folder's path)."""
    written = load_config(path)
    as_written = json.loads(json.dumps(to_container(config)))  # tuples as the YAML file has them: lists
    changes = [c for c in changed_settings(written, as_written) if c.split(":")[0] not in _PER_MACHINE]
    if changes:
        raise ConfigError(
            f"{path}: the blocks there were trained with another config ({', '.join(changes[:4])}); give every block "
            "the same config, or use another exp_dir"
        )


def _block_trainer(
    cfg: resolve.RunConfig, source: str, index: int, overwrite: bool, dist: DistributedContext, logger: Logger
) -> DefaultTrainer:
    """The trainer of block ``index``: the run's config for ``blocks/<index>/``, resuming where it has a
    checkpoint and ``cfg.resume`` asks, alone in its process (on this rank's device)."""
    folder = block_dir(cfg.exp_dir, index)
    resume = bool(cfg.resume) and RunDir(folder).latest_checkpoint() is not None
    block_cfg = dataclasses.replace(
        cfg,
        exp_dir=str(folder),
        resume=resume,
        partition=dataclasses.replace(cfg.partition, block=index, only=None),
    )
    logger.info(f"block {index}: {'resuming' if resume else 'training'} in {folder}")
    quiet = None if dist.rank == 0 else Console(quiet=True)
    return DefaultTrainer(
        block_cfg,
        f"{source}, block {index}",
        overwrite,
        Logger(console=quiet),
        DistributedContext(0, 1, dist.local_rank),
    )


def _wait_group(dist: DistributedContext) -> Any:
    """A gloo group of every rank that waits as long as blocks train (the default group times out in minutes);
    None with one process."""
    if not dist.enabled:
        return None
    return torch_dist.new_group(backend="gloo", timeout=_BLOCK_WAIT)


def _agree(dist: DistributedContext, group: Any, resolved: dict[str, Any], error: Exception | None) -> None:
    """Raise ``error`` (this rank's or another's) on every rank, or InputError where the ranks' configs differ; a
    rank that raises leaves the process group first (every rank does, so none waits on another that is gone)."""
    if group is None:
        if error is not None:
            raise error
        return
    digest = hashlib.sha256(json.dumps(to_container(resolved), sort_keys=True, default=str).encode()).hexdigest()
    gathered: list[Any] = [None] * dist.world_size
    torch_dist.all_gather_object(gathered, (digest, None if error is None else str(error)), group=group)
    failed = [(rank, message) for rank, (_, message) in enumerate(gathered) if message is not None]
    differing = [rank for rank, (d, _) in enumerate(gathered) if d != gathered[0][0]]
    if failed or differing:
        torch_dist.barrier(group)  # every rank has read every rank's answer before any leaves
        torch_dist.destroy_process_group()
    if error is not None:
        raise error
    if failed:
        raise InputError(f"rank {failed[0][0]}: {failed[0][1]}")
    if differing:
        raise InputError(
            f"partition: torchrun ranks {', '.join(map(str, differing))} have another config than rank 0 (a "
            "different file or overrides); start every rank with the same config"
        )
