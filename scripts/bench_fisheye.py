"""A fisheye capture against the same capture through a pinhole: test PSNR after training, over seeds and lengths.

    python scripts/bench_fisheye.py --out /tmp/bench_fisheye --lengths 2000,7000 --seeds 0,1,2

Writes the two nerfstudio captures of ``tests/test_fisheye.py::write_synthetic_capture`` under ``--out``: the
synthetic scene orbited by a 125x95-degree ``OPENCV_FISHEYE`` camera at 96x72, and by the pinhole camera its
undistorted images have, each with the scene's points. Each (length, seed) trains both with
``configs/mipnerf360.yaml`` (every 8th view held out, one thread) and scores the fisheye-trained scene twice: on
its own held-out views (undistorted, so resampled) and on the pinhole capture's, the true images of the same
cameras. Prints a markdown table with the machine, threads and load average.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_quality import load_average, run  # noqa: E402
from test_fisheye import write_synthetic_capture  # noqa: E402

from gsrecon.engine.evaluator import evaluate_views  # noqa: E402
from gsrecon.metrics import mean_metrics  # noqa: E402

LENSES = ("pinhole", "fisheye")


def train_pair(captures: Path, length: int, seed: int, threads: int, work: Path) -> dict[str, float]:
    """Test PSNR of the pinhole run, of the fisheye run on its own views and on the pinhole capture's views."""
    trainers = {}
    for lens in LENSES:
        overrides = ["data.dataset=blender", f"data.path={captures / lens}", "data.factor=1", f"seed={seed}"]
        recorder = {"steps": [length], "seconds": [], "clock": "cpu"}
        trainers[lens] = run("configs/mipnerf360.yaml", overrides, recorder, threads, work / f"{lens}_{length}_{seed}")
    fisheye, pinhole = trainers["fisheye"], trainers["pinhole"]
    true_views = evaluate_views(fisheye.render, pinhole.datapipeline.val_batches(), fisheye.metrics)
    return {
        "pinhole": pinhole.val_metrics["psnr"],
        "fisheye": fisheye.val_metrics["psnr"],
        "fisheye_on_pinhole_views": mean_metrics(true_views)["psnr"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--lengths", default="2000")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (num_threads)")
    args = parser.parse_args()
    captures = args.out / "captures"
    for lens in LENSES:
        if not (captures / lens / "transforms.json").is_file():
            write_synthetic_capture(captures / lens, lens == "fisheye", captures / "synthetic")
    os.chdir(ROOT)  # the config path is relative to the checkout
    lines = [
        "| steps | seeds | pinhole | fisheye, own views | fisheye, pinhole views | difference (pinhole views) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for length in (int(v) for v in args.lengths.split(",")):
        runs = []
        for seed in (int(v) for v in args.seeds.split(",")):
            runs.append(train_pair(captures, length, seed, args.threads, args.out / "work"))
            print(f"{length} steps, seed {seed}: " + ", ".join(f"{k} {v:.2f} dB" for k, v in runs[-1].items()))

        def cell(key: str, runs: list[dict[str, float]] = runs) -> str:
            values = [r[key] for r in runs]
            return f"{statistics.fmean(values):.2f} ± {(max(values) - min(values)) / 2:.2f}"

        difference = [r["fisheye_on_pinhole_views"] - r["pinhole"] for r in runs]
        lines.append(
            f"| {length} | {len(runs)} | {cell('pinhole')} | {cell('fisheye')} | {cell('fisheye_on_pinhole_views')} "
            f"| {statistics.fmean(difference):+.2f} |"
        )
    load = " ".join(f"{v:.2f}" for v in load_average())
    print(
        f"\n{platform.processor() or platform.machine()}, torch {torch.__version__}, {args.threads} thread(s), "
        f"load average at the end {load}\n"
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
