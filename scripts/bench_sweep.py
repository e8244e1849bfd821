"""A recipe across scenes, run lengths and seeds: final test PSNR / SSIM / LPIPS as mean ± spread.

    taskset -c 1 python scripts/bench_sweep.py --out /tmp/sweep --lengths 1000,2000,7000 --seeds 0,1,2 \\
        --scene "synthetic=configs/mipnerf360.yaml data.dataset=synthetic data.factor=1 model.init=random" \\
        --scene "statuette=configs/mipnerf360.yaml data.path=../shared/data/statuette_colmap data.factor=8" \\
        --variant "default=" --variant "no_reset=strategy.reset_every=1000000"

Each (scene, variant, length, seed) trains ``max_steps=length`` with ``seed`` through
``bench_quality.run`` (only a recorder hook: no logs, checkpoints or exports) and validates once at
the end. A row is appended to ``<out>/runs.csv`` as each run ends, with the commit it ran (and a digest of
uncommitted changes to gsrecon/, configs/ and scripts/) and its recipe (config and overrides); runs already there
are skipped, so an interrupted sweep continues where it stopped, but a row of another commit or recipe under the
same labels stops the sweep before it trains (exit 2: use another ``--out``). The summary table gives, per scene,
length and variant, the mean over seeds and the spread (half the range, max - min over 2), the
number of Gaussians and the CPU seconds of training.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import math
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quality import load_average, plot, run
from PIL import Image

FIELDS = (
    *("scene", "variant", "length", "seed", "psnr", "ssim", "lpips", "gaussians", "cpu_seconds", "load1"),
    "depth_abs_rel",  # empty where the test views have no depth maps
    "psnr_colour_fit",  # empty unless metrics.colour_fit=true (a variant or scene gives it)
    "commit",  # code_version() of the checkout that ran it
    "recipe",  # the config and overrides, scene's then variant's
)
TEXT_FIELDS = ("scene", "variant", "commit", "recipe")
REPO = Path(__file__).resolve().parents[1]
METRICS = ("psnr", "ssim", "lpips", "gaussians", "cpu_seconds", "depth_abs_rel", "psnr_colour_fit")


def parse_named(spec: str) -> tuple[str, list[str]]:
    """``LABEL=WORDS`` -> (label, shell-split words)."""
    label, sep, words = spec.partition("=")
    if not sep or not label:
        raise argparse.ArgumentTypeError(f"expected LABEL=..., got {spec!r}")
    return label, shlex.split(words)


def read_runs(path: Path) -> list[dict]:
    """The rows of ``runs.csv`` (numbers as floats, NaN where empty: LPIPS without its weights), or none."""
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return [
            {k: ((v or "") if k in TEXT_FIELDS else float(v or "nan")) for k, v in row.items()}
            for row in csv.DictReader(f)
        ]


def code_version() -> str:
    """The checkout's commit (short hash), with ``+`` and a digest of its uncommitted changes to gsrecon/, configs/
    and scripts/ where there are any; "unknown" outside a git checkout."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout

    try:
        commit = git("rev-parse", "--short", "HEAD").strip()
        changes = git("diff", "HEAD", "--", "gsrecon", "configs", "scripts")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit}+{hashlib.sha256(changes.encode()).hexdigest()[:8]}" if changes else commit


def stale_row(done: dict[tuple, dict], key: tuple, version: str, recipe: str) -> str | None:
    """Why the row ``done[key]`` is not this sweep's run of ``key`` (another commit or recipe), or None."""
    old = done[key]
    if (old.get("commit"), old.get("recipe")) == (version, recipe):
        return None
    scene, variant, length, seed = key
    ran = f"as {old.get('recipe') or 'an unrecorded recipe'} on {old.get('commit') or 'an unrecorded commit'}"
    return f"{scene} {variant} {length} steps seed {seed} ran {ran}, not as {recipe} on {version}"


def append_run(path: Path, row: dict) -> None:
    new = not path.is_file()
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            writer.writeheader()
        writer.writerow({k: row.get(k) for k in FIELDS})


