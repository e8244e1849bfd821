"""A fisheye capture, undistorted or trained through its lens, against the same capture through a pinhole: test
PSNR after training, over seeds and lengths.

    python scripts/bench_fisheye.py --out /tmp/bench_fisheye --lengths 2000,7000 --seeds 0,1,2

Writes the two nerfstudio captures of ``tests/test_fisheye.py::write_synthetic_capture`` under ``--out``: the
synthetic scene orbited by a 125x95-degree ``OPENCV_FISHEYE`` camera at 96x72, and by the pinhole camera its
undistorted images have, each with the scene's points. Each (length, seed) trains three runs with
``configs/mipnerf360.yaml`` (every 8th view held out, one thread): the pinhole capture, the fisheye capture
undistorted (``data.fisheye: undistort``) and the fisheye capture through its lens (``data.fisheye: lens``). Both
fisheye runs are scored on the pinhole capture's held-out views (the true pinhole images of the same cameras) and
on the fisheye capture's held-out views as shot (the whole lens, rendered through it); ``--off-axis DEG`` also
scores every run on both within and beyond DEG degrees of the optical axis, ``--set key=value`` changes every
run (e.g. ``renderer.antialiased=true``). Prints markdown tables with the machine, threads and load average.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
from pathlib import Path

import torch
from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_quality import load_average, run  # noqa: E402
from test_fisheye import write_synthetic_capture  # noqa: E402

from gsrecon.data.pipeline import DataPipeline  # noqa: E402
from gsrecon.engine.evaluator import evaluate_views  # noqa: E402
from gsrecon.engine.trainer import DefaultTrainer  # noqa: E402
from gsrecon.metrics import mean_metrics  # noqa: E402

RUNS = {  # run name: (capture, overrides)
    "pinhole": ("pinhole", []),
    "undistort": ("fisheye", ["data.fisheye=undistort"]),
    "lens": ("fisheye", ["data.fisheye=lens"]),
}
VIEWS = ("pinhole_views", "fisheye_views")  # the held-out views every run is scored on with --off-axis
COLUMNS = {  # result key: table header
    "pinhole": "pinhole",
    "undistort_pinhole_views": "undistorted: pinhole views",
    "lens_pinhole_views": "through the lens: pinhole views",
    "undistort_fisheye_views": "undistorted: fisheye views",
    "lens_fisheye_views": "through the lens: fisheye views",
}


def train_runs(
    captures: Path, length: int, seed: int, threads: int, work: Path, common: list[str], off_axis: float | None
) -> dict[str, float]:
    """Test PSNR of the three runs, the fisheye runs on the pinhole and on the fisheye held-out views (COLUMNS);
    with ``off_axis`` (degrees), also every run on both views within and beyond that angle from the optical axis
    (keys ``<run>_<views>_centre`` and ``..._rim``)."""
    trainers = {}
    for name, (capture, extra) in RUNS.items():
        overrides = ["data.dataset=blender", f"data.path={captures / capture}", "data.factor=1", f"seed={seed}"]
        recorder = {"steps": [length], "seconds": [], "clock": "cpu"}
        folder = work / f"{name}_{length}_{seed}"
        trainers[name] = run("configs/mipnerf360.yaml", [*overrides, *extra, *common], recorder, threads, folder)
    views = dict(zip(VIEWS, (trainers["pinhole"].datapipeline, trainers["lens"].datapipeline)))
    result = {"pinhole": trainers["pinhole"].val_metrics["psnr"]}
    for name in ("undistort", "lens"):
        for key, pipeline in views.items():
            scored = evaluate_views(trainers[name].render, pipeline.val_batches(), trainers[name].metrics)
            result[f"{name}_{key}"] = mean_metrics(scored)["psnr"]
    if off_axis is not None:
        for name, trainer in trainers.items():
            for key, pipeline in views.items():
                centre, rim = split_psnr(trainer, pipeline, math.radians(off_axis))
                result |= {f"{name}_{key}_centre": centre, f"{name}_{key}_rim": rim}
    return result


@torch.no_grad()
def split_psnr(trainer: DefaultTrainer, pipeline: DataPipeline, angle: float) -> tuple[float, float]:
    """PSNR of ``trainer``'s renders of ``pipeline``'s test views over the pixels seen within ``angle`` (radians) of
    the optical axis and over those beyond it (a pinhole pixel at ``atan(r)``, a fisheye pixel at about ``r``)."""
    errors: dict[bool, list[Tensor]] = {True: [], False: []}
    for batch in pipeline.val_batches():
        error = ((trainer.render(batch).image.clamp(0, 1) - batch.images) ** 2).mean(-1)[0]  # [H, W]
        K = batch.cameras.Ks[0]
        rows, columns = (
            torch.arange(n, device=error.device) + 0.5 for n in (batch.cameras.height, batch.cameras.width)
        )
        v, u = torch.meshgrid(rows, columns, indexing="ij")
        r = torch.hypot((u - K[0, 2]) / K[0, 0], (v - K[1, 2]) / K[1, 1])  # [H, W]
        within = (r if batch.cameras.model.kind == "fisheye" else torch.atan(r)) < angle
        errors[True].append(error[within])
        errors[False].append(error[~within])
    centre, rim = (-10 * math.log10(float(torch.cat(errors[side]).mean())) for side in (True, False))
    return centre, rim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--lengths", default="2000")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (num_threads)")
    parser.add_argument("--set", action="append", default=[], help="key=value for every run (repeatable)")
    parser.add_argument("--off-axis", type=float, help="also score each run within / beyond this angle (degrees)")
    args = parser.parse_args()
    captures = args.out / "captures"
    for capture in ("pinhole", "fisheye"):
        if not (captures / capture / "transforms.json").is_file():
            write_synthetic_capture(captures / capture, capture == "fisheye", captures / "synthetic")
    os.chdir(ROOT)  # the config path is relative to the checkout
    lines = [
        "| steps | seeds | " + " | ".join(COLUMNS.values()) + " |",
        "|---:|---:|" + "---:|" * len(COLUMNS),
    ]
    regions: list[str] = []
    for length in (int(v) for v in args.lengths.split(",")):
        runs = []
        for seed in (int(v) for v in args.seeds.split(",")):
            runs.append(train_runs(captures, length, seed, args.threads, args.out / "work", args.set, args.off_axis))
            print(f"{length} steps, seed {seed}: " + ", ".join(f"{k} {v:.2f} dB" for k, v in runs[-1].items()))

        def cell(key: str, runs: list[dict[str, float]] = runs) -> str:
            values = [r[key] for r in runs]
            return f"{statistics.fmean(values):.2f} ± {(max(values) - min(values)) / 2:.2f}"

        lines.append(f"| {length} | {len(runs)} | " + " | ".join(cell(key) for key in COLUMNS) + " |")
        if args.off_axis is not None:
            regions.append(f"\n{length} steps, within / beyond {args.off_axis:g} degrees off axis:\n")
            regions += ["| run | pinhole views | fisheye views |", "|---|---:|---:|"]
            for name in RUNS:
                pair = [f"{cell(f'{name}_{v}_centre')} / {cell(f'{name}_{v}_rim')}" for v in VIEWS]
                regions.append(f"| {name} | {pair[0]} | {pair[1]} |")
    load = " ".join(f"{v:.2f}" for v in load_average())
    print(
        f"\n{platform.processor() or platform.machine()}, torch {torch.__version__}, {args.threads} thread(s), "
        f"load average at the end {load}\n"
    )
    print("\n".join(lines + regions))


if __name__ == "__main__":
    main()
