"""Merging trained blocks into one scene: each block's Gaussians inside its own cell, written to ``exp_dir`` as a
run's outputs (``checkpoints/last.pt``, ``point_cloud.ply``, ``metrics.json``), so that ``gsrecon eval``,
``export``, ``render`` and ``view`` take the merged scene as they take any run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from gsrecon.atomic import write_json
from gsrecon.data.blocks import Partition, PartitionConfig, cell_box, image_coverage
from gsrecon.distributed import DistributedContext
from gsrecon.engine.checkpoints import load_checkpoint_file, save_checkpoint, scene_checkpoint
from gsrecon.engine.evaluator import build_metrics, evaluate_views
from gsrecon.engine.inference import TrainedScene, scene_renderer
from gsrecon.engine.run_dir import RunDir
from gsrecon.errors import InputError
from gsrecon.export import export_gaussians
from gsrecon.logging.console import Logger
from gsrecon.metrics import mean_metrics
from gsrecon.model import ops
from gsrecon.model.optim import SchedulerConfig

if TYPE_CHECKING:
    from gsrecon.data.pipeline import DataPipeline
    from gsrecon.data.scene import Frame
    from gsrecon.engine.builder import RunConfig

BLOCKS_DIR = "blocks"  # <exp_dir>/blocks/<i>/: one run per block
BLOCK_RESULT = "block.pt"  # in a block's folder: its trained Gaussians, written when the block has finished
MERGED_PLY = "merged.ply"  # in <exp_dir>/blocks/: the merged Gaussians a fine-tune starts from
FINETUNE_DIR = "finetune"  # in <exp_dir>/blocks/: the fine-tune's run (partition.merge_steps)
SEEN_CELL = 0.1  # a test view "sees" a block's cell when the cell fills this fraction of its image


def block_dir(exp_dir: str | Path, index: int) -> Path:
    """Where block ``index`` of the run in ``exp_dir`` trains."""
    return Path(exp_dir) / BLOCKS_DIR / str(index)


def save_block_result(exp_dir: str | Path, index: int, step: int, params: dict[str, Tensor]) -> None:
    """Record block ``index`` as finished at ``step`` with its Gaussians ``params`` (what the merge reads)."""
    folder = block_dir(exp_dir, index)
    save_checkpoint({"block": index, "step": step, "params": {k: v.detach().cpu() for k, v in params.items()}},
                    folder / BLOCK_RESULT)  # fmt: skip
    RunDir(folder).record_outputs([BLOCK_RESULT])


def finished_blocks(exp_dir: str | Path, count: int) -> list[int]:
    """The blocks of ``exp_dir`` (of ``count``) that have finished."""
    return [i for i in range(count) if (block_dir(exp_dir, i) / BLOCK_RESULT).is_file()]


@dataclass
class MergeResult:
    num_gaussians: int
    metrics: dict[str, float | None]  # the mean over every test view ({} without test views)
    kept: list[int]  # per block: its Gaussians inside its cell


def merge_blocks(
    cfg: RunConfig,
    resolved: dict[str, Any],
    partition: Partition,
    pipeline: DataPipeline,
    logger: Logger,
    local_rank: int = 0,
) -> MergeResult:
    """Merge the finished blocks of the run ``cfg`` (its resolved config ``resolved``, ``partition`` its plan,
    ``pipeline`` the whole capture) into one scene in ``cfg.exp_dir``, fine-tuned for ``partition.merge_steps``
    steps when asked, and score it on every test view.

    The merged checkpoint holds the Gaussians and the config (no optimiser state: it is a result, not a run to
    resume; the per-image modules of the blocks are left out, so test views are scored at their given poses with
    no appearance transform). Raises InputError naming the blocks that have not finished.
    """
    exp_dir = Path(cfg.exp_dir)
    count = len(partition.blocks)
    missing = sorted(set(range(count)) - set(finished_blocks(exp_dir, count)))
    if missing:
        raise InputError(
            f"{exp_dir}: block(s) {', '.join(map(str, missing))} of {count} have not finished (no "
            f"{BLOCKS_DIR}/<i>/{BLOCK_RESULT}); train them first (partition.only=<i>, with --resume to continue one)"
        )
    params: torch.nn.ParameterDict | None = None
    kept = []
    for block in partition.blocks:
        trained = load_checkpoint_file(block_dir(exp_dir, block.index) / BLOCK_RESULT)["params"]
        outside = partition.cell_index(trained["means"]) != block.index  # [N]
        kept.append(int((~outside).sum()))
        rows = {name: value[~outside].float() for name, value in trained.items()}
        if params is None:
            params = torch.nn.ParameterDict({k: torch.nn.Parameter(v, requires_grad=False) for k, v in rows.items()})
        else:
            ops.append_rows(params, {}, {}, (), rows)
        logger.info(f"block {block.index}: kept {kept[-1]} of its {len(outside)} Gaussians (those inside its cell)")
    merged = {name: value.detach() for name, value in params.items()}
    antialiased = bool(resolved["renderer"].get("antialiased", False))
    step = cfg.max_steps
    if cfg.partition.merge_steps:
        export_gaussians(merged, exp_dir / BLOCKS_DIR / MERGED_PLY, "ply", antialiased=antialiased)
        merged = _fine_tune(cfg, exp_dir / BLOCKS_DIR / MERGED_PLY, local_rank)
        step += cfg.partition.merge_steps
    save_checkpoint(
        scene_checkpoint(merged, step, resolved, pipeline.scene.extent), RunDir(exp_dir).checkpoints / "last.pt"
    )
    export_gaussians(merged, exp_dir / "point_cloud.ply", "ply", antialiased=antialiased)
    num_gaussians = len(merged["means"])
    logger.info(f"merged {count} blocks: {num_gaussians} Gaussians; wrote {exp_dir / 'point_cloud.ply'}")
    views = _score(cfg, merged, step, pipeline, partition, logger)
    mean = mean_metrics([{k: v for k, v in view.items() if k != "blocks"} for view in views]) if views else {}
    write_json(
        exp_dir / "metrics.json",
        {"step": step, "num_gaussians": num_gaussians, "mean": mean, "images": views, "kept_per_block": kept},
    )
    return MergeResult(num_gaussians, mean, kept)


def _score(
    cfg: RunConfig,
    params: dict[str, Tensor],
    step: int,
    pipeline: DataPipeline,
    partition: Partition,
    logger: Logger,
) -> list[dict[str, Any]]:
    """Every test view's metrics, each with ``blocks``: the blocks whose cells fill at least :data:`SEEN_CELL` of
    its image (two or more: the view looks across a border between blocks)."""
    if pipeline.num_val == 0:
        return []
    scene = TrainedScene(cfg, params, step, str(cfg.exp_dir))
    render = scene_renderer(scene, pipeline.device, logger)
    metrics = build_metrics(cfg.metrics.lpips_net, pipeline.device, logger)
    views = evaluate_views(render, pipeline.val_batches(), metrics)
    seen = {frame.name: _cells_seen(frame, partition) for frame in pipeline.scene.test}
    return [{**view, "blocks": seen[view["name"]]} for view in views]


def _cells_seen(frame: Frame, partition: Partition) -> list[int]:
    """The blocks whose cells (up to the capture's bounds, over the height of its points) fill at least
    :data:`SEEN_CELL` of ``frame``'s image; without points, the block whose cell holds the camera."""
    if partition.heights is None:
        return partition.cell_index(frame.camera_center[None]).tolist()
    lo, hi = partition.bounds
    return [
        block.index
        for block in partition.blocks
        if image_coverage(frame, partition.ground, cell_box(block.cell.bounded(lo, hi), partition.heights)) >= SEEN_CELL
    ]


def _fine_tune(cfg: RunConfig, merged_ply: Path, local_rank: int) -> dict[str, Tensor]:
    """The merged Gaussians trained on every camera for ``partition.merge_steps`` steps in ``blocks/finetune/``: no
    densification, each learning rate held at the value its schedule ends at."""
    from gsrecon.engine.trainer import DefaultTrainer

    final = cfg.scheduler.final_factor
    optimizer = dataclasses.replace(cfg.optimizer, **{k: getattr(cfg.optimizer, k) * f for k, f in final.items()})
    steps = cfg.partition.merge_steps
    finetune = dataclasses.replace(
        cfg,
        exp_dir=str(Path(cfg.exp_dir) / BLOCKS_DIR / FINETUNE_DIR),
        resume=False,
        max_steps=steps,
        val_interval=steps,
        model={**cfg.model, "init": "ply", "init_path": str(merged_ply)},
        strategy={"name": "none"},
        optimizer=optimizer,
        scheduler=SchedulerConfig(final_factor={}),
        partition=PartitionConfig(),
    )
    alone = DistributedContext(0, 1, local_rank)
    trainer = DefaultTrainer(finetune, f"{cfg.exp_dir} (merge fine-tune)", overwrite=True, logger=Logger(), dist=alone)
    trainer.train()
    if trainer.stop_reason:
        raise InputError(f"the merge's fine-tune stopped: {trainer.stop_reason}; run gsrecon merge again")
    return {name: value.detach() for name, value in trainer.model.params.items()}
