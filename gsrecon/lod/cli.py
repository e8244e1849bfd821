"""``gsrecon lod``'s options and the call they make (gsrecon/cli.py only dispatches to them)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gsrecon.lod.config import LodConfig

if TYPE_CHECKING:
    from gsrecon.lod.levels import LodOutcome

SUMMARY = "build levels of detail of a trained run, each trained on the photos"
DESCRIPTION = (
    "Build levels 1..K below a run's trained scene in <exp_dir>/lod/: each merges neighbouring pairs of the "
    "level above (moment matching: mass, mean, covariance and colour kept), then trains alone on the training "
    "photos at --scale times the resolution divisor of the level above, with the run's renderer, device, "
    "threads, loss and per-view modules (no densification). Run again to resume; levels already built with the "
    "same settings are kept (a level trained past --steps or at another resolution is trained anew). The run's "
    "lock is held meanwhile. gsrecon export --format lod writes them for streaming."
)


def add_lod_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--exp-dir", required=True, help="the trained run's folder (a merged block run too)")
    p.add_argument("--levels", type=int, default=LodConfig.levels, help="levels below the trained scene, each half")
    p.add_argument("--steps", type=int, default=LodConfig.steps, help="training steps of each level")
    p.add_argument("--scale", type=int, default=LodConfig.scale, help="resolution divisor over the level above")
    p.add_argument("--device", default="auto", help="auto (the run's) | cpu | cuda | cuda:N")
    p.add_argument("--imports", action="append", default=[], help="a plugin to import first (as for export)")
    p.add_argument("overrides", nargs="*", help="key=value changes of the run's config, e.g. data.path=...")


def build_levels_of(args: argparse.Namespace) -> LodOutcome:
    """``gsrecon lod``: the levels of the run in ``args.exp_dir`` built as its options ask."""
    from gsrecon.engine.inference import load_trained_scene
    from gsrecon.lod.levels import build_levels

    lod = LodConfig(args.levels, args.steps, args.scale)  # refuses bad values before loading anything
    scene = load_trained_scene(exp_dir=args.exp_dir, overrides=args.overrides, imports=args.imports)
    return build_levels(scene, args.exp_dir, lod, device=args.device)
