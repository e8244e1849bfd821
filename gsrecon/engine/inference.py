"""Using a trained scene: load it (checkpoint, run folder or PLY), the run that draws it, camera-path videos and
exports in any registered format (with that format's options); its test split is scored in
:mod:`gsrecon.engine.scene_eval`."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gsrecon.cameras import Cameras
from gsrecon.cameras.lens import pinhole_project
from gsrecon.cameras.paths import CAMERA_PATHS, focus_point, interp_path
from gsrecon.config import ConfigError, apply_overrides, load_config, parse_structured
from gsrecon.data.formats.images import to_uint8
from gsrecon.data.pipeline import Batch, read_scene
from gsrecon.data.scene import Frame
from gsrecon.engine.build import SceneRun, build_scene_run
from gsrecon.engine.checkpoints import first_readable, load_checkpoint_file
from gsrecon.engine.resolve import RunConfig, resolve_views_config
from gsrecon.engine.run_dir import RunDir
from gsrecon.errors import InputError
from gsrecon.export import ExportContext, TrainedRun, export_gaussians
from gsrecon.logging.console import Logger, ProgressLogger
from gsrecon.model.scene_file import load_gaussians
from gsrecon.model.views.base import ViewModules, current_shape, export_notes
from gsrecon.params import check_params
from gsrecon.plugins import import_plugins
from gsrecon.registry import DATASET_REGISTRY, EXPORT_REGISTRY, MODEL_REGISTRY, RENDERER_REGISTRY
from gsrecon.render.base import Renderer, RenderOutput
from gsrecon.render.colormap import DEPTH_KINDS, depth_image

MIN_SEEN = 0.5  # a PLY whose Gaussians a capture's training views see less of was likely trained on another one


@dataclass
class TrainedScene:
    """A trained model with the config it was trained with."""

    cfg: RunConfig
    params: dict[str, Tensor]  # pre-activation Gaussian parameters
    step: int | None  # training step of the checkpoint (None for a PLY)
    source: str  # where it was loaded from
    views: dict[str, Any] = field(default_factory=dict)  # the checkpoint's per-view modules' state ({} for a PLY)

    @property
    def sh_degree(self) -> int:
        return check_params(self.params)

    @property
    def antialiased(self) -> bool:
        """Trained with Mip-Splatting's opacity compensation (``renderer.antialiased``)."""
        return bool(self.cfg.renderer.get("antialiased", False))


def load_trained_scene(
    checkpoint: str | None = None,
    exp_dir: str | None = None,
    ply: str | None = None,
    config: str | None = None,
    overrides: Sequence[str] = (),
    imports: Sequence[str] = (),
) -> TrainedScene:
    """Load from exactly one of ``checkpoint``, ``exp_dir`` (its newest readable checkpoint: a truncated
    ``last.pt`` is passed over with a warning, as ``--resume`` does) or ``ply``.

    The config comes from the checkpoint, or from ``config`` (required with ``ply``; optional
    otherwise, where it replaces the checkpoint's); ``overrides`` apply on top (e.g. ``data.path=...``).
    Code is imported only from ``imports`` and from the ``imports:`` of a ``config`` the user names:
    never from what a checkpoint stores.
    """
    given = [x for x in (checkpoint, exp_dir, ply) if x]
    if len(given) != 1:
        raise InputError("give exactly one of --checkpoint, --exp-dir or --ply")
    ckpt = None
    if exp_dir:
        run_dir = RunDir(exp_dir)
        files = run_dir.checkpoint_files()
        if not files:
            raise FileNotFoundError(f"no checkpoint in {run_dir.checkpoints}")
        found, ckpt = first_readable(files, Logger().warning)
        checkpoint = str(found)
    if ply:
        if not config:
            raise InputError("--ply needs --config: the YAML that says which dataset to evaluate on")
        raw, source, params, step = load_config(config, overrides), config, load_gaussians(ply), None
        views = {}
    else:
        ckpt = load_checkpoint_file(checkpoint, "cpu") if ckpt is None else ckpt
        stored = current_shape(copy.deepcopy(ckpt["config"]))  # a checkpoint of the old views shape, in the new
        raw = load_config(config, overrides) if config else apply_overrides(stored, overrides)
        source, params, step = config or checkpoint, ckpt["params"], int(ckpt["step"])
        views = ckpt.get("views", {})
    trusted = [*imports, *(raw.get("imports") or [] if config else [])]
    import_plugins(trusted, "--imports" if imports else str(source))
    cfg = parse_structured(RunConfig, raw, source=str(source))
    _check_registered(cfg, [] if config else cfg.imports, str(source))
    scene = TrainedScene(cfg, {k: v.float() for k, v in params.items()}, step, str(ply or checkpoint), views)
    if ply:
        warn_if_unseen(scene, Logger())
    return scene


