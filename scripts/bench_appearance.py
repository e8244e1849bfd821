"""Test-view PSNR with and without per-image appearance, on synthetic photos whose exposure, white balance and
black level change from one training image to the next (test views keep the true colours).

    python scripts/bench_appearance.py --seeds 0,1,2 --steps 1500 --lr 0.005

Each seed trains ``appearance.name: none`` and ``affine`` on the same perturbed images (the run of
``tests/test_appearance.py::test_affine_appearance_beats_none_on_perturbed_photos``: 64x48 px, 24 views of
which 3 are held out, one thread) and scores the test views as rendered (``eval: identity``) and, for affine,
with a transform fitted on the left half of each view (``eval: fit_left``, right half scored). Prints a
markdown table with the machine, threads and load average.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from conftest import tiny_config  # noqa: E402
from test_appearance import benchmark_config, perturb_training_images  # noqa: E402

from gsrecon.config import parse_structured  # noqa: E402
from gsrecon.engine.trainer import DefaultTrainer  # noqa: E402


def test_psnr(mode: str, seed: int, steps: int, lr: float, evaluation: str, work: Path, cache: Path) -> float:
    """Mean test-view PSNR of one run trained on perturbed photos."""
    top = benchmark_config(mode, cache, steps)
    top["views"]["appearance"].update({"lr": lr, "eval": evaluation})
    cfg = parse_structured(DefaultTrainer.Config, tiny_config(work / f"{mode}_{evaluation}_{seed}", cache, **top))
    trainer = DefaultTrainer(cfg)
    perturb_training_images(trainer, seed)
    trainer.train()
    return trainer.val_metrics["psnr"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=0.005, help="appearance.lr")
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work, cache = Path(tmp), Path(tmp) / "cache"
        for seed in seeds:
            none = test_psnr("none", seed, args.steps, args.lr, "identity", work, cache)
            affine = test_psnr("affine", seed, args.steps, args.lr, "identity", work, cache)
            fitted = test_psnr("affine", seed, args.steps, args.lr, "fit_left", work, cache)
            rows.append((seed, none, affine, fitted))
            print(f"seed {seed}: none {none:.2f} dB, affine {affine:.2f} dB, affine fit_left {fitted:.2f} dB")
    print(f"\n{platform.machine()}, {os.cpu_count()} cores, 1 thread, load {os.getloadavg()[0]:.2f}\n")
    print("| seed | none | affine (eval identity) | gain | affine (eval fit_left, right half) |")
    print("|---:|---:|---:|---:|---:|")
    for seed, none, affine, fitted in rows:
        print(f"| {seed} | {none:.2f} | {affine:.2f} | {affine - none:+.2f} | {fitted:.2f} |")
    means = [statistics.mean(column) for column in list(zip(*rows))[1:]]
    print(f"| mean | {means[0]:.2f} | {means[1]:.2f} | **{means[1] - means[0]:+.2f}** | {means[2]:.2f} |")


if __name__ == "__main__":
    main()
