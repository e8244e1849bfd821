"""A suite's results folder: results.md and results.csv (ours and the peers beside the published numbers, each with
its source) and psnr_time.png (validation PSNR against training seconds)."""

from __future__ import annotations

import csv
import io
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from gsrecon.atomic import atomic_path
from gsrecon.bench.protocol import Reference
from gsrecon.bench.request import SuiteRun

RESULT_FILES = ("results.md", "results.csv", "psnr_time.png")
# (key of a run's record, heading): ours and the peers
RUN_COLUMNS = (
    ("scene", "scene"), ("trainer", "trainer"), ("steps", "steps"), ("psnr", "PSNR"), ("ssim", "SSIM"),
    ("lpips", "LPIPS alex"), ("ssim_torchmetrics", "SSIM tm"), ("lpips_alex_torchmetrics", "LPIPS alex tm"),
    ("lpips_vgg", "LPIPS vgg"), ("train_s", "train s"), ("wall_s", "wall s"), ("cpu_s", "CPU s"),
    ("gaussians", "Gaussians"), ("peak_gpu_gib", "peak GPU GiB"), ("peak_rss_gib", "peak RSS GiB"),
    ("threads", "threads"), ("load_before", "load before"), ("load_after", "load after"),
)  # fmt: skip
REFERENCE_COLUMNS = (
    ("scene", "scene"), ("method", "method"), ("steps", "steps"), ("psnr", "PSNR"), ("ssim", "SSIM"),
    ("lpips", "LPIPS"), ("lpips_net", "LPIPS net"), ("train_s", "train s"), ("memory_gb", "memory GB"),
    ("gaussians", "Gaussians"), ("hardware", "hardware"), ("source", "source"),
)  # fmt: skip
MEAN_KEYS = ("psnr", "ssim", "lpips", "ssim_torchmetrics", "lpips_alex_torchmetrics", "lpips_vgg", "train_s",
             "wall_s", "cpu_s", "gaussians", "peak_gpu_gib")  # fmt: skip