def summarize(rows: list[dict]) -> list[dict]:
    """Per (scene, length, variant), in first-seen order: mean and spread (half the range) of each metric."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["scene"], int(row["length"]), row["variant"]), []).append(row)
    summary = []
    for (scene, length, variant), runs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        entry = {"scene": scene, "length": length, "variant": variant, "seeds": len(runs)}
        for metric in METRICS:
            values = [r[metric] for r in runs]
            entry[metric] = statistics.fmean(values)
            entry[f"{metric}_spread"] = (max(values) - min(values)) / 2
        entry["psnr_values"] = [r["psnr"] for r in runs]
        summary.append(entry)
    return summary


def _depth_cell(entry: dict) -> str:
    """The depth error as mean ± spread, a dash where the test views have no depth maps."""
    if math.isnan(entry["depth_abs_rel"]):
        return "—"
    return f"{entry['depth_abs_rel']:.4f} ± {entry['depth_abs_rel_spread']:.4f}"


def _fit_cell(entry: dict) -> str:
    """The PSNR after the colour fit as mean ± spread, a dash where it was not scored."""
    if math.isnan(entry["psnr_colour_fit"]):
        return "—"
    return f"{entry['psnr_colour_fit']:.2f} ± {entry['psnr_colour_fit_spread']:.2f}"


def markdown(summary: list[dict]) -> str:
    lines = [
        "| scene | steps | variant | seeds | PSNR (mean ± spread) | per seed | SSIM | LPIPS | Gaussians | CPU s "
        "| depth abs rel | PSNR after colour fit |",
        "|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for e in summary:
        per_seed = " / ".join(f"{v:.2f}" for v in e["psnr_values"])
        lines.append(
            f"| {e['scene']} | {e['length']} | {e['variant']} | {e['seeds']} "
            f"| {e['psnr']:.2f} ± {e['psnr_spread']:.2f} "
            f"| {per_seed} | {e['ssim']:.3f} | {e['lpips']:.3f} | {e['gaussians']:.0f} | {e['cpu_seconds']:.0f} "
            f"| {_depth_cell(e)} | {_fit_cell(e)} |"
        )
    return "\n".join(lines)


def panel_points(rows: list[dict]) -> dict[tuple[str, int], dict[str, list[tuple[float, float]]]]:
    """Per (scene, length): per variant, the (CPU seconds, PSNR) of its runs. Every panel lists every variant in the
    order the rows first give them (none where a panel has no run of it), so a variant keeps its colour throughout."""
    variants = list(dict.fromkeys(row["variant"] for row in rows))
    panels: dict[tuple[str, int], dict[str, list[tuple[float, float]]]] = {}
    for row in rows:
        curves = panels.setdefault((row["scene"], int(row["length"])), {variant: [] for variant in variants})
        curves[row["variant"]].append((row["cpu_seconds"], row["psnr"]))
    return panels


def plot_runs(rows: list[dict], out: Path) -> list[Path]:
    """PSNR against CPU seconds of training, a dot per run and a colour per variant: one plot per scene and length
    (``<out>/psnr_vs_cpu_<scene>_<length>.png``) and all of them on one sheet, a row per scene and a column per
    length (``<out>/psnr_vs_cpu.png``)."""
    panels = panel_points(rows)
    scenes = sorted({scene for scene, _ in panels})
    lengths = sorted({length for _, length in panels})
    size = (560, 380)
    sheet = Image.new("RGB", (size[0] * len(lengths), size[1] * len(scenes)), "white")
    paths = []
    for (scene, length), curves in panels.items():
        path = out / f"psnr_vs_cpu_{scene}_{length}.png"
        title = f"{scene}, {length} steps: test PSNR vs CPU s (a dot per seed)"
        plot(curves, title, path, size=size, lines=False, x_label="CPU seconds of training")
        sheet.paste(Image.open(path), (size[0] * lengths.index(length), size[1] * scenes.index(scene)))
        paths.append(path)
    sheet.save(out / "psnr_vs_cpu.png", optimize=True)
    return [*paths, out / "psnr_vs_cpu.png"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scene", action="append", type=parse_named, required=True, help="LABEL=CONFIG [k=v ...]")
    parser.add_argument("--variant", action="append", type=parse_named, default=[], help="LABEL=[k=v ...]")
    parser.add_argument("--lengths", default="1000,2000,7000", help="max_steps values")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (num_threads)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--plot", action="store_true", help="also draw PSNR against CPU seconds (psnr_vs_cpu*.png)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    variants = args.variant or [("default", [])]
    runs_csv = args.out / "runs.csv"
    if runs_csv.is_file() and tuple(next(csv.reader(runs_csv.open()), [])) != FIELDS:
        print(
            f"{runs_csv}: written by an older bench_sweep.py (no commit or recipe column): use another --out",
            file=sys.stderr,
        )
        sys.exit(2)
    done = {(r["scene"], r["variant"], int(r["length"]), int(r["seed"])): r for r in read_runs(runs_csv)}
    version = code_version()
    plan = [
        ((scene, variant, length, seed), config, words, shlex.join([config, *words]))
        for length in (int(v) for v in args.lengths.split(","))
        for scene, (config, *scene_overrides) in args.scene
        for variant, variant_overrides in variants
        for words in [[*scene_overrides, *variant_overrides]]
        for seed in (int(v) for v in args.seeds.split(","))
    ]
    for key, _, _, recipe in plan:
        if key in done and (why := stale_row(done, key, version, recipe)):
            print(f"{runs_csv}: {why}: use another --out", file=sys.stderr)
            sys.exit(2)
    for (scene, variant, length, seed), config, words, recipe in plan:
        if (scene, variant, length, seed) in done:
            continue
        recorder = {"steps": [length], "seconds": [], "clock": "cpu"}
        overrides = [*words, f"seed={seed}", "metrics.lpips_net=alex"]
        work = args.out / "work" / f"{scene}_{variant}_{length}_{seed}"
        trainer = run(config, overrides, recorder, args.threads, work)
        final = trainer.hooks["QualityRecorderHook"].rows[-1]
        row = {"scene": scene, "variant": variant, "length": length, "seed": seed}
        row |= {k: final.get(k) for k in FIELDS[4:-2]}
        row |= {"commit": version, "recipe": recipe}
        append_run(runs_csv, row)
        print(
            f"{scene} {variant} {length} steps seed {seed}: {row['psnr']:.2f} dB, {row['gaussians']} "
            f"Gaussians, {row['cpu_seconds']:.0f} CPU s, load {row['load1']:.1f}",
            flush=True,
        )
    load = " ".join(f"{v:.2f}" for v in load_average())
    print(f"\nthreads {args.threads} (torch {torch.__version__}), load average at the end {load}\n")
    print(markdown(summarize(read_runs(runs_csv))))
    if args.plot:
        print("\nwrote " + ", ".join(str(path) for path in plot_runs(read_runs(runs_csv), args.out)))


if __name__ == "__main__":
    main()
