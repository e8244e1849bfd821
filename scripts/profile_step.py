"""Where a training step's time goes, and where the host waits for the GPU: torch.profiler over a few steps.

    python scripts/profile_step.py --config configs/statuette.yaml --device cuda data.path=/data/statuette_colmap
    python scripts/profile_step.py --config configs/synthetic.yaml --device cpu --warmup 100 --steps 10

Trains ``--warmup`` steps with the run's hooks, then profiles the next ``--steps`` (no validation falls
inside them). Prints the operators with the most self time on the device and on the host and, on a
GPU, every wait of the host for the GPU (``.item()`` / ``float(tensor)``, a copy to the CPU, a boolean
mask index or ``nonzero``) with the gsrecon line behind it (and the library line, if another) and how
many times per step. ``--trace`` writes a Chrome trace (open in chrome://tracing or Perfetto).
"""

from __future__ import annotations

import argparse
import tempfile
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from gsrecon.engine.resolve import load_run_config
from gsrecon.engine.trainer import DefaultTrainer
from gsrecon.hooks import Hook
from gsrecon.registry import HOOK_REGISTRY


@HOOK_REGISTRY.register()
class ProfileWindowHook(Hook):
    """Profiles the training steps after the first ``warmup`` ones, ``steps`` of them."""

    priority = 5  # before every other hook, so their work inside the window is profiled too

    def __init__(self, warmup: int, steps: int) -> None:
        self.warmup, self.steps, self.seen = warmup, steps, 0
        self.profiler: profile | None = None
        self.syncs = SyncRecorder()

    def before_train_iter(self, trainer: DefaultTrainer) -> None:
        if self.seen == self.warmup:
            cuda = trainer.device.type == "cuda"
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            self.profiler = profile(activities=activities)
            self.profiler.__enter__()
            if cuda:
                self.syncs.__enter__()

    def after_train_iter(self, trainer: DefaultTrainer) -> None:
        self.seen += 1
        if self.seen == self.warmup + self.steps:
            if trainer.device.type == "cuda":
                self.syncs.__exit__(None, None, None)
                torch.cuda.synchronize(trainer.device)
            self.profiler.__exit__(None, None, None)


class SyncRecorder:
    """Counts the host's waits for the GPU (``torch.cuda.set_sync_debug_mode``) by the code line that made them."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._catch = warnings.catch_warnings()

    def __enter__(self) -> SyncRecorder:
        self._catch.__enter__()
        self._show = warnings.showwarning
        warnings.simplefilter("always")
        warnings.showwarning = self._record
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc: object) -> None:
        torch.cuda.set_sync_debug_mode("default")
        self._catch.__exit__(*exc)

    def _record(self, message, category, filename, lineno, file=None, line=None) -> None:
        if "synchroniz" not in str(message):
            return self._show(message, category, filename, lineno, file, line)
        frames = [f for f in traceback.extract_stack()[:-1] if "warnings.py" not in f.filename]
        ours = [f for f in frames if "/gsrecon/" in f.filename and "profile_step" not in f.filename]
        where = [ours[-1], frames[-1]] if ours and ours[-1] is not frames[-1] else frames[-1:]
        self.counts[" <- ".join(f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in reversed(where))] += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--warmup", type=int, default=300, help="steps trained before the profiled ones")
    parser.add_argument("--steps", type=int, default=20, help="steps profiled")
    parser.add_argument("--rows", type=int, default=15, help="operators listed per table")
    parser.add_argument("--trace", type=Path, help="write a Chrome trace here")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = parser.parse_args()
    max_steps = args.warmup + args.steps
    overrides = [
        *args.overrides,
        f"exp_dir={tempfile.mkdtemp(prefix='gsrecon_profile_')}",
        f"device={args.device}",
        f"max_steps={max_steps}",
        f"val_interval={max_steps + 1}",
        "writers=[]",
    ]
    cfg, source = load_run_config(args.config, overrides)
    outputs = ("CheckPointHook", "ExportHook", "MetricsHook", "ViewerHook")  # files and servers: not per-step work
    cfg.hooks = {key: hook for key, hook in cfg.hooks.items() if key not in outputs}
    cfg.hooks["ProfileWindowHook"] = {"warmup": args.warmup, "steps": args.steps}
    trainer = DefaultTrainer(cfg, source=source)
    window: ProfileWindowHook = trainer.hooks["ProfileWindowHook"]
    trainer.train()

    averages = window.profiler.key_averages()
    device_key = "self_device_time_total" if trainer.device.type == "cuda" else "self_cpu_time_total"
    print(f"# {args.config}: steps {args.warmup + 1}..{max_steps} on {trainer.device}, "
          f"{trainer.model.num_gaussians} Gaussians, torch {torch.__version__}")  # fmt: skip
    print(averages.table(sort_by=device_key, row_limit=args.rows))
    if trainer.device.type == "cuda":
        print(averages.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    if trainer.device.type == "cuda":
        print(f"\nHost waits for the GPU per step ({args.steps} steps profiled), by where they happen:")
        for where, count in window.syncs.counts.most_common():
            print(f"  {count / args.steps:6.2f}  {where}")
        if not window.syncs.counts:
            print("  none")
    if args.trace:
        window.profiler.export_chrome_trace(str(args.trace))


if __name__ == "__main__":
    main()
