"""The ``gsrecon data`` commands (structure from motion, triangulation): their arguments, with the library's choices
and defaults, and what each runs (:mod:`gsrecon.cli` adds them to its parser, as :mod:`gsrecon.viewer.cli` serves
``gsrecon view``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from gsrecon.data.formats.images import FACTORS
from gsrecon.data.prepare.posed_sfm import MAX_SIDE, STAGES
from gsrecon.data.prepare.sfm import AUTO_MATCHER, CAMERA_MODEL, CAMERA_MODES, MATCHERS, exit_on_signal
from gsrecon.data.prepare.triangulate import triangulate_scene
from gsrecon.data.prepare.unposed import announce_stages, capture_sfm
from gsrecon.data.prepare.video import DEFAULT_FRAMES, OVERSAMPLE
from gsrecon.logging.console import Logger

# (subparsers, name, summary, description) -> the subcommand's parser
Command = Callable[[argparse._SubParsersAction, str, str, str], argparse.ArgumentParser]


def colmap(args: argparse.Namespace) -> int:
    """``gsrecon data colmap``: structure from motion on photos or videos; prints its report."""
    log = Logger().info
    with exit_on_signal("structure from motion"):
        report = capture_sfm(
            args.out, announce_stages(log), photos=args.images, videos=args.video or (), frames=args.frames,
            fps=args.fps, oversample=args.oversample, on_video=lambda video: log(f"  {video.describe()}"),
            camera_model=args.camera_model, camera_mode=args.camera_mode, matcher=args.matcher, use_gpu=not args.cpu,
            verbose=args.verbose,
        )  # fmt: skip
    print("\n".join(report.lines()))
    return 0


def triangulate(args: argparse.Namespace) -> int:
    """``gsrecon data triangulate``: points of a transforms.json scene from its known poses; prints its report."""
    report = triangulate_scene(
        args.data, factor=args.factor, matcher=args.matcher, overwrite=args.overwrite, use_gpu=not args.cpu,
        verbose=args.verbose, on_stage=announce_stages(Logger().info)(STAGES),
    )  # fmt: skip
    print("\n".join(report.lines(args.data)))
    return 0


def add_data_commands(sub: argparse._SubParsersAction, command: Command) -> None:
    """Add ``gsrecon data`` and its subcommands to ``sub``, each made by ``command``."""
    p = command(sub, "data", "prepare datasets", "Prepare datasets for training (see the subcommands).")
    data_sub = p.add_subparsers(dest="data_command", required=True)
    c = command(
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
        "--frames", type=int, help=f"--video: frames to keep over all videos, shared by duration ({DEFAULT_FRAMES})"
    )
    count.add_argument("--fps", type=float, help="--video: frames to keep per second of video, instead of --frames")
    c.add_argument(
        "--oversample",
        type=int,
        help="--video: candidate frames per kept frame; the sharpest of each window of this many is kept "
        f"(variance of the Laplacian), the blurrier ones dropped ({OVERSAMPLE}; 1 keeps evenly spaced frames)",
    )
    c.add_argument("--camera-model", default=CAMERA_MODEL, help="COLMAP camera model to fit")
    c.add_argument(
        "--matcher",
        default=AUTO_MATCHER,
        choices=[AUTO_MATCHER, *MATCHERS],
        help="exhaustive for photo sets, sequential for video frames; auto: sequential when the image names look "
        "like the frames of one video (one prefix, consecutive numbers), exhaustive otherwise",
    )
    c.add_argument(
        "--camera-mode",
        default=CAMERA_MODES[0],
        choices=CAMERA_MODES,
        help="auto: one camera per image size; per_image: separate intrinsics for every photo",
    )
    t = command(
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
        choices=[0, *FACTORS],
        help="image downscale factor for features (images_<f>/ when present); 0 (default): the smallest that "
        f"brings the longest side to at most {MAX_SIDE} px",
    )
    t.add_argument(
        "--matcher",
        default=MATCHERS[0],
        choices=MATCHERS,
        help="exhaustive for photo sets, sequential for video frames",
    )
    t.add_argument("--overwrite", action="store_true", help="replace a ply_file_path the transforms file already names")
    for parser, run in ((c, colmap), (t, triangulate)):
        parser.add_argument("--cpu", action="store_true", help="do not use a GPU for SIFT")
        parser.add_argument("--verbose", action="store_true", help="show pycolmap's own progress log")
        parser.set_defaults(func=run)
