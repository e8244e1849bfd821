"""Time to quality: held-out PSNR / SSIM / LPIPS against training steps and training seconds.

    taskset -c 1 python scripts/bench_quality.py --config configs/statuette.yaml --out /tmp/bq_statuette \\
        --threads 1 --clock cpu --image DSC_5291 data.path=../shared/data/statuette_colmap
    python scripts/bench_quality.py --config configs/synthetic.yaml --out /tmp/bq_synthetic \\
        --steps 250,500,1000,2000,3000 --seconds 10,20,30,60,90

Trains to the last of ``--steps`` with only a recorder hook (no logs, checkpoints or exports) and
validates on the test views when training passes each step mark and each training-clock mark
(``--clock wall``, or ``cpu``: the process's CPU time, which other work on the machine inflates
less). The training clocks exclude validation. Each row gives the mean ms/step since the previous
row (wall and CPU), the number of Gaussians, the process's peak RSS and the 1-minute load average;
with ``--image`` also the PSNR / SSIM / LPIPS of that one test view (and its ground truth is saved as
``<out>/<image>_gt.png``, to score another trainer's renders of the same pixels).

Prints a markdown table and writes ``<out>/marks.csv`` and ``<out>/psnr_vs_time.png`` (drawn with PIL:
matplotlib is not a dependency). ``--peer LABEL=CSV`` adds another trainer's curve to the plot
(CSV columns ``seconds,psnr``, seconds on the same clock).
"""

from __future__ import annotations

import argparse
import csv
import math
import platform
import resource
import time
from pathlib import Path

import torch
from PIL import Image, ImageDraw

from gsrecon.config import entry_map
from gsrecon.data.formats.images import write_png
from gsrecon.engine.resolve import DEFAULT_HOOKS, load_run_config
from gsrecon.engine.trainer import DefaultTrainer
from gsrecon.hooks import Hook
from gsrecon.registry import HOOK_REGISTRY

# (marks.csv column, markdown table heading)
COLUMN_HEADINGS = (
    ("mark", "mark"), ("step", "step"), ("seconds", "train s"), ("cpu_seconds", "CPU s"), ("ms_per_step", "ms/step"),
    ("cpu_ms_per_step", "CPU ms/step"), ("gaussians", "Gaussians"), ("peak_rss_gib", "peak RSS GiB"),
    ("peak_gpu_gib", "peak GPU GiB"), ("psnr", "PSNR"), ("ssim", "SSIM"), ("lpips", "LPIPS"),
    ("image_psnr", "image PSNR"), ("image_ssim", "image SSIM"), ("image_lpips", "image LPIPS"), ("load1", "load"),
)  # fmt: skip
COLUMNS = tuple(column for column, _ in COLUMN_HEADINGS)


@HOOK_REGISTRY.register()
class QualityRecorderHook(Hook):
    """Validates at step marks and training-clock marks; time spent validating is not counted as training.

    Two training clocks run side by side: wall time and the process's CPU time (which a busy machine
    inflates less); ``clock`` says which one the ``seconds`` marks are read on.
    """

    def __init__(
        self, steps: list[int], seconds: list[float], clock: str = "wall", image: str = "", image_gt: str = ""
    ) -> None:
        if clock not in ("wall", "cpu"):
            raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
        self.steps, self.seconds, self.clock = sorted(steps), sorted(seconds), clock
        self.image, self.image_gt = image, image_gt  # a test view to score alone; where to save its ground truth
        self.rows: list[dict] = []
        self._start = (0.0, 0.0)
        self._train = [0.0, 0.0]  # training seconds so far: wall, CPU
        self._last = (0, 0.0, 0.0)  # step, wall and CPU seconds of the previous row

    def before_train(self, trainer: DefaultTrainer) -> None:
        test_views = [frame.name for frame in trainer.datapipeline.scene.test]
        if self.image and self.image not in test_views:
            raise ValueError(f"--image {self.image} is not a test view; the test views are {', '.join(test_views)}")

    def before_train_iter(self, trainer: DefaultTrainer) -> None:
        self._start = (time.perf_counter(), time.process_time())

    def after_train_iter(self, trainer: DefaultTrainer) -> None:
        if trainer.device.type == "cuda":
            torch.cuda.synchronize(trainer.device)
        self._train[0] += time.perf_counter() - self._start[0]
        self._train[1] += time.process_time() - self._start[1]
        clock = self._train[0 if self.clock == "wall" else 1]
        labels = [f"step {trainer.step}"] if trainer.step in self.steps else []
        while self.seconds and clock >= self.seconds[0]:
            labels.append(f"{self.seconds.pop(0):g} s")
        if labels:
            self.rows.append(self._row(trainer, " / ".join(labels)))

    def _row(self, trainer: DefaultTrainer, mark: str) -> dict:
        (wall, cpu), (last_step, last_wall, last_cpu) = self._train, self._last
        steps = max(trainer.step - last_step, 1)
        self._last = (trainer.step, wall, cpu)
        row = {
            "mark": mark,
            "step": trainer.step,
            "seconds": wall,
            "cpu_seconds": cpu,
            "ms_per_step": 1000 * (wall - last_wall) / steps,
            "cpu_ms_per_step": 1000 * (cpu - last_cpu) / steps,
            "gaussians": trainer.model.num_gaussians,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # KiB -> GiB
            "peak_gpu_gib": torch.cuda.max_memory_allocated(trainer.device) / 2**30
            if trainer.device.type == "cuda"
            else None,
            "load1": load_average()[0],
        }
        row.update(trainer.validation())
        view = next((v for v in trainer.val_results if v["name"] == self.image), {})
        row.update({f"image_{metric}": view.get(metric) for metric in ("psnr", "ssim", "lpips")})
        return row

    def after_val_iter(self, trainer: DefaultTrainer, index: int, outputs: dict) -> None:
        if outputs["name"] == self.image and self.image_gt and not Path(self.image_gt).exists():
            write_png(self.image_gt, outputs["gt"])


