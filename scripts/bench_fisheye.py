"""A fisheye capture, undistorted or trained through its lens, against the same capture through a pinhole: test
PSNR after training, over seeds and lengths.

    python scripts/bench_fisheye.py --out /tmp/bench_fisheye --lengths 2000,7000 --seeds 0,1,2

Writes the two nerfstudio captures of ``tests/test_fisheye.py::write_synthetic_capture`` under ``--out``: the
synthetic scene orbited by a 125x95-degree ``OPENCV_FISHEYE`` camera at 96x72, and by the pinhole camera its
undistorted images have, each with the scene's points. Each (length, seed) trains three runs with
``configs/mipnerf360.yaml`` (every 8th view held out, one thread): the pinhole capture, the fisheye capture
undistorted (``data.fisheye: undistort``) and the fisheye capture through its lens (``data.fisheye: lens``). Both
fisheye runs are scored on the pinhole capture's held-out views (the true pinhole images of the same cameras) and
on the fisheye capture's held-out views as shot (the whole lens, rendered through it). Prints a markdown table
with the machine, threads and load average.
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

RUNS = {  # run name: (capture, overrides)
    "pinhole": ("pinhole", []),
    "undistort": ("fisheye", ["data.fisheye=undistort"]),
    "lens": ("fisheye", ["data.fisheye=lens"]),
}
COLUMNS = {  # result key: table header
    "pinhole": "pinhole",
    "undistort_pinhole_views": "undistorted: pinhole views",
    "lens_pinhole_views": "through the lens: pinhole views",
    "undistort_fisheye_views": "undistorted: fisheye views",
    "lens_fisheye_views": "through the lens: fisheye views",
}


def train_runs(captures: Path, length: int, seed: int, threads: int, work: Path) -> dict[str, float]:
    """Test PSNR of the three runs, the fisheye runs on the pinhole and on the fisheye held-out views (COLUMNS)."""
    trainers = {}
    for name, (capture, extra) in RUNS.items():
        overrides = ["data.dataset=blender", f"data.path={captures / capture}", "data.factor=1", f"seed={seed}", *extra]
        recorder = {"steps": [length], "seconds": [], "clock": "cpu"}
        trainers[name] = run("configs/mipnerf360.yaml", overrides, recorder, threads, work / f"{name}_{length}_{seed}")
    views = {"pinhole_views": trainers["pinhole"].datapipeline, "fisheye_views": trainers["lens"].datapipeline}
    result = {"pinhole": trainers["pinhole"].val_metrics["psnr"]}
    for name in ("undistort", "lens"):
        for key, pipeline in views.items():
            scored = evaluate_views(trainers[name].render, pipeline.val_batches(), trainers[name].metrics)
            result[f"{name}_{key}"] = mean_metrics(scored)["psnr"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--lengths", default="2000")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (num_threads)")
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
    for length in (int(v) for v in args.lengths.split(",")):
        runs = []
        for seed in (int(v) for v in args.seeds.split(",")):
            runs.append(train_runs(captures, length, seed, args.threads, args.out / "work"))
            print(f"{length} steps, seed {seed}: " + ", ".join(f"{k} {v:.2f} dB" for k, v in runs[-1].items()))

        def cell(key: str, runs: list[dict[str, float]] = runs) -> str:
            values = [r[key] for r in runs]
            return f"{statistics.fmean(values):.2f} ± {(max(values) - min(values)) / 2:.2f}"

        lines.append(f"| {length} | {len(runs)} | " + " | ".join(cell(key) for key in COLUMNS) + " |")
    load = " ".join(f"{v:.2f}" for v in load_average())
    print(
        f"\n{platform.processor() or platform.machine()}, torch {torch.__version__}, {args.threads} thread(s), "
        f"load average at the end {load}\n"
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
