"""``gsrecon eval``: a trained scene's test split rendered and scored, written with the cameras it was seen from."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gsrecon.atomic import write_json
from gsrecon.data.formats.images import write_png
from gsrecon.data.pipeline import Batch
from gsrecon.data.scene import Frame
from gsrecon.engine.evaluator import build_metrics, evaluate_views
from gsrecon.engine.inference import TrainedScene, batch_renderer, scene_run, training_cameras
from gsrecon.errors import InputError
from gsrecon.logging.console import Logger
from gsrecon.metrics import describe_metrics, mean_metrics
from gsrecon.render.base import RenderOutput


def evaluate(
    scene: TrainedScene, out_dir: str | Path, device: str = "auto", logger: Logger | None = None, fps_repeats: int = 3
) -> dict[str, Any]:
    """Render the test split; write ``renders/test/<name>.png``, ``gt/<name>.png``, ``metrics.json`` and
    ``cameras.json``.

    Test views are scored as validation scores them, by the test-view policies of the scene's per-view modules
    (:func:`scene_run`): ``views.pose_opt.eval: fit`` renders each from a pose fitted to its photo first,
    ``views.appearance.eval: fit_left`` fits a colour transform on its left half and scores (and writes) the right
    half.

    ``metrics.json`` holds PSNR, SSIM and LPIPS per image and their means (and the depth errors ``depth_abs_rel``
    and ``depth_rmse`` of the views with a depth map, their means over those views), the LPIPS network and
    version, the resolution, the number of Gaussians and the rendering speed (frames per second,
    the median over ``fps_repeats`` renders of the whole split; the metrics pass before them warms up).
    ``cameras.json`` lists the rendered test views (``split: test``), so that another tool can render the same
    ones, then the training cameras (``split: train``) where the trained scene places them (moved by pose
    refinement, ``pose_opt``; ``given_world_to_camera`` is then the capture's pose): ``name``, ``world_to_camera``
    (4×4, OpenCV axes: x right, y down, z forward), ``K`` (3×3, pixels), ``width`` and ``height``, and for a view
    seen through a fisheye lens (``data.fisheye: lens``) its OpenCV fisheye coefficients ``fisheye_k1_k4``.
    """
    logger = logger or Logger()
    out_dir = Path(out_dir)
    run = scene_run(scene, device, logger)
    pipeline, torch_device, view_modules = run.datapipeline, run.device, run.views
    if pipeline.num_val == 0:
        raise InputError(
            f"{scene.source}: the dataset has no test views (data.eval_split is "
            f"'{scene.cfg.data.eval_split}'); set data.eval_split=every_8"
        )
    render = batch_renderer(scene, run.renderer, torch_device, view_modules)
    metrics = build_metrics(scene.cfg.metrics, torch_device, logger, run.renderer.compiled)
    batches = list(pipeline.val_batches())

    def write_view(index: int, outputs: dict[str, Any]) -> None:
        write_png(out_dir / "renders" / "test" / f"{outputs['name']}.png", outputs["render"])
        write_png(out_dir / "gt" / f"{outputs['name']}.png", outputs["gt"])

    images = evaluate_views(
        render,
        batches,
        metrics,
        after_view=write_view,
        adjust=view_modules.eval_adjust(),
        fit_cameras=view_modules.eval_cameras,
    )
    test_cameras = [_camera_entry("test", frame) for frame in pipeline.scene.test]
    placed = training_cameras(run)  # [F, 4, 4]
    train_cameras = [_camera_entry("train", frame, viewmat) for frame, viewmat in zip(pipeline.scene.train, placed)]
    write_json(out_dir / "cameras.json", test_cameras + train_cameras)
    with torch.no_grad():
        fps = _measure_fps(render, batches, torch_device, fps_repeats)
    mean = mean_metrics(images)
    result = {
        "source": scene.source,
        "step": scene.step,
        "num_gaussians": int(scene.params["means"].shape[0]),
        "resolution": sorted({f"{b.cameras.width}x{b.cameras.height}" for b in batches}),
        "mean": mean,
        "images": images,
        "lpips": metrics.lpips_info,
        "render_fps": fps,
        "device": str(torch_device),
    }
    write_json(out_dir / "metrics.json", result)
    return result


def default_eval_dir(exp_dir: str | None, checkpoint: str | None) -> str:
    """Where ``gsrecon eval`` writes unless told: ``<exp_dir>/eval`` for a run (also when given one of its
    checkpoints), else ``./eval``."""
    if exp_dir:
        return str(Path(exp_dir) / "eval")
    if checkpoint:
        return str(Path(checkpoint).resolve().parent.parent / "eval")
    return "eval"


def evaluation_report(result: dict[str, Any], out: str | Path) -> list[str]:
    """What ``gsrecon eval`` says of an :func:`evaluate` ``result`` written to ``out``."""
    scores = f"{describe_metrics(result['mean'])}; {result['render_fps']:.3g} FPS on {result['device']}"
    return [
        f"{len(result['images'])} test views: {scores}",
        f"wrote {out}/metrics.json, {out}/cameras.json, {out}/renders/test/, {out}/gt/",
    ]


def _camera_entry(split: str, frame: Frame, viewmat: Tensor | None = None) -> dict[str, Any]:
    """``frame``'s ``cameras.json`` entry, seen from ``viewmat`` [4, 4] (None: its given pose; where pose refinement
    moved it, the given one follows as ``given_world_to_camera``)."""
    given = frame.viewmat.float().cpu()
    viewmat = given if viewmat is None else viewmat
    lens = frame.camera_model
    return (
        {"name": frame.name, "split": split, "world_to_camera": viewmat.tolist()}
        | ({"given_world_to_camera": given.tolist()} if not torch.equal(viewmat.cpu(), given) else {})
        | {"K": frame.K.tolist(), "width": frame.width, "height": frame.height}
        | ({"fisheye_k1_k4": lens.coeffs.tolist()} if lens.kind == "fisheye" else {})
    )


def _measure_fps(
    render: Callable[[Batch], RenderOutput], batches: list[Batch], device: torch.device, repeats: int
) -> float:
    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    times = []
    for _ in range(max(1, repeats)):
        synchronize()
        start = time.perf_counter()
        for batch in batches:
            render(batch)
        synchronize()
        times.append(time.perf_counter() - start)
    return float(len(batches) / np.median(times))
