"""Merging trained blocks into one scene: each block's Gaussians inside its own cell, written to ``exp_dir`` as a
run's outputs (``checkpoints/last.pt``, ``point_cloud.ply``, ``metrics.json``), so that ``gsrecon eval``,
``export``, ``render`` and ``view`` take the merged scene as they take any run. A run with a sky (the
``environment`` module) keeps one: the blocks' cube maps merged texel by texel, each weighted by how much its
block's training views saw of that texel."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from gsrecon.atomic import atomic_paths
from gsrecon.cameras import Cameras
from gsrecon.cameras.model import CameraModel
from gsrecon.cameras.rays import camera_rays
from gsrecon.component import RunSetup
from gsrecon.data.blocks import Partition, cell_box, image_coverage
from gsrecon.distributed import DistributedContext
from gsrecon.engine.build import build_scene_renderer, build_view_modules
from gsrecon.engine.checkpoints import (
    load_checkpoint_file,
    non_finite,
    save_checkpoint,
    scene_checkpoint,
    write_checkpoint,
)
from gsrecon.engine.evaluator import build_metrics, evaluate_views
from gsrecon.engine.inference import TrainedScene, batch_renderer
from gsrecon.engine.resolve import resolve_views_config, structural_keys
from gsrecon.engine.run_dir import RunDir
from gsrecon.engine.signals import stop_at_step_boundary
from gsrecon.engine.tuning import place_start, tuning_config
from gsrecon.errors import InputError
from gsrecon.export import export_gaussians
from gsrecon.logging.console import Logger
from gsrecon.metrics import mean_metrics
from gsrecon.model import ops
from gsrecon.model.views.base import ViewModules
from gsrecon.model.views.environment import environment_module, merge_skies, set_sky, trained_sky
from gsrecon.partition.folder import PLAN_FILE
from gsrecon.render.environment import texel_coverage

if TYPE_CHECKING:
    from gsrecon.data.pipeline import DataPipeline
    from gsrecon.data.scene import Frame
    from gsrecon.engine.resolve import RunConfig

BLOCKS_DIR = "blocks"  # <exp_dir>/blocks/<i>/: one run per block
BLOCK_RESULT = "block.pt"  # in a block's folder: its trained Gaussians, written when the block has finished
MERGED_PLY = "merged.ply"  # in <exp_dir>/blocks/: the merged Gaussians a fine-tune starts from
FINETUNE_DIR = "finetune"  # in <exp_dir>/blocks/: the fine-tune's run (partition.merge_steps)
SEEN_CELL = 0.1  # a test view "sees" a block's cell when the cell fills this fraction of its image
SKY_SIDE = 64  # px, the longer side of the views whose rays weigh each block's sky (a texel spans several pixels)


def block_dir(exp_dir: str | Path, index: int) -> Path:
    """Where block ``index`` of the run in ``exp_dir`` trains."""
    return Path(exp_dir) / BLOCKS_DIR / str(index)


def plan_digest(partition: Partition) -> str:
    """A fingerprint of ``partition``'s plan (what ``partition.json`` holds): the blocks of one split share it."""
    return hashlib.sha256(json.dumps(partition.to_json(), sort_keys=True).encode()).hexdigest()


def save_block_result(
    exp_dir: str | Path,
    index: int,
    step: int,
    params: dict[str, Tensor],
    partition: Partition,
    model: dict[str, Any],
    sky: Tensor | None = None,
) -> None:
    """Record block ``index`` of ``partition`` as finished at ``step`` with its Gaussians ``params`` of the resolved
    ``model`` entry and its ``sky`` (the environment's cube-map colours [6, R, R, 3]; None: the run has none): what
    the merge reads and checks."""
    folder = block_dir(exp_dir, index)
    result = {
        "block": index,
        "step": step,
        "plan": plan_digest(partition),
        "model": model,
        "params": {k: v.detach().cpu() for k, v in params.items()},
        **({} if sky is None else {"sky": sky.detach().cpu()}),
    }
    save_checkpoint(result, folder / BLOCK_RESULT)
    RunDir(folder).record_outputs([BLOCK_RESULT])


