"""gsrecon against OpenSplat's CPU trainer on one COLMAP capture: each whole process's wall time and the PSNR /
SSIM of one held-out photo, both pinned to one core, runs alternated.

    python scripts/bench_vs_opensplat.py --opensplat /tmp/opensplat/build/opensplat \\
        --data ../shared/data/statuette_colmap --image DSC_5291 --rounds 2 --out /tmp/vs_opensplat

Each round runs ``gsrecon train --config CONFIG`` (``num_threads=1``, ``max_steps=STEPS``; the photo must be one of
its test views) and then OpenSplat (``-n STEPS -d FACTOR --cpu --val --val-image IMAGE``, ``OMP_NUM_THREADS=1``),
each under ``taskset -c CORE`` (OpenSplat's rasterizer starts a thread per core whatever ``OMP_NUM_THREADS``
says). gsrecon's score of the photo is its own validation's (``metrics.json``). OpenSplat prints no PSNR: one
more run with ``--val-render`` saves its render of the photo every 10 steps (untimed: the renders cost time), and
its last render is scored against the ground truth gsrecon validated on (``gsrecon eval``'s ``gt/IMAGE.png``;
OpenSplat writes 8-bit renders by truncation, decoded here as (k + 0.5) / 255). OpenSplat trains on every photo
but the one held out, gsrecon on its ``every_8`` split (20 of the statuette's 23). OpenSplat runs with
``--num-downscales 0``: by default it trains at a quarter of the asked resolution for its first 3000 steps
(``--resolution-schedule``), so a 2000-step run would never see the resolution gsrecon trains at.

Writes ``<out>/runs.csv`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from gsrecon.data.formats.images import read_image
from gsrecon.io.ply import read_ply_header
from gsrecon.losses.ssim import ssim
from gsrecon.metrics import psnr

FIELDS = ("round", "trainer", "wall_s", "psnr", "ssim", "gaussians", "load1")


def timed(command: list[str], log: Path, env: dict[str, str] | None = None) -> float:
    """Runs ``command`` (its output into ``log``) and returns its wall seconds; a failure stops the benchmark."""
    start = time.perf_counter()
    with log.open("w") as out:
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed (exit {result.returncode}); see {log}")
    return seconds


def as_tensor(path: Path) -> torch.Tensor:
    """An 8-bit image file as floats [H, W, 3] in [0, 1], each value k read as (k + 0.5) / 255."""
    return torch.from_numpy((read_image(path)[..., :3].astype(np.float32) + 0.5) / 255.0)


def gaussians_in_ply(path: Path) -> int:
    """The vertex count in a .ply's header."""
    return next(rows for name, rows, _ in read_ply_header(path).elements if name == "vertex")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--opensplat", required=True, type=Path, help="the opensplat binary")
    parser.add_argument("--data", required=True, type=Path, help="a COLMAP capture (images/, sparse/0)")
    parser.add_argument("--image", required=True, help="the held-out photo's name without extension")
    parser.add_argument("--config", default="configs/statuette.yaml")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--factor", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--core", default="1", help="the core both trainers are pinned to (taskset -c)")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    photo = next(p.name for p in (args.data / "images").iterdir() if p.stem == args.image)
    pin = ["taskset", "-c", args.core]
    one_thread = {**os.environ, "OMP_NUM_THREADS": "1"}
    opensplat = [str(args.opensplat), str(args.data), "-n", str(args.steps), "-d", str(args.factor), "--cpu", "--val"]
    opensplat += ["--num-downscales", "0"]
    opensplat += ["--val-image", photo]
    rows: list[dict[str, object]] = []
    for k in range(1, args.rounds + 1):
        run = args.out / f"gsrecon_{k}"
        command = [sys.executable, "-m", "gsrecon.cli", "train", "--config", args.config, "--overwrite"]
        command += [f"data.path={args.data}", f"data.factor={args.factor}", f"exp_dir={run}", "num_threads=1"]
        seconds = timed(pin + command + [f"max_steps={args.steps}"], args.out / f"gsrecon_{k}.log", one_thread)
        metrics = json.loads((run / "metrics.json").read_text())
        view = next((v for v in metrics["images"] if v["name"] == args.image), None)
        if view is None:
            sys.exit(f"{args.image} is not one of {args.config}'s test views")
        rows.append({"round": k, "trainer": "gsrecon", "wall_s": seconds, "psnr": view["psnr"], "ssim": view["ssim"],
                     "gaussians": metrics["num_gaussians"], "load1": os.getloadavg()[0]})  # fmt: skip
        ply = args.out / f"opensplat_{k}" / "splat.ply"
        ply.parent.mkdir(exist_ok=True)
        seconds = timed(pin + opensplat + ["-o", str(ply)], args.out / f"opensplat_{k}.log", one_thread)
        rows.append({"round": k, "trainer": "OpenSplat", "wall_s": seconds, "psnr": None, "ssim": None,
                     "gaussians": gaussians_in_ply(ply), "load1": os.getloadavg()[0]})  # fmt: skip
    # Scoring: gsrecon's ground truth of the photo, and OpenSplat's last render of it.
    subprocess.run([sys.executable, "-m", "gsrecon.cli", "eval", "--exp-dir", str(args.out / "gsrecon_1"), "--out",
                    str(args.out / "gsrecon_eval")], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    renders = args.out / "opensplat_renders"
    renders.mkdir(exist_ok=True)
    scored = args.out / "opensplat_scored"
    scored.mkdir(exist_ok=True)
    timed(pin + opensplat + ["-o", str(scored / "splat.ply"), "--val-render", str(renders)],
          args.out / "opensplat_scored.log", one_thread)  # fmt: skip
    pred = as_tensor(renders / f"{args.steps}.png")[None]  # [1, H, W, 3]
    gt = torch.from_numpy(read_image(args.out / "gsrecon_eval" / "gt" / f"{args.image}.png")[..., :3] / 255.0)
    gt = gt.float()[None]  # [1, H, W, 3]
    for row in rows:
        if row["trainer"] == "OpenSplat":
            row["psnr"], row["ssim"] = psnr(pred, gt), float(ssim(pred, gt))
    with (args.out / "runs.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"| round | trainer | wall s | PSNR {args.image} | SSIM | Gaussians | load |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['round']} | {row['trainer']} | {row['wall_s']:.1f} | {row['psnr']:.2f} | {row['ssim']:.3f} | "
              f"{row['gaussians']} | {row['load1']:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