def _peak_gpu_gib(device: torch.device) -> float | None:
    """Peak memory torch has allocated on a CUDA device so far (None on the CPU)."""
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def load_average() -> tuple[float, float, float]:
    """The 1, 5 and 15-minute load averages (other work on the machine slows CPU timings)."""
    with open("/proc/loadavg") as f:
        one, five, fifteen = (float(v) for v in f.read().split()[:3])
    return one, five, fifteen


def _floats(text: str) -> list[float]:
    return [float(s) for s in text.split(",") if s]


def run(config: str, overrides: list[str], recorder: dict, threads: int, out: Path) -> DefaultTrainer:
    """Train in ``<out>/run`` with the recorder hook (``recorder``: its arguments) and the hooks the config adds to
    the default ones (a lever that is a hook), none of the default ones."""
    overrides = [
        *overrides,
        f"exp_dir={out / 'run'}",
        f"num_threads={threads}",
        f"max_steps={max(recorder['steps'])}",
        f"val_interval={max(recorder['steps']) + 1}",
        "writers=[]",
    ]
    cfg, source = load_run_config(config, overrides)
    added = {key: args for key, args in entry_map(cfg.hooks).items() if key not in DEFAULT_HOOKS}
    cfg.hooks = {**added, "QualityRecorderHook": recorder}  # no logs, checkpoints or exports in the timings
    trainer = DefaultTrainer(cfg, source, overwrite=True)
    trainer.train()
    return trainer


def _fmt(value: float | int | str | None, digits: int) -> str:
    if value is None:
        return "-"
    return value if isinstance(value, str) else f"{value:.{digits}f}"