def finished_blocks(exp_dir: str | Path, count: int) -> list[int]:
    """The blocks of ``exp_dir`` (of ``count``) that have finished."""
    return [i for i in range(count) if (block_dir(exp_dir, i) / BLOCK_RESULT).is_file()]


@dataclass
class MergeResult:
    """What a merge wrote; ``stop_reason`` (and the signal) when a signal stopped it first (nothing written)."""

    num_gaussians: int
    metrics: dict[str, float | None]  # the mean over every test view ({} without test views)
    kept: list[int]  # per block: its Gaussians inside its cell
    stop_reason: str | None = None
    stop_signal: int | None = None


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
    no appearance transform; the sky is kept, :func:`_merged_sky`). Every block is checked before anything is
    written (:func:`_block_gaussians`); raises InputError naming the blocks that have not finished or the first
    block that is not this run's. SIGINT or
    SIGTERM stop it with nothing written but the fine-tune's checkpoints, which the next merge resumes from.
    """
    exp_dir = Path(cfg.exp_dir)
    count = len(partition.blocks)
    missing = sorted(set(range(count)) - set(finished_blocks(exp_dir, count)))
    if missing:
        raise InputError(
            f"{exp_dir}: block(s) {', '.join(map(str, missing))} of {count} have not finished (no "
            f"{BLOCKS_DIR}/<i>/{BLOCK_RESULT}); train them first (partition.only=<i>, with --resume to continue one)"
        )
    loaded = [_block_gaussians(exp_dir, block.index, partition, resolved["model"]) for block in partition.blocks]
    pieces = [params for params, _ in loaded]
    sky = _merged_sky(cfg, partition, pipeline, [block_sky for _, block_sky in loaded], logger)
    params = torch.nn.ParameterDict({k: torch.nn.Parameter(v, requires_grad=False) for k, v in pieces[0].items()})
    for piece in pieces[1:]:
        ops.append_rows(params, {}, {}, (), piece)
    merged = {name: value.detach() for name, value in params.items()}
    kept = [len(piece["means"]) for piece in pieces]
    for block, inside in zip(partition.blocks, kept, strict=True):
        logger.info(f"block {block.index}: kept the {inside} Gaussians inside its cell")
    antialiased = bool(resolved["renderer"].get("antialiased", False))
    step = cfg.max_steps
    stopped: list[int] = []
    with stop_at_step_boundary(stopped.append, logger, "stopping the merge before it writes its outputs"):
        if cfg.partition.merge_steps:
            tuned = _fine_tune(cfg, merged, sky, antialiased, local_rank, stopped)
            if isinstance(tuned, MergeResult):
                return tuned
            merged, step = tuned, step + cfg.partition.merge_steps
        views = _score(cfg, merged, sky, step, pipeline, partition, logger, lambda: bool(stopped))
        if stopped:
            return _stopped_result("stopped while scoring the merged scene; nothing was written", stopped[0])
        mean = mean_metrics([{k: v for k, v in view.items() if k != "blocks"} for view in views]) if views else {}
        num_gaussians = len(merged["means"])
        scores = {"step": step, "num_gaussians": num_gaussians, "mean": mean, "images": views, "kept_per_block": kept}
        outputs = [RunDir(exp_dir).checkpoints / "last.pt", exp_dir / "point_cloud.ply", exp_dir / "metrics.json"]
        with atomic_paths(*outputs) as (checkpoint, ply, metrics):
            result = scene_checkpoint(merged, step, resolved, pipeline.scene.extent)
            result["views"] = {} if sky is None else sky.state_dict()
            write_checkpoint(result, checkpoint, outputs[0])
            export_gaussians(merged, ply, "ply", antialiased=antialiased)
            metrics.write_text(json.dumps(scores, indent=2) + "\n")
    logger.info(f"merged {count} blocks: {num_gaussians} Gaussians; wrote {exp_dir / 'point_cloud.ply'}")
    return MergeResult(num_gaussians, mean, kept)


def _stopped_result(reason: str, signum: int | None) -> MergeResult:
    """The result of a merge that a signal (or a hook) stopped before it wrote anything."""
    return MergeResult(0, {}, [], stop_reason=reason, stop_signal=signum)


def _block_gaussians(
    exp_dir: Path, index: int, partition: Partition, model: dict[str, Any]
) -> tuple[dict[str, Tensor], Tensor | None]:
    """Block ``index``'s Gaussians inside its cell, and its sky (cube-map colours [6, R, R, 3]; None: it kept
    none). Raises InputError naming its ``block.pt`` where they are not
    this run's: another block's, of another split of the capture or another ``model`` (a key that decides the
    parameters' shapes), not finite, or none inside its cell."""
    path = block_dir(exp_dir, index) / BLOCK_RESULT
    result = load_checkpoint_file(path)
    again = f"train it again: gsrecon train --config {exp_dir / 'config.yaml'} partition.only={index} --overwrite"
    if result.get("block") != index:
        raise InputError(
            f"{path} holds block {result.get('block')}'s Gaussians, not block {index}'s (block folders swapped or "
            f"copied from elsewhere?); put it back, or {again}"
        )
    if result.get("plan") != plan_digest(partition):
        unrecorded = "" if result.get("plan") else " (or by a gsrecon that did not record its split)"
        raise InputError(
            f"{path}: block {index} was trained on another split of the capture than {exp_dir / PLAN_FILE}"
            f"{unrecorded}; {again}"
        )
    trained_model = result.get("model", {})
    for key in structural_keys(model):
        if trained_model.get(key) != model.get(key):
            raise InputError(
                f"{path}: block {index} was trained with model.{key}={trained_model.get(key)} but this run has "
                f"{model.get(key)}; {again}"
            )
    params = result["params"]
    broken = non_finite(params)
    if broken:
        raise InputError(
            f"{path}: block {index}'s Gaussian parameters {', '.join(broken)} are not finite (the block diverged); "
            f"{again}"
        )
    inside = partition.cell_index(params["means"]) == index  # [N]
    if not bool(inside.any()):
        raise InputError(f"{path}: none of block {index}'s {len(inside)} Gaussians lie inside its cell; {again}")
    return {name: value[inside].float() for name, value in params.items()}, result.get("sky")


def _merged_sky(
    cfg: RunConfig, partition: Partition, pipeline: DataPipeline, skies: list[Tensor | None], logger: Logger
) -> ViewModules | None:
    """The run's ``environment`` module holding the blocks' ``skies`` merged (:func:`merge_skies`: each texel
    weighted by how much the block's training views read it), set up for the whole capture (its horizon); None
    where the run has no sky. Raises InputError naming the blocks that kept no sky, or one of another resolution."""
    exp_dir = Path(cfg.exp_dir)
    views = build_view_modules(
        resolve_views_config(cfg, str(exp_dir)), pipeline.scene, torch.device("cpu"), str(exp_dir)
    )
    found = environment_module(views)
    if found is None:
        return None
    key, module = found
    shape = trained_sky(views).shape
    for block, sky in zip(partition.blocks, skies, strict=True):
        if sky is None or sky.shape != shape:
            kept = "kept no sky (an older gsrecon's)" if sky is None else f"has a sky of shape {tuple(sky.shape)}"
            raise InputError(
                f"{block_dir(exp_dir, block.index) / BLOCK_RESULT}: block {block.index} {kept}, but this run's "
                f"views.{key} is a cube map of shape {tuple(shape)}; train it again: gsrecon train --config "
                f"{exp_dir / 'config.yaml'} partition.only={block.index} --overwrite"
            )
    frames = {frame.name: frame for frame in pipeline.scene.train}
    coverages = [_sky_coverage([frames[name] for name in block.train], shape[1]) for block in partition.blocks]
    set_sky(module, merge_skies([sky.float() for sky in skies], coverages))
    module.setup(RunSetup(logger.info, pipeline))
    return ViewModules({key: module})


def _sky_coverage(frames: list[Frame], res: int) -> Tensor:
    """[6, R, R] how much the rays of ``frames`` (each at :data:`SKY_SIDE` px on its longer side) read each texel
    of an ``R`` x ``R`` cube map."""
    coverage = torch.zeros(6, res, res)
    for frame in frames:
        scale = SKY_SIDE / max(frame.width, frame.height)
        K = frame.K.clone()
        K[:2] *= scale
        size = (max(1, round(frame.width * scale)), max(1, round(frame.height * scale)))
        cameras = Cameras(frame.viewmat[None], K[None], *size, CameraModel.stack([frame.camera_model]))
        coverage += texel_coverage(res, camera_rays(cameras))
    return coverage


def _score(
    cfg: RunConfig,
    params: dict[str, Tensor],
    sky: ViewModules | None,
    step: int,
    pipeline: DataPipeline,
    partition: Partition,
    logger: Logger,
    stopped: Callable[[], bool],
) -> list[dict[str, Any]]:
    """Every test view's metrics, each with ``blocks``: the blocks whose cells fill at least :data:`SEEN_CELL` of
    its image (two or more: the view looks across a border between blocks), rendered in front of the ``sky`` where
    there is one. Once ``stopped()`` is true no further
    view is scored."""
    if pipeline.num_val == 0:
        return []
    scene = TrainedScene(cfg, params, step, str(cfg.exp_dir))
    renderer = build_scene_renderer(cfg, pipeline.device, logger)
    render = batch_renderer(scene, renderer, pipeline.device, sky)
    metrics = build_metrics(cfg.metrics, pipeline.device, logger, renderer.compiled)
    views = evaluate_views(render, itertools.takewhile(lambda _: not stopped(), pipeline.val_batches()), metrics)
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


def _fine_tune(
    cfg: RunConfig,
    merged: dict[str, Tensor],
    sky: ViewModules | None,
    antialiased: bool,
    local_rank: int,
    stopped: list[int],
) -> dict[str, Tensor] | MergeResult:
    """The ``merged`` Gaussians trained on every camera for ``partition.merge_steps`` steps in ``blocks/finetune/``:
    no densification, each learning rate held at the value its schedule ends at; the ``sky`` module (the blocks'
    merged) starts the fine-tune's and takes its trained cube map. A fine-tune of the same merged
    Gaussians that stopped (SIGTERM) resumes from its checkpoint; one that stops, or whose start a signal in
    ``stopped`` already stopped, returns the stopped MergeResult."""
    from gsrecon.engine.trainer import DefaultTrainer

    merged_ply = Path(cfg.exp_dir) / BLOCKS_DIR / MERGED_PLY
    folder = Path(cfg.exp_dir) / BLOCKS_DIR / FINETUNE_DIR
    resume = place_start(merged, merged_ply, folder, antialiased)
    finetune = tuning_config(cfg, merged_ply, folder, cfg.partition.merge_steps, resume)
    alone = DistributedContext(0, 1, local_rank)
    source = f"{cfg.exp_dir} (merge fine-tune)"
    trainer = DefaultTrainer(finetune, source, overwrite=not resume, logger=Logger(), dist=alone)
    if stopped:  # while the trainer was being built
        trainer.request_stop(stopped[0])
    if sky is not None:  # a resumed fine-tune restores its own when it starts
        set_sky(environment_module(trainer.views)[1], trained_sky(sky))
    trainer.train()
    if trainer.stop_reason:
        return _stopped_result(f"the merge's fine-tune stopped: {trainer.stop_reason}", trainer.stop_signal)
    if sky is not None:
        set_sky(environment_module(sky)[1], trained_sky(trainer.views).cpu())
    return {name: value.detach() for name, value in trainer.model.params.items()}
