"""``gsrecon bench``'s options and the call they make (gsrecon/cli.py only dispatches to them)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gsrecon.bench import SUITES
from gsrecon.bench.peers import PEERS, PeerSetup
from gsrecon.bench.request import SCHEDULES, STRATEGIES, SuiteRun

SUMMARY = "train and score a suite of scenes under a published protocol, beside the peers and the published numbers"
DESCRIPTION = (
    "Run a published protocol (Mip-NeRF 360, Tanks and Temples, Deep Blending, NeRF-synthetic, LLFF: which images, "
    "downscale, test views and background) over --data, a folder holding a folder per scene: each scene trained for "
    "--steps and scored on its test views (gsrecon's PSNR / SSIM / LPIPS, torchmetrics' SSIM and LPIPS as gsplat's "
    "simple_trainer.py computes them, LPIPS-VGG as the 3DGS paper). --out gets <scene>/metrics.json, results.md and "
    "results.csv (the published numbers beside ours, each with its source) and psnr_time.png. Run the same command "
    "again to resume an interrupted suite: finished scenes are kept, a half-trained one continues from its "
    "checkpoint. --peer gsplat (CUDA; needs --schedule 3dgs) and --peer opensplat (CPU) train the same scenes, steps "
    "and images and join the table."
)


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("suite", choices=list(SUITES), help="the protocol")
    p.add_argument("--data", required=True, type=Path, help="the folder holding the suite's scene folders")
    p.add_argument("--out", required=True, type=Path, help="the results folder")
    p.add_argument("--steps", type=int, default=7000, help="training steps (the protocols publish 7000 and 30000)")
    p.add_argument("--scenes", help="comma-separated scenes of the suite to run (default: all of them)")
    p.add_argument("--config", help="YAML config gsrecon trains with (default: the suite's, from configs/)")
    p.add_argument("--peer", action="append", default=[], choices=PEERS, help="a peer to run too (repeatable)")
    p.add_argument(
        "--schedule",
        default="config",
        choices=SCHEDULES,
        help="config: the config's own densification schedule; 3dgs: the 3DGS paper's scaled to --steps, passed to "
        "gsrecon and gsplat alike (scripts/bench_vs_gsplat.py)",
    )
    p.add_argument("--strategy", default="default", choices=STRATEGIES, help="densification strategy")
    p.add_argument("--cap-max", type=int, default=1_000_000, help="MCMC's Gaussian budget")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--curve", type=int, default=4, help="validations over a run: the points of psnr_time.png")
    p.add_argument("--gsplat-examples", type=Path, default=Path(".gsplat_examples"), help="gsplat's examples/")
    p.add_argument("--opensplat", default="opensplat", help="the opensplat binary")
    p.add_argument("--overwrite", action="store_true", help="replace the results a suite wrote in --out")
    p.add_argument("overrides", nargs="*", help="key=value overrides of gsrecon's config, applied last")


def bench(args: argparse.Namespace):
    """Run the suite ``args`` describe; its :class:`~gsrecon.bench.runner.SuiteOutcome`."""
    from gsrecon.bench.runner import run_suite
    from gsrecon.data.prepare.detect import CONFIGS_DIR

    suite = SUITES[args.suite]
    scenes = tuple(args.scenes.split(",")) if args.scenes else suite.scene_names
    for name in scenes:
        suite.scene(name)  # an unknown name is refused before anything runs
    run = SuiteRun(
        suite=suite, data=args.data, out=args.out, steps=args.steps,
        config=args.config or str(CONFIGS_DIR / suite.config), scenes=scenes, peers=tuple(args.peer),
        schedule=args.schedule, strategy=args.strategy, cap_max=args.cap_max, seed=args.seed, curve_points=args.curve,
        overrides=tuple(args.overrides),
        peer_setup=PeerSetup(gsplat_examples=args.gsplat_examples, opensplat=args.opensplat),
    )  # fmt: skip
    return run_suite(run, overwrite=args.overwrite)
