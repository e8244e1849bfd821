"""Memory benchmark at millions of Gaussians (CPU): peak RSS and wall time of train, resume, export, eval, render.

    python scripts/bench_memory.py                       # 3M Gaussians, SH degree 3
    python scripts/bench_memory.py --n 300000 --steps 2  # quicker

Writes a random N-Gaussian reference-layout PLY, trains K steps at 64x48 on the built-in synthetic
scene starting from it (``model.init=ply``), then resumes for one more step, exports every format,
evaluates and renders at 1280x720. Each runs in its own subprocess, whose peak RSS comes from
``os.wait4``. Prints a markdown table with the machine, torch version, threads and load average.
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

import numpy as np
import torch

from gsrecon.cameras import Cameras
from gsrecon.heap import unmap_large_blocks
from gsrecon.model.ply import save_ply
from gsrecon.sh import num_sh_bases

ROOT = Path(__file__).resolve().parents[1]
FORMATS = {"ply": "ply", "splat": "splat", "compressed_ply": "compressed.ply", "spz": "spz", "sog": "sog"}


def random_params(n: int, sh_degree: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random float32 Gaussians in a box in front of the synthetic scene's cameras."""
    rng = np.random.default_rng(seed)
    k = num_sh_bases(sh_degree) - 1

    def rand(*shape: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32) * scale + shift)

    return {
        "means": rand(n, 3),  # [N, 3]
        "scales": rand(n, 3, scale=0.3, shift=-4.5),  # [N, 3] log scales
        "quats": rand(n, 4),  # [N, 4]
        "opacities": rand(n, scale=2.0),  # [N] logits
        "sh0": rand(n, 1, 3, scale=0.5),  # [N, 1, 3]
        "shN": rand(n, k, 3, scale=0.05),  # [N, K, 3]
    }


def measure(cmd: list[str]) -> tuple[float, float, int, str]:
    """Run ``cmd``; return its wall seconds, peak RSS in GB, exit status and stdout's last line."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        # A preexec_fn makes Popen fork, not vfork: a vforked child's ru_maxrss starts at this process's own peak.
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, preexec_fn=os.getpid)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        if proc.returncode:
            err.seek(0)
            sys.stderr.write(err.read().decode(errors="replace")[-2000:])
        out.seek(0)
        lines = out.read().decode(errors="replace").strip().splitlines()
    return wall, usage.ru_maxrss * 1024 / 1e9, proc.returncode, lines[-1] if lines else ""


def _has_sog() -> bool:
    """Whether ``gsrecon export`` knows the sog format (added separately)."""
    from gsrecon.registry import EXPORT_REGISTRY

    return "sog" in EXPORT_REGISTRY


def render_child(checkpoint: str, views: int) -> None:
    """Render ``views`` 1280x720 frames of a checkpoint's Gaussians with the torch renderer; print views/s."""
    from gsrecon.engine.checkpoints import load_checkpoint_file
    from gsrecon.render.torch_renderer import TorchRenderer

    torch.set_num_threads(1)
    params = load_checkpoint_file(checkpoint)["params"]
    width, height, focal = 1280, 720, 1000.0
    Ks = torch.tensor([[[focal, 0.0, width / 2], [0.0, focal, height / 2], [0.0, 0.0, 1.0]]])
    renderer = TorchRenderer()
    start = time.perf_counter()
    with torch.no_grad():
        for i in range(views):
            viewmat = torch.eye(4)[None]
            viewmat[0, 0, 3], viewmat[0, 2, 3] = 0.1 * i, 4.0  # the cloud ~4 units ahead
            renderer.render(params, Cameras(viewmat, Ks, width, height), 3, torch.zeros(1, 3))
    print(f"{views / (time.perf_counter() - start):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=3_000_000, help="number of Gaussians")
    parser.add_argument("--sh-degree", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="training steps before the checkpoint")
    parser.add_argument("--views", type=int, default=3, help="1280x720 views rendered")
    parser.add_argument("--workdir", help="folder for the PLY, run and exports (default: a temporary one)")
    parser.add_argument("--render-child", nargs=2, metavar=("CHECKPOINT", "VIEWS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.render_child:
        unmap_large_blocks()  # as every gsrecon command does
        render_child(args.render_child[0], int(args.render_child[1]))
        return

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        ply = work / "init.ply"
        save_ply(ply, random_params(args.n, args.sh_degree))
        exp = work / "run"
        ckpt = exp / "checkpoints" / "last.pt"
        gsrecon = [sys.executable, "-m", "gsrecon"]
        common = [
            "device=cpu", "num_threads=1", "renderer.name=torch", "val_interval=1000000",
            "data.synthetic.width=64", "data.synthetic.height=48", "metrics.lpips_net=none",
            f"model.sh_degree={args.sh_degree}", "model.init=ply", f"model.init_path={ply}",
            "writers=[]", f"hooks.CheckPointHook.interval={args.steps}",
        ]  # fmt: skip

        def train(exp_dir: Path, *extra: str) -> list[str]:
            return [*gsrecon, "train", "--config", "configs/synthetic.yaml", f"exp_dir={exp_dir}", *common, *extra]

        rows: list[tuple[str, float, float, int]] = []

        def run(name: str, cmd: list[str]) -> tuple[float, str]:
            wall, peak, code, last = measure(cmd)
            rows.append((name, wall, peak, code))
            print(f"{name}: {wall:.1f} s, {peak:.2f} GB, exit {code}", file=sys.stderr, flush=True)
            return wall, last

        run(f"train {args.steps} step(s)", train(exp, f"max_steps={args.steps}", "--overwrite"))
        fresh_one = rows[-1][1]
        if args.steps > 1:
            fresh_one, _ = run("train 1 step", train(work / "one", "max_steps=1", "--overwrite"))
        resume_one, _ = run("resume + 1 step", train(exp, f"max_steps={args.steps + 1}", "--resume"))
        exported = [fmt for fmt in FORMATS if fmt != "sog" or _has_sog()]
        for fmt in exported:
            cmd = [*gsrecon, "export", "--checkpoint", str(ckpt), "--device", "cpu", "--format", fmt]
            run(f"export {fmt}", [*cmd, "--out", str(work / f"export.{FORMATS[fmt]}")])
        run("eval", [*gsrecon, "eval", "--exp-dir", str(exp), "--device", "cpu", "--out", str(work / "eval")])
        render = [sys.executable, __file__, "--render-child", str(ckpt), str(args.views)]
        _, views_per_s = run(f"render {args.views} views at 1280x720", render)
        rows[-1] = (f"{rows[-1][0]} ({views_per_s} views/s)", *rows[-1][1:])

    params_gb = args.n * (3 + 3 + 4 + 1 + 3 * num_sh_bases(args.sh_degree)) * 4 / 1e9
    print(f"\n{args.n:,} Gaussians, SH {args.sh_degree} ({params_gb:.2f} GB of float32 parameters); "
          f"{platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread, "
          f"load average {os.getloadavg()[0]:.2f}\n")  # fmt: skip
    print(f"resume's time to its first step: {resume_one / fresh_one:.2f}x a fresh start's\n")
    print("| what | wall s | peak RSS GB | exit |\n|---|---:|---:|---:|")
    for name, wall, peak, code in rows:
        print(f"| {name} | {wall:.1f} | {peak:.2f} | {code} |")


if __name__ == "__main__":
    main()