def run_rows(records: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per scene and trainer, then (over two or more scenes) each trainer's mean over the scenes."""
    rows = [{"scene": scene, **record} for scene, runs in records.items() for record in runs]
    if len(records) < 2:
        return rows
    for trainer in dict.fromkeys(row["trainer"] for row in rows):
        mine = [row for row in rows if row["trainer"] == trainer]
        mean: dict[str, Any] = {"scene": f"mean of {len(mine)}", "trainer": trainer, "steps": mine[0]["steps"]}
        for key in MEAN_KEYS:
            values = [row.get(key) for row in mine]
            mean[key] = statistics.fmean(values) if values and None not in values else None
        rows.append(mean)
    return rows


def reference_rows(references: Sequence[Reference], scenes: Sequence[str]) -> list[dict[str, Any]]:
    """The published results of ``scenes``, and the published means (their scenes named)."""
    rows = []
    for ref in references:
        if ref.scene is not None and ref.scene not in scenes:
            continue
        row = {key: getattr(ref, key, None) for key, _ in REFERENCE_COLUMNS}
        row["scene"] = ref.scene or f"mean of {', '.join(ref.scenes) or 'all'}"
        rows.append(row)
    return rows


def cell(value: object) -> str:
    """A table cell: numbers to a useful precision, missing as '-'."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value >= 10_000:
            return f"{value:.0f}"
        return f"{value:.4f}" if abs(value) < 10 else f"{value:.2f}"
    return str(value)


def markdown_table(rows: list[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> list[str]:
    return [
        "| " + " | ".join(heading for _, heading in columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(cell(row.get(key)) for key, _ in columns) + " |" for row in rows),
    ]


def write_results(run: SuiteRun, records: dict[str, list[dict[str, Any]]]) -> list[Path]:
    """Write results.md, results.csv and psnr_time.png into ``run.out``; their paths."""
    suite = run.suite
    ours, published = run_rows(records), reference_rows(suite.references, list(records))
    notes = sorted({note for runs in records.values() for record in runs for note in record.get("notes", [])})
    command = " ".join(["gsrecon", *sys.argv[1:]]) if sys.argv[1:2] == ["bench"] else None
    lines = [
        f"# {suite.name}: {len(records)} scene(s), {run.steps} steps",
        "",
        f"Protocol: {suite.layout} scenes, data.eval_split={suite.eval_split}, background {suite.background}, "
        f"{run.schedule} schedule, {run.strategy} strategy; config {run.config}. {suite.metrics_note}. Ours: PSNR / "
        "SSIM / LPIPS alex are gsrecon's own (float renders); 'tm' columns are torchmetrics as gsplat's "
        "simple_trainer.py computes them and 'LPIPS vgg' the 3DGS paper's, both from the 8-bit renders.",
        "",
        "## gsrecon and the peers",
        "",
        *markdown_table(ours, RUN_COLUMNS),
        "",
        "## Published",
        "",
        *markdown_table(published, REFERENCE_COLUMNS),
        "",
        *(["## Notes", "", *(f"- {note}" for note in notes), ""] if notes else []),
        *(["## Not included", "", *(f"- {item}" for item in suite.missing), ""] if suite.missing else []),
        *(["```", command, "```", ""] if command else []),
    ]
    out = run.out
    _write_text(out / "results.md", "\n".join(lines))
    _write_text(out / "results.csv", _csv(ours, published))
    with atomic_path(out / "psnr_time.png") as tmp:
        plot_curves(_curves(records), f"{suite.name}, {run.steps} steps").save(tmp, format="PNG")
    return [out / name for name in RESULT_FILES]


def _csv(ours: list[dict[str, Any]], published: list[dict[str, Any]]) -> str:
    """One table: ours and the peers (kind "run") and the published results (kind "published")."""
    keys = list(dict.fromkeys(["kind", *(k for k, _ in RUN_COLUMNS), *(k for k, _ in REFERENCE_COLUMNS)]))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=keys, extrasaction="ignore")
    writer.writeheader()
    for kind, rows in (("run", ours), ("published", published)):
        for row in rows:
            writer.writerow({key: "" if row.get(key) is None else row.get(key) for key in keys} | {"kind": kind})
    return text.getvalue()


def _write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def _curves(records: dict[str, list[dict[str, Any]]]) -> dict[str, list[tuple[float, float]]]:
    return {f"{scene} {r['trainer']}": r["curve"] for scene, runs in records.items() for r in runs if r.get("curve")}


COLOURS = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207))  # fmt: skip


def plot_curves(curves: dict[str, list[tuple[float, float]]], title: str, size: tuple[int, int] = (720, 440)):
    """A line plot (PIL image) of each curve's (seconds, PSNR) points, axes labelled, a legend per curve."""
    width, height = size
    left, right, top, bottom = 60, 190, 30, 40
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    points = [p for curve in curves.values() for p in curve]
    x_max = max((x for x, _ in points), default=1.0) or 1.0
    y_min, y_max = min((y for _, y in points), default=0.0), max((y for _, y in points), default=1.0)
    y_min, y_max = (y_min - 0.5, y_max + 0.5) if y_max - y_min < 1.0 else (y_min, y_max)

    def at(x: float, y: float) -> tuple[float, float]:
        return (left + x / x_max * (width - left - right),
                height - bottom - (y - y_min) / (y_max - y_min) * (height - top - bottom))  # fmt: skip

    draw.rectangle([left, top, width - right, height - bottom], outline="black")
    for i in range(5):
        x, y = x_max * i / 4, y_min + (y_max - y_min) * i / 4
        px, _ = at(x, y_min)
        _, py = at(0, y)
        draw.text((px - 10, height - bottom + 5), f"{x:.0f}", fill="black")
        draw.text((5, py - 6), f"{y:.1f}", fill="black")
    draw.text((left, 8), f"{title}: test PSNR (dB) against training seconds", fill="black")
    for index, (name, curve) in enumerate(curves.items()):
        colour = COLOURS[index % len(COLOURS)]
        xy = [at(x, y) for x, y in curve]
        if len(xy) > 1:
            draw.line(xy, fill=colour, width=2)
        for px, py in xy:
            draw.ellipse([px - 3, py - 3, px + 3, py + 3], fill=colour)
        draw.text((width - right + 10, top + 14 * index), name, fill=colour)
    return image
