"""Memory of training with ``data.cache: cpu`` (every image decoded up front) against ``disk`` (decoded on
demand, a few batches ahead), on transforms.json captures of hundreds of frames.

    python scripts/bench_cache.py --frames 100,300,1000 --size 768x576 --steps 10 --threads 1

Each capture is the synthetic scene rendered at 1/4 of ``--size`` and written upscaled as PNGs (cheap to make;
decoding costs what it costs at full size), once, under ``--work``. Making a capture and each (frames, mode)
training run in processes of their own, and this one imports nothing heavy: Linux hands a process's resident
size at ``exec`` on to the new program's ``ru_maxrss``. Each training reports its resident memory after imports,
after loading the data and after training, its peak (``ru_maxrss``), load and step times, and the most decoded
frames alive at once. Prints a markdown table with the machine, threads and load average.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UPSCALE = 4
POINTS = 300  # few Gaussians: the renderer's own memory stays small beside the images


def write_capture(scene: Path, frames: int, size: tuple[int, int]) -> None:
    """A transforms.json capture of ``frames`` PNGs of ``size`` in ``scene``."""
    import numpy as np
    import torch
    from PIL import Image

    from gsrecon.data.readers.synthetic import SyntheticConfig, load_synthetic
    from gsrecon.data.scene import Frame

    sys.path.insert(0, str(ROOT / "tests"))
    from test_triangulate import _write_transforms  # the tests' transforms.json writer

    width, height = size
    config = SyntheticConfig(
        num_views=frames, width=width // UPSCALE, height=height // UPSCALE, supersample=1, cache_dir=str(scene / "gen")
    )
    scale = torch.diag(torch.tensor([float(UPSCALE), float(UPSCALE), 1.0]))
    big = [
        Frame(f.name, f.viewmat, scale @ f.K, torch.from_numpy(np.array(Image.fromarray(f.image.numpy()).resize(size))))
        for f in load_synthetic(config, eval_split="none").train
    ]
    _write_transforms(scene / "scene", big)


def train(capture: Path, mode: str, steps: int, threads: int, exp_dir: Path) -> dict:
    """Train ``steps`` steps on ``capture`` with ``data.cache: mode``, no hooks or writers; what it cost."""
    from gsrecon.config import parse_structured
    from gsrecon.engine.trainer import DefaultTrainer

    cfg = {
        "exp_dir": str(exp_dir),
        "device": "cpu",
        "num_threads": threads,
        "max_steps": steps,
        "val_interval": steps + 1,
        "data": {"dataset": "blender", "path": str(capture), "cache": mode, "eval_split": "none"},
        "model": {"init": "random", "init_num_points": POINTS, "sh_degree": 0},
        "renderer": {"name": "torch"},
        "metrics": {"lpips_net": "none"},
        "writers": [],
        "hooks": {},
    }
    imported = _rss_mib()
    start = time.perf_counter()
    trainer = DefaultTrainer(parse_structured(DefaultTrainer.Config, cfg), overwrite=True)
    loaded, loaded_rss = time.perf_counter(), _rss_mib()
    trainer.train()
    end = time.perf_counter()
    decoder = trainer.datapipeline.decoder
    return {
        "rss_mib": [imported, loaded_rss, _rss_mib()],
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB -> MiB
        "load_s": loaded - start,
        "ms_per_step": 1000 * (end - loaded) / steps,
        "peak_decoded": decoder.peak_alive if decoder is not None else trainer.datapipeline.num_train,
    }


def _rss_mib() -> float:
    """This process's resident memory now, MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024  # KiB -> MiB
    raise RuntimeError("/proc/self/status has no VmRSS line (this benchmark reads Linux's /proc)")


def _run_self(*argv: str) -> str:
    """This script's stdout, run with ``argv`` in a new process."""
    return subprocess.run([sys.executable, __file__, *argv], check=True, capture_output=True, text=True).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", default="100,300", help="capture sizes, comma-separated")
    parser.add_argument("--size", default="768x576", help="image size WxH (a multiple of 4 each)")
    parser.add_argument("--modes", default="cpu,disk")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path("/tmp/gsrecon_bench_cache"))
    parser.add_argument("--make-capture", nargs=2, metavar=("DIR", "FRAMES"), help=argparse.SUPPRESS)
    parser.add_argument("--train", nargs=2, metavar=("CAPTURE", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    if args.make_capture:
        write_capture(Path(args.make_capture[0]), int(args.make_capture[1]), size)
        return
    if args.train:
        capture, mode = args.train
        print(json.dumps(train(Path(capture), mode, args.steps, args.threads, args.work / f"run_{mode}")))
        return
    rows = []
    for frames in (int(v) for v in args.frames.split(",")):
        root = args.work / f"capture_{frames}_{args.size}"
        if not (root / "scene" / "transforms.json").is_file():
            _run_self("--make-capture", str(root), str(frames), "--size", args.size)
        for mode in args.modes.split(","):
            output = _run_self(
                "--train", str(root / "scene"), mode, "--steps", str(args.steps), "--threads", str(args.threads),
                "--work", str(args.work),
            )  # fmt: skip
            result = json.loads(output.strip().splitlines()[-1])  # after the trainer's log lines
            rows.append({"frames": frames, "mode": mode, "load1": os.getloadavg()[0], **result})
            print(rows[-1], file=sys.stderr)
    print(
        "| frames | decoded images (MiB) | data.cache | RSS (MiB): imports / loaded / trained | peak RSS (MiB) "
        "| load (s) | ms/step | decoded alive | load1 |"
    )
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        decoded = r["frames"] * size[0] * size[1] * 3 / 2**20
        print(
            f"| {r['frames']} | {decoded:.0f} | {r['mode']} | {' / '.join(f'{v:.0f}' for v in r['rss_mib'])} | "
            f"{r['peak_rss_mib']:.0f} | {r['load_s']:.1f} | {r['ms_per_step']:.0f} | {r['peak_decoded']} | "
            f"{r['load1']:.2f} |"
        )
    machine = platform.processor() or platform.machine()
    print(f"\n{args.size} PNG, {args.steps} steps, torch renderer, {machine}, {args.threads} torch threads")


if __name__ == "__main__":
    main()
