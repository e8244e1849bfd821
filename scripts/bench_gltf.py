"""glTF KHR_gaussian_splatting against the reference PLY (CPU): bytes, CPU seconds and peak RSS of writing and reading.

    python scripts/bench_gltf.py               # 1M Gaussians, SH degree 3
    python scripts/bench_gltf.py --n 200000    # quicker

Writes a random N-Gaussian PLY, then in its own subprocess each: ``gsrecon export --ply`` of it as ``ply``, ``glb``
and ``glb`` without the exact attributes (``glb.exact=false``), and the reading of each file
(`gsrecon.model.scene_file.load_gaussians`). CPU seconds (user + system) and peak RSS come from ``os.wait4``.
Prints a markdown table with the machine, torch version and load average.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_memory import random_params

from gsrecon.model.ply import save_ply
from gsrecon.sh import num_sh_bases

ROOT = Path(__file__).resolve().parents[1]
FILES = {"ply": ("ply", []), "glb": ("glb", []), "glb, glb.exact=false": ("glb", ["glb.exact=false"])}


def measure(cmd: list[str]) -> tuple[float, float]:
    """Run ``cmd`` (it must succeed); return its CPU seconds (user + system) and peak RSS in GB."""
    # A preexec_fn makes Popen fork, not vfork: a vforked child's ru_maxrss starts at this process's own peak.
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, preexec_fn=os.getpid)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(cmd)} failed")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024 / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000, help="number of Gaussians")
    parser.add_argument("--sh-degree", type=int, default=3)
    parser.add_argument("--read-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read_child:
        from gsrecon.model.scene_file import load_gaussians

        torch.set_num_threads(1)
        load_gaussians(args.read_child)
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "source.ply"
        save_ply(source, random_params(args.n, args.sh_degree))
        config = ["--config", "configs/synthetic.yaml"]
        gsrecon = [sys.executable, "-m", "gsrecon", "export", "--ply", str(source), *config]
        for name, (fmt, options) in FILES.items():
            out = Path(tmp) / f"file_{len(rows)}.{fmt}"
            write = measure([*gsrecon, "--format", fmt, "--out", str(out), *options])
            read = measure([sys.executable, __file__, "--read-child", str(out)])
            rows.append((name, out.stat().st_size, write, read))
            print(f"{name}: {rows[-1]}", file=sys.stderr, flush=True)
    params_gb = args.n * (3 + 3 + 4 + 1 + 3 * num_sh_bases(args.sh_degree)) * 4 / 1e9
    print(f"\n{args.n:,} Gaussians, SH {args.sh_degree} ({params_gb:.2f} GB of float32 parameters); "
          f"{platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread, "
          f"load average {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d')}\n")  # fmt: skip
    print("| file | bytes per Gaussian | write CPU s | write peak RSS GB | read CPU s | read peak RSS GB |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, size, (write_s, write_gb), (read_s, read_gb) in rows:
        print(f"| {name} | {size / args.n:.1f} | {write_s:.2f} | {write_gb:.2f} | {read_s:.2f} | {read_gb:.2f} |")


if __name__ == "__main__":
    main()