def scene_run(scene: TrainedScene, device: str, logger: Logger, median_depth: bool = False) -> SceneRun:
    """``scene``'s run on ``device`` (:func:`~gsrecon.engine.build.build_scene_run`): its capture's data pipeline,
    the renderer that draws it there (the median depth too with ``median_depth``) and its per-view modules holding the
    checkpoint's state.

    A PLY has no such state: its modules start untrained (training cameras at their given poses), and their
    test-view policies (``views.appearance.eval``, ``views.pose_opt.eval``), which fit each test view afresh, apply
    as configured.
    """
    count = int(scene.params["means"].shape[0])
    return build_scene_run(scene.cfg, scene.source, logger, count, device, scene.views, median_depth)


def training_cameras(run: SceneRun) -> Tensor:
    """The training cameras [F, 4, 4] (world-to-camera, in ``run.datapipeline.scene.train`` order) where a trained
    scene's run (:func:`scene_run`) places them: their given poses, moved by the per-view modules that correct them
    (``pose_opt``)."""
    frames = run.datapipeline.scene.train
    given = run.datapipeline.scene.train_cameras.viewmats.float().cpu()  # [F, 4, 4]
    with torch.no_grad():
        return run.views.camera_poses(given, [frame.name for frame in frames])


def _check_registered(cfg: RunConfig, stored_imports: list[str], source: str) -> None:
    """Refuse names no registry knows, saying when the training run's own (not imported) plugins may hold them."""
    entries = (
        (DATASET_REGISTRY, cfg.data.dataset, "data.dataset"),
        (MODEL_REGISTRY, cfg.model.get("name", "gaussians"), "model.name"),
        (RENDERER_REGISTRY, cfg.renderer.get("name", "auto"), "renderer.name"),
    )
    for registry, name, key in entries:
        if name != "auto" and name not in registry:
            hint = (
                f"; the run registered it through its imports ({', '.join(stored_imports)}), which gsrecon never "
                f"imports from a checkpoint: pass --imports FILE if you trust that code"
                if stored_imports
                else ""
            )
            raise ConfigError(f"{source}: key '{key}': unknown {registry.name} '{name}'{hint}")


def batch_renderer(
    scene: TrainedScene, renderer: Renderer, device: torch.device, views: ViewModules | None = None
) -> Callable[[Batch], RenderOutput]:
    """A function rendering the scene with ``renderer`` on ``device`` from a batch's cameras, with what its per-view
    modules ``views`` (a run's, :func:`scene_run`) draw behind the Gaussians where given (the sky)."""
    params = {k: v.to(device) for k, v in scene.params.items()}

    def render(batch: Batch) -> RenderOutput:
        out = renderer.render_batch(params, batch, scene.sh_degree)
        return out if views is None else views.composite(out, batch)

    return render


def render_path_video(
    scene: TrainedScene,
    out: str | Path,
    path: str = "ellipse",
    frames: int = 120,
    fps: int = 30,
    depth: str | None = None,
    device: str = "auto",
    logger: Logger | None = None,
) -> list[Path]:
    """Render a smooth camera path fitted to the training cameras into ``out`` (mp4).

    The frames use the intrinsics and size of the first training view. With ``depth`` (``expected``: the
    renderer's blended depth, or ``median``: where the accumulated opacity crosses 1/2, the surface) a depth
    video is also written beside it (``<out stem>_depth.mp4``). Returns the written paths.
    """
    if path not in CAMERA_PATHS:
        raise InputError(f"unknown camera path '{path}'; use one of {', '.join(CAMERA_PATHS)}")
    if depth not in (None, *DEPTH_KINDS):
        raise InputError(f"unknown depth '{depth}'; use one of {', '.join(DEPTH_KINDS)}")
    if frames < 2:
        raise InputError(f"--frames must be at least 2, got {frames}")
    if Path(out).suffix.lower() != ".mp4":
        raise InputError(f"--out must be an .mp4 file, got {out}")
    from gsrecon.render.video import VideoWriter  # ffmpeg only where a video is written

    logger = logger or Logger()
    run = scene_run(scene, device, logger, median_depth=depth == "median")
    pipeline, torch_device, renderer = run.datapipeline, run.device, run.renderer
    train = pipeline.scene.train
    train_viewmats = pipeline.scene.train_cameras.viewmats.float()  # [N, 4, 4]
    if path == "interp":
        viewmats = interp_path(train_viewmats, frames)
    else:
        focus = focus_point(train_viewmats, pipeline.scene.points)
        viewmats = CAMERA_PATHS[path](train_viewmats, frames, focus=focus)
    viewmats = viewmats.to(torch_device)
    K, width, height = train[0].K.float().to(torch_device), train[0].width, train[0].height  # [3, 3]
    params = {k: v.to(torch_device) for k, v in scene.params.items()}
    background = pipeline.fixed_background().to(torch_device)[None]

    if width % 2 or height % 2:
        logger.info(
            f"frames are {width}x{height}: H.264 needs even sizes, so the video repeats the last "
            f"{'column' if width % 2 else 'row'}{' and row' if width % 2 and height % 2 else ''}"
        )
    out = Path(out)
    written = [out, out.with_name(f"{out.stem}_depth{out.suffix}")] if depth else [out]
    progress = ProgressLogger(frames, logger.console, label="render", fields={})
    progress.start(0)
    with ExitStack() as videos, torch.no_grad():  # one pass, one frame at a time: long videos need no memory
        videos.callback(progress.stop)
        rgb_video, *depth_video = [videos.enter_context(VideoWriter(path, fps)) for path in written]
        for index, viewmat in enumerate(viewmats):
            cameras = Cameras(viewmat[None], K[None], width, height)
            frame = renderer.render(params, cameras, scene.sh_degree, background)
            frame = run.views.composite(frame, Batch(frame.image, cameras, background, ["path"]))
            rgb_video.write(to_uint8(frame.image[0]))
            for video in depth_video:
                video.write(depth_image(frame, depth))
            progress.update(index + 1)
    return written