def markdown_table(rows: list[dict]) -> str:
    lines = [
        "| " + " | ".join(heading for _, heading in COLUMN_HEADINGS) + " |",
        "|---|" + "---:|" * (len(COLUMNS) - 1),
    ]
    digits = {"step": 0, "gaussians": 0, "seconds": 1, "cpu_seconds": 1}
    digits |= {name: 3 for name in ("ssim", "lpips", "image_ssim", "image_lpips")}
    digits |= {"ms_per_step": 1, "cpu_ms_per_step": 1, "load1": 1}
    for r in rows:
        cells = [_fmt(r.get(c), digits.get(c, 2)) for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({c: r.get(c) for c in COLUMNS} for r in rows)


def read_peer(spec: str) -> tuple[str, list[tuple[float, float]]]:
    """``LABEL=CSV`` -> (label, [(seconds, psnr)]) from a CSV with columns ``seconds,psnr``."""
    label, path = spec.split("=", 1)
    with open(path, newline="") as f:
        return label, [(float(r["seconds"]), float(r["psnr"])) for r in csv.DictReader(f)]


PALETTE = ((31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14))


def nice_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi]."""
    if hi - lo < 1e-6:
        lo, hi = lo - 1.0, hi + 1.0
    raw = (hi - lo) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    return [first + i * step for i in range(math.ceil((hi - first) / step) + 1)]


def plot(
    curves: dict[str, list[tuple[float, float]]],
    title: str,
    path: Path,
    size: tuple[int, int] = (720, 440),
    lines: bool = True,
    x_label: str = "training seconds",
) -> None:
    """A plot of dB against training seconds with axes, ticks and a legend, drawn with PIL: a line per curve, or with
    ``lines`` False a dot per point (one run each)."""
    width, height = size
    left, right, top, bottom = 60, 20, 30, 45
    points = [p for curve in curves.values() for p in curve]
    x_ticks = nice_ticks(0.0, max(x for x, _ in points))
    y_ticks = nice_ticks(min(y for _, y in points), max(y for _, y in points))
    (x_lo, x_hi), (y_lo, y_hi) = (x_ticks[0], x_ticks[-1]), (y_ticks[0], y_ticks[-1])
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)

    def to_px(x: float, y: float) -> tuple[float, float]:
        return (
            left + (width - left - right) * (x - x_lo) / (x_hi - x_lo),
            height - bottom - (height - top - bottom) * (y - y_lo) / (y_hi - y_lo),
        )

    for x in x_ticks:
        px, py = to_px(x, y_lo)
        draw.line((px, py, px, py + 4), fill="black")
        draw.text((px - 8, py + 6), f"{x:g}", fill="black")
    for y in y_ticks:
        px, py = to_px(x_lo, y)
        draw.line((px - 4, py, width - right, py), fill=(225, 225, 225))
        draw.text((px - 34, py - 6), f"{y:g}", fill="black")
    draw.rectangle((left, top, width - right, height - bottom), outline="black")
    draw.text((width // 2 - 40, height - 18), x_label, fill="black")
    draw.text((6, top - 22), "dB", fill="black")
    draw.text((left, top - 22), title, fill="black")
    for i, (label, curve) in enumerate(curves.items()):
        color = PALETTE[i % len(PALETTE)]
        xy = [to_px(x, y) for x, y in sorted(curve)]
        if lines and len(xy) > 1:
            draw.line(xy, fill=color, width=2)
        r = 2 if lines else 4
        for px, py in xy if len(xy) <= 60 or not lines else ():  # dots only where they do not hide the line
            draw.ellipse((px - r, py - r, px + r, py + r), fill=color)
        legend_y = height - bottom - 16 * (len(curves) - i)
        draw.line((width - right - 300, legend_y + 6, width - right - 280, legend_y + 6), fill=color, width=3)
        draw.text((width - right - 274, legend_y), label, fill="black")
    image.save(path, optimize=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--steps", default="100,250,500,1000,1500,2000", help="step marks (the last is max_steps)")
    parser.add_argument("--seconds", default="5,10,20,30,45,60,90,120", help="training-clock marks in seconds")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="the clock --seconds reads")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (num_threads)")
    parser.add_argument("--image", default="", help="a test view's name: also report its own metrics")
    parser.add_argument("--peer", action="append", default=[], help="LABEL=CSV: another curve for the plot")
    parser.add_argument("--label", default="gsrecon", help="this run's label in the plot")
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    recorder = {
        "steps": [int(s) for s in _floats(args.steps)],
        "seconds": _floats(args.seconds),
        "clock": args.clock,
        "image": args.image,
        "image_gt": str(args.out / f"{args.image}_gt.png") if args.image else "",
    }
    trainer = run(args.config, args.overrides, recorder, args.threads, args.out)
    rows = trainer.hooks["QualityRecorderHook"].rows
    resolved = trainer.resolved_config
    load = " ".join(f"{v:.2f}" for v in load_average())
    print(
        f"\n{args.config} {' '.join(args.overrides)} | {platform.processor() or platform.machine()} | "
        f"torch {torch.__version__} | threads {torch.get_num_threads()} | load average at the end {load} | "
        f"renderer {resolved['renderer']['name']} | strategy {resolved['strategy']['name']}\n"
    )
    print(markdown_table(rows))
    write_csv(rows, args.out / "marks.csv")
    metric = "image_psnr" if args.image else "psnr"  # a peer's curve is usually of one held-out image
    seconds = "seconds" if args.clock == "wall" else "cpu_seconds"
    curves = {args.label: [(r[seconds], r[metric]) for r in rows]}
    curves.update(read_peer(spec) for spec in args.peer)
    what = f"PSNR of {args.image}" if args.image else "mean test PSNR"
    title = f"{Path(args.config).stem}: {what} vs training time ({args.clock} clock)"
    plot(curves, title, args.out / "psnr_vs_time.png")
    print(f"\nwrote {args.out / 'marks.csv'} and {args.out / 'psnr_vs_time.png'}")


if __name__ == "__main__":
    main()
