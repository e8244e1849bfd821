"""Training benchmark: time per step, peak memory, number of Gaussians and validation PSNR at chosen steps.

    python scripts/bench_train.py --config configs/garden.yaml --device cuda data.path=/data/garden
    python scripts/bench_train.py --config configs/synthetic.yaml --device cpu --at 500,1000,2000

Prints a markdown table (one row per step in --at) with the machine, torch version and threads.
"""

from __future__ import annotations

import argparse
import platform
import resource
import tempfile
import time

import torch

from gsrecon.engine.resolve import load_run_config
from gsrecon.engine.trainer import DefaultTrainer
from gsrecon.hooks import Hook
from gsrecon.registry import HOOK_REGISTRY


@HOOK_REGISTRY.register()
class BenchRecorderHook(Hook):
    """Validates at the chosen steps and records speed, memory, size and quality."""

    def __init__(self, at: list[int]) -> None:
        self.at = sorted(at)
        self.rows: list[dict] = []
        self._start = 0.0
        self._last_step = 0
        self._train_time = 0.0

    def before_train_iter(self, trainer) -> None:
        self._start = time.perf_counter()

    def after_train_iter(self, trainer) -> None:
        if trainer.device.type == "cuda":
            torch.cuda.synchronize(trainer.device)
        self._train_time += time.perf_counter() - self._start
        if trainer.step in self.at:
            steps = trainer.step - self._last_step
            row = {
                "step": trainer.step,
                "ms_per_step": 1000 * self._train_time / steps,
                "num_gaussians": trainer.model.num_gaussians,
                "peak_mem_gb": _peak_memory_gb(trainer.device),
            }
            row.update(trainer.validation())
            self.rows.append(row)
            self._last_step, self._train_time = trainer.step, 0.0


def _peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB (process peak RSS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--at", default="1000,7000,15000,30000", help="steps to report (the last is max_steps)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    at = [int(s) for s in args.at.split(",")]
    exp_dir = tempfile.mkdtemp(prefix="gsrecon_bench_")
    overrides = [
        *args.overrides,
        f"exp_dir={exp_dir}",
        f"device={args.device}",
        f"max_steps={max(at)}",
        f"val_interval={max(at) + 1}",
        "writers=[]",
    ]
    cfg, source = load_run_config(args.config, overrides)
    cfg.hooks = {"BenchRecorderHook": {"at": at}}  # only the recorder: no checkpoints or logs in the timings
    trainer = DefaultTrainer(cfg, source)
    trainer.train()
    recorder = trainer.hooks["BenchRecorderHook"]
    on_gpu = trainer.device.type == "cuda"
    device = torch.cuda.get_device_name(trainer.device) if on_gpu else platform.processor() or platform.machine()
    print(
        f"\n{args.config} {' '.join(args.overrides)} | device {trainer.device} ({device}) | "
        f"torch {torch.__version__} | threads {torch.get_num_threads()} | "
        f"renderer {trainer.resolved_config['renderer']['name']} | "
        f"strategy {trainer.resolved_config['strategy']['name']}\n"
    )
    print("| step | ms/step | Gaussians | peak memory GiB | PSNR | SSIM | LPIPS |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in recorder.rows:
        lpips = "-" if r.get("lpips") is None else f"{r['lpips']:.3f}"
        print(
            f"| {r['step']} | {r['ms_per_step']:.1f} | {r['num_gaussians']} | {r['peak_mem_gb']:.2f} | "
            f"{r['psnr']:.2f} | {r['ssim']:.3f} | {lpips} |"
        )


if __name__ == "__main__":
    main()