def export(
    scene: TrainedScene,
    out: str | Path,
    fmt: str = "ply",
    device: str = "auto",
    logger: Logger | None = None,
    options: dict[str, Any] | None = None,
    exp_dir: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the Gaussians in the registered export format ``fmt`` with its ``options`` (e.g. the mesh's
    ``voxel``), recording the render mode where the format can, and warning when the scene needs a viewer with
    Mip-Splatting's compensation.

    The training views and the renderer (on ``device``, with the median depth) are loaded only for a format
    that needs them; a format made from the run folder (``lod``) gets ``exp_dir``, the scene's, and may replace what
    a previous export left at ``out`` with ``overwrite``.
    """
    logger = logger or Logger()
    needs = EXPORT_REGISTRY.get(fmt).needs
    if "run" in needs and not exp_dir:
        raise InputError(f"--format {fmt} needs --exp-dir: it is built from and kept in a run folder")
    run = TrainedRun(Path(exp_dir), scene, logger, device) if exp_dir else None
    context = ExportContext(run=run, overwrite=overwrite)
    if {"train_batches", "render"} & set(needs):
        drawn = scene_run(scene, device, logger, median_depth=True)
        render = torch.no_grad()(batch_renderer(scene, drawn.renderer, drawn.device))
        context = replace(context, train_batches=drawn.datapipeline.train_batches, render=render)
    path = export_gaussians(scene.params, out, fmt, antialiased=scene.antialiased, context=context, options=options)
    for note in export_notes(resolve_views_config(scene.cfg, scene.source)):
        logger.info(f"{path}: {note}")
    if scene.antialiased:
        logger.warning(
            f"{path} was trained in antialiased mode (Mip-Splatting opacity compensation): it looks right only in "
            f"viewers that apply it, which the file records where {fmt} can; for any viewer, train with "
            f"renderer.antialiased=false"
        )
    return path


def warn_if_unseen(scene: TrainedScene, logger: Logger) -> None:
    """Warn when the training views of the ``--config``'s capture of a PLY (read for their poses, not their pixels)
    see less than :data:`MIN_SEEN` of its Gaussians: the ``--config`` of another capture? Say so where the capture
    cannot be read."""
    capture = scene.cfg.data.path or scene.cfg.data.dataset
    try:
        frames = read_scene(replace(scene.cfg.data, cache="disk")).train
    except (InputError, OSError) as exc:
        logger.warning(f"cannot check that {scene.source} belongs to the capture {capture} ({exc})")
        return
    seen = seen_fraction(scene.params["means"], frames)
    if seen < MIN_SEEN:
        logger.warning(
            f"the training views of the capture {capture} see only {seen:.0%} of the {len(scene.params['means'])} "
            f"Gaussians of {scene.source}: is the --config that of the capture they were trained on?"
        )


def seen_fraction(means: Tensor, frames: Sequence[Frame]) -> float:
    """The fraction of the points ``means`` [N, 3] that some of ``frames`` sees: in front of it, inside its image
    (through its pinhole intrinsics); 1 without points."""
    seen = torch.zeros(len(means), dtype=torch.bool)
    for frame in frames:
        camera = means.float() @ frame.viewmat[:3, :3].float().T + frame.viewmat[:3, 3].float()  # [N, 3]
        z = camera[:, 2]
        pixels = pinhole_project(camera[:, 0], camera[:, 1], z, frame.K.float())
        inside = (pixels.pixel_x >= 0) & (pixels.pixel_x < frame.width) & (pixels.pixel_y >= 0)
        seen |= (z > 0) & inside & (pixels.pixel_y < frame.height)
    return float(seen.float().mean()) if len(means) else 1.0
