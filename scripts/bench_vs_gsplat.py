"""gsrecon against gsplat's own trainer: the same COLMAP scene, steps, resolution, test split and densification.

    bash scripts/fetch_gsplat_examples.sh GSPLAT_GIT    # gsplat's examples/ at the installed version's tag
    python scripts/bench_vs_gsplat.py --data ../shared/data/statuette_colmap --factor 1 --steps 7000 \\
        --gsplat-examples .gsplat_examples --out /tmp/vs_gsplat --seeds 0,1 --strategies default,mcmc --dry-run

Per strategy and seed it runs gsplat's ``examples/simple_trainer.py`` (subcommand ``default`` or ``mcmc``)
and then ``gsrecon train --config configs/mipnerf360.yaml``, alternating the two so that drift of the
machine (clocks, temperature) falls on both. Both get the same densification schedule, passed
explicitly: the 3DGS paper's steps (SH degree every 1000, refine from 500 to 15000 — MCMC: to 25000 —,
opacity reset every 3000, at 30k steps) scaled to ``--steps``, as gsrecon does by itself; refine every
100, ``grow_grad2d`` 0.0002, MCMC ``cap_max`` from ``--cap-max`` (and gsplat's MCMC start: opacity 0.5,
scales × 0.1). Both validate once, at the last step,
on every 8th image.

Read back per run: test PSNR / SSIM / LPIPS, Gaussians, peak GPU memory (``torch.cuda.max_memory_allocated``
in both), training seconds and steps/s (gsplat: ``stats/train_step<last>_rank0.json``'s ``ellipse_time``;
gsrecon: the ``time/total_s`` scalar of its IterTimerHook) and the wall seconds of the whole process.
gsplat seeds itself (``set_random_seed(42)``), so its runs differ only by the GPU's nondeterminism; the
seed goes to gsrecon alone. simple_trainer.py runs unmodified through this script, which gives its
LPIPS torchvision's AlexNet from gsrecon's LPIPS backbone where torch's cache lacks it (the GPU
machine is offline) and lets it import without its viewer's packages.

Writes ``<out>/runs.csv`` (one row per run), ``<out>/summary.csv`` and ``<out>/summary.md``
(means over seeds, with GPU, driver, torch and gsplat versions and the commands).
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHILD_FLAG = "--gsrecon-child"  # the script runs `gsrecon train` through itself to read its peak GPU memory
GSPLAT_CHILD_FLAG = "--gsplat-child"  # and simple_trainer.py, to give its LPIPS an offline AlexNet
VIEWER_MODULES = ("viser", "nerfview")
ALEXNET_FILE = "alexnet-owt-7be5be79.pth"  # torchvision's AlexNet weights, which torchmetrics' LPIPS downloads
REFERENCE_STEPS = 30_000
# The 3DGS paper's schedule at REFERENCE_STEPS (gsplat's defaults): SH degree interval, refine start and
# stop (default ADC; MCMC), opacity reset interval.
SH_DEGREE_INTERVAL, REFINE_START, REFINE_STOP, MCMC_REFINE_STOP, RESET_EVERY = 1000, 500, 15_000, 25_000, 3000
REFINE_EVERY, GROW_GRAD2D = 100, 0.0002
MCMC_INIT_OPACITY, MCMC_INIT_SCALE = 0.5, 0.1  # simple_trainer.py's mcmc subcommand (opacity/scale reg 0.01 as ours)
TRAINERS = ("gsplat", "gsrecon")
STRATEGIES = ("default", "mcmc")
METRICS = ("psnr", "ssim", "lpips", "gaussians", "peak_gpu_gib", "train_s", "steps_per_s", "wall_s")
RUN_COLUMNS = ("strategy", "trainer", "seed", *METRICS)
# (summary column, markdown heading)
SUMMARY_HEADINGS = (
    ("strategy", "strategy"), ("trainer", "trainer"), ("runs", "runs"), ("psnr", "PSNR"), ("ssim", "SSIM"),
    ("lpips", "LPIPS"), ("gaussians", "Gaussians"), ("peak_gpu_gib", "peak GPU GiB"), ("train_s", "train s"),
    ("steps_per_s", "steps/s"), ("wall_s", "wall s"),
)  # fmt: skip


@dataclass(frozen=True)
class Run:
    """One training: which trainer, densification strategy and seed."""

    trainer: str
    strategy: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.strategy}_{self.trainer}_seed{self.seed}"


@dataclass(frozen=True)
class Setup:
    """What both trainers share, and where their inputs and outputs are."""

    data: str  # COLMAP scene folder (images/ and sparse/0/)
    out: Path
    steps: int
    factor: int
    cap_max: int
    gsplat_examples: Path  # gsplat's examples/ folder at the installed version's tag
    python: str = sys.executable
    gsrecon_config: str = "configs/mipnerf360.yaml"
    gsrecon_extra: tuple[str, ...] = ()  # more gsrecon overrides, after the matching ones


def plan(strategies: list[str], seeds: list[int]) -> list[Run]:
    """The runs in order: per strategy and seed, gsplat then gsrecon."""
    return [Run(trainer, strategy, seed) for strategy in strategies for seed in seeds for trainer in TRAINERS]


def scaled(steps: int, reference_value: int) -> int:
    """A step count of the 3DGS schedule at REFERENCE_STEPS, scaled to a run of ``steps`` steps."""
    return max(1, round(reference_value * steps / REFERENCE_STEPS))


def gsplat_command(setup: Setup, run: Run) -> list[str]:
    """gsplat's simple_trainer.py command line (tyro flags of gsplat 1.5.3's Config and strategies), run
    through this script (:data:`GSPLAT_CHILD_FLAG`)."""
    steps = str(setup.steps)
    script = str(setup.gsplat_examples / "simple_trainer.py")
    command = [
        setup.python, str(Path(__file__).resolve()), GSPLAT_CHILD_FLAG, script, run.strategy,
        "--data_dir", setup.data, "--data_factor", str(setup.factor), "--test_every", "8",
        "--result_dir", str(setup.out / run.name), "--max_steps", steps, "--eval_steps", steps,
        "--save_steps", steps, "--disable_viewer", "--disable_video",
        "--sh_degree_interval", str(scaled(setup.steps, SH_DEGREE_INTERVAL)),
        "--strategy.refine-start-iter", str(scaled(setup.steps, REFINE_START)),
        "--strategy.refine-every", str(REFINE_EVERY),
    ]  # fmt: skip
    if run.strategy == "mcmc":
        return [
            *command, "--strategy.refine-stop-iter", str(scaled(setup.steps, MCMC_REFINE_STOP)),
            "--strategy.cap-max", str(setup.cap_max),
        ]  # fmt: skip
    return [
        *command, "--strategy.refine-stop-iter", str(scaled(setup.steps, REFINE_STOP)),
        "--strategy.reset-every", str(scaled(setup.steps, RESET_EVERY)), "--strategy.grow-grad2d", str(GROW_GRAD2D),
    ]  # fmt: skip


def gsrecon_overrides(setup: Setup, run: Run) -> list[str]:
    """``key=value`` overrides of ``setup.gsrecon_config`` matching :func:`gsplat_command`."""
    steps = setup.steps
    start = scaled(steps, REFINE_START)
    if run.strategy == "mcmc":
        strategy = (
            f"strategy={{name: mcmc, cap_max: {setup.cap_max}, refine_start: {start}, "
            f"refine_stop: {scaled(steps, MCMC_REFINE_STOP)}, refine_every: {REFINE_EVERY}}}"
        )
    else:
        strategy = (
            f"strategy={{name: default, refine_start: {start}, refine_stop: {scaled(steps, REFINE_STOP)}, "
            f"reset_every: {scaled(steps, RESET_EVERY)}, refine_every: {REFINE_EVERY}, grow_grad2d: {GROW_GRAD2D}}}"
        )
    overrides = [
        f"exp_dir={setup.out / run.name}", f"seed={run.seed}", f"max_steps={steps}", f"val_interval={steps}",
        f"model.sh_degree_interval={scaled(steps, SH_DEGREE_INTERVAL)}", strategy,
        "writers=[{name: JsonlWriter}]", f"hooks.CheckPointHook.interval={steps}",
    ]  # fmt: skip
    if run.strategy == "mcmc":  # what simple_trainer.py's mcmc subcommand sets (its regularizers: gsrecon's defaults)
        overrides += [f"model.init_opacity={MCMC_INIT_OPACITY}", f"model.init_scale={MCMC_INIT_SCALE}"]
    if setup.data:
        overrides += [f"data.path={setup.data}", f"data.factor={setup.factor}", "data.eval_split=every_8"]
    return [*overrides, *setup.gsrecon_extra]


def gsrecon_command(setup: Setup, run: Run) -> list[str]:
    """``gsrecon train`` run through this script (:data:`CHILD_FLAG`), which adds ``peak_gpu.json``."""
    train = ["train", "--config", setup.gsrecon_config, *gsrecon_overrides(setup, run)]
    return [setup.python, str(Path(__file__).resolve()), CHILD_FLAG, str(setup.out / run.name), *train]


def command(setup: Setup, run: Run) -> list[str]:
    """The command line of one run."""
    return gsplat_command(setup, run) if run.trainer == "gsplat" else gsrecon_command(setup, run)


def gsrecon_child(exp_dir: str, argv: list[str]) -> int:
    """Runs ``gsrecon <argv>``, then writes ``<exp_dir>/peak_gpu.json`` (GiB; null without CUDA)."""
    import torch

    from gsrecon.cli import main

    code = main(argv)
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    Path(exp_dir).mkdir(parents=True, exist_ok=True)
    (Path(exp_dir) / "peak_gpu.json").write_text(json.dumps({"peak_gpu_gib": peak}))
    return code


def offline_alexnet() -> None:
    """Where torch's hub cache lacks torchvision's AlexNet (the GPU machine is offline), builds its state
    dict from gsrecon's LPIPS backbone (``gsrecon weights``): the same convolutions, which are all that
    LPIPS uses; the classifier, unused, keeps its fresh initialisation."""
    import torch
    import torchvision
    from torchvision.models import _api

    from gsrecon.lpips_weights import lpips_backbone_path

    download = _api.load_state_dict_from_url

    def load(url: str, *args, **kwargs) -> dict:
        cached = Path(torch.hub.get_dir()) / "checkpoints" / ALEXNET_FILE
        if not url.endswith(ALEXNET_FILE) or cached.is_file():
            return download(url, *args, **kwargs)
        backbone = torch.load(lpips_backbone_path("alex"), map_location="cpu", weights_only=True)
        state = torchvision.models.alexnet(weights=None).state_dict()
        for key, value in backbone.items():  # slice<k>.<index>.<weight|bias> -> features.<index>.<weight|bias>
            _, index, kind = key.split(".")
            state[f"features.{index}.{kind}"] = value
        return state

    _api.load_state_dict_from_url = load


def stand_in_class(name: str) -> type:
    """An empty class named ``name``: the stand-in modules' every public name (dunder names do not exist)."""
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (), {})


def stand_in_viewer_modules() -> None:
    """simple_trainer.py imports its viewer's packages (viser, nerfview) even with ``--disable_viewer``;
    where they are not installed, stand-in modules whose every name is an empty class let it import
    (any use of the viewer then fails)."""
    import importlib.util
    import types

    for name in VIEWER_MODULES:
        if importlib.util.find_spec(name) is None:
            module = types.ModuleType(name)
            module.__getattr__ = stand_in_class  # PEP 562: every public name resolves
            sys.modules[name] = module


def gsplat_child(argv: list[str]) -> int:
    """Runs gsplat's ``simple_trainer.py <args>`` (``argv``) as ``__main__``, its folder first on the path."""
    import runpy

    offline_alexnet()
    stand_in_viewer_modules()
    sys.argv = list(argv)
    sys.path.insert(0, str(Path(argv[0]).resolve().parent))
    runpy.run_path(argv[0], run_name="__main__")
    return 0


def read_json(path: Path) -> dict:
    """A JSON file a trainer wrote; a missing one is named in the error."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the run did not finish (see <out>/<run>.log)")
    return json.loads(path.read_text())


def read_gsplat(result_dir: Path, steps: int) -> dict:
    """Metrics of a simple_trainer.py run: ``stats/val_step<S>.json`` (psnr, ssim, lpips, num_GS) and
    ``stats/train_step<S>_rank0.json`` (mem: peak GiB, ellipse_time: seconds since training began),
    S = steps - 1 (its 0-based last step)."""
    last = steps - 1
    val = read_json(result_dir / "stats" / f"val_step{last:04d}.json")
    train = read_json(result_dir / "stats" / f"train_step{last:04d}_rank0.json")
    return {
        "psnr": val["psnr"], "ssim": val["ssim"], "lpips": val["lpips"], "gaussians": val["num_GS"],
        "peak_gpu_gib": train["mem"], "train_s": train["ellipse_time"], "steps_per_s": steps / train["ellipse_time"],
    }  # fmt: skip


def read_gsrecon(exp_dir: Path, steps: int) -> dict:
    """Metrics of a gsrecon run: ``metrics.json``, ``peak_gpu.json`` and the last ``time/total_s`` in
    ``scalars.jsonl`` (training seconds, validation excluded)."""
    metrics = read_json(exp_dir / "metrics.json")
    if metrics["step"] != steps:
        raise ValueError(f"{exp_dir / 'metrics.json'} is from step {metrics['step']}, not the last step {steps}")
    totals = [
        record["value"]
        for record in map(json.loads, (exp_dir / "scalars.jsonl").read_text().splitlines())
        if record["name"] == "time/total_s"
    ]
    if not totals:
        raise ValueError(f"{exp_dir / 'scalars.jsonl'} has no time/total_s: IterTimerHook did not log")
    mean = metrics["mean"]
    return {
        "psnr": mean["psnr"], "ssim": mean["ssim"], "lpips": mean.get("lpips"), "gaussians": metrics["num_gaussians"],
        "peak_gpu_gib": read_json(exp_dir / "peak_gpu.json")["peak_gpu_gib"], "train_s": totals[-1],
        "steps_per_s": steps / totals[-1],
    }  # fmt: skip


def read_run(setup: Setup, run: Run) -> dict:
    """One run's row of runs.csv (without its wall time)."""
    folder = setup.out / run.name
    metrics = read_gsplat(folder, setup.steps) if run.trainer == "gsplat" else read_gsrecon(folder, setup.steps)
    return {"strategy": run.strategy, "trainer": run.trainer, "seed": run.seed, **metrics}


def execute(setup: Setup, run: Run) -> dict:
    """Runs one training (its output in ``<out>/<run>.log``) and reads its row back."""
    log_path = setup.out / f"{run.name}.log"  # beside the run folder: gsrecon trains only into an empty one
    setup.out.mkdir(parents=True, exist_ok=True)
    cwd = setup.gsplat_examples if run.trainer == "gsplat" else REPO  # simple_trainer imports its siblings
    start = time.perf_counter()
    with log_path.open("w") as log:
        done = subprocess.run(command(setup, run), cwd=cwd, stdout=log, stderr=subprocess.STDOUT, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{run.name} exited with {done.returncode}; see {log_path}")
    return {**read_run(setup, run), "wall_s": wall}


def summarize(rows: list[dict]) -> list[dict]:
    """Means over seeds per (strategy, trainer), in the order first seen; missing values stay missing."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["strategy"], row["trainer"]), []).append(row)
    summary = []
    for (strategy, trainer), group in groups.items():
        means = {}
        for metric in METRICS:
            values = [row[metric] for row in group if row.get(metric) is not None]
            means[metric] = statistics.fmean(values) if values else None
        summary.append({"strategy": strategy, "trainer": trainer, "runs": len(group), **means})
    return summary


def write_csv(path: Path, rows: list[dict], columns: tuple[str, ...]) -> None:
    """Rows as CSV with these columns (missing values empty)."""
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({key: "" if row.get(key) is None else row[key] for key in columns} for row in rows)


def cell(value: object) -> str:
    """A markdown table cell: floats to 4 significant decimals' worth, missing as '-'."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}" if abs(value) < 10_000 else f"{value:.0f}"
    return str(value)


def markdown(summary: list[dict], environment: dict[str, str], commands: list[str]) -> str:
    """The summary table, the machine and software it ran on, and the commands of the first seed."""
    lines = [
        "| " + " | ".join(heading for _, heading in SUMMARY_HEADINGS) + " |",
        "|" + "---|" * len(SUMMARY_HEADINGS),
        *("| " + " | ".join(cell(row[key]) for key, _ in SUMMARY_HEADINGS) + " |" for row in summary),
        "",
        *(f"- {key}: {value}" for key, value in environment.items()),
        "",
        "```",
        *commands,
        "```",
    ]
    return "\n".join(lines) + "\n"


def environment(python: str) -> dict[str, str]:
    """GPU model and driver (nvidia-smi), torch and gsplat versions (of ``python``)."""
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        smi = "none (nvidia-smi failed)"
    probe = "import torch, gsplat; print(torch.__version__, torch.version.cuda, gsplat.__version__)"
    found = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False).stdout.split()
    torch_version, cuda, gsplat_version = found if len(found) == 3 else ("?", "?", "?")
    return {
        "GPU, driver, memory": smi, "torch": f"{torch_version} (CUDA {cuda})", "gsplat": gsplat_version,
        "python": python,
    }  # fmt: skip


def read_runs_csv(path: Path) -> list[dict]:
    """The rows of a runs.csv this script wrote (numbers as numbers, empty cells as None)."""
    with path.open(newline="") as file:
        rows = list(csv.DictReader(file))
    kinds = {"strategy": str, "trainer": str, "seed": int}
    return [{key: kinds.get(key, float)(value) if value else None for key, value in row.items()} for row in rows]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="COLMAP scene folder (images/, sparse/0/)")
    parser.add_argument("--gsplat-examples", type=Path, help="gsplat's examples/ at its tag")
    parser.add_argument("--merge", nargs="+", type=Path, help="only summarize these runs.csv (of several calls)")
    parser.add_argument("--out", required=True, type=Path, help="output folder (one subfolder per run)")
    parser.add_argument("--steps", type=int, default=7000)
    parser.add_argument("--factor", type=int, default=1, help="image downsampling factor of both trainers")
    parser.add_argument("--seeds", default="0,1", help="comma-separated; gsrecon's seeds, gsplat's repeats")
    parser.add_argument("--strategies", default="default,mcmc", help="comma-separated: default, mcmc")
    parser.add_argument("--cap-max", type=int, default=1_000_000, help="MCMC's Gaussian budget in both")
    parser.add_argument("--python", default=sys.executable, help="the interpreter of both trainers")
    parser.add_argument("--gsrecon-config", default="configs/mipnerf360.yaml")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("overrides", nargs="*", help="more gsrecon key=value overrides (e.g. data.cache=cpu)")
    args = parser.parse_args(argv)
    if not args.merge and not (args.data and args.gsplat_examples):
        parser.error("--data and --gsplat-examples are required (unless --merge)")
    strategies = args.strategies.split(",")
    if unknown := sorted(set(strategies) - set(STRATEGIES)):
        parser.error(f"--strategies: unknown {', '.join(unknown)}; choose from {', '.join(STRATEGIES)}")
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    args.strategies = strategies
    args.seeds = [int(seed) for seed in args.seeds.split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [CHILD_FLAG]:
        return gsrecon_child(argv[1], argv[2:])
    if argv[:1] == [GSPLAT_CHILD_FLAG]:
        return gsplat_child(argv[1:])
    args = parse_args(argv)
    if args.merge:
        return merge(args.merge, args.out)
    setup = Setup(
        data=str(Path(args.data).resolve()), out=args.out.resolve(), steps=args.steps, factor=args.factor,
        cap_max=args.cap_max,
        gsplat_examples=args.gsplat_examples.resolve(), python=args.python, gsrecon_config=args.gsrecon_config,
        gsrecon_extra=tuple(args.overrides),
    )  # fmt: skip
    runs = plan(args.strategies, args.seeds)
    commands = [shlex.join(command(setup, run)) for run in runs]
    if args.dry_run:
        print("\n".join(commands))
        return 0
    if not (setup.gsplat_examples / "simple_trainer.py").is_file():
        raise SystemExit(
            f"--gsplat-examples {setup.gsplat_examples} has no simple_trainer.py; run fetch_gsplat_examples.sh"
        )
    setup.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for run in runs:
        print(f"{run.name}: {shlex.join(command(setup, run))}", flush=True)
        rows.append(execute(setup, run))
        write_csv(setup.out / "runs.csv", rows, RUN_COLUMNS)
    summary = summarize(rows)
    write_csv(setup.out / "summary.csv", summary, tuple(key for key, _ in SUMMARY_HEADINGS))
    first = [text for run, text in zip(runs, commands) if run.seed == args.seeds[0]]
    table = markdown(summary, environment(setup.python), first)
    (setup.out / "summary.md").write_text(table)
    print(table)
    return 0


def merge(paths: list[Path], out: Path) -> int:
    """Summarizes the runs.csv of several calls (e.g. one per strategy) into ``out``; each call's
    summary.md beside its runs.csv says the machine and commands."""
    rows = [row for path in paths for row in read_runs_csv(path)]
    summary = summarize(rows)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "runs.csv", rows, RUN_COLUMNS)
    write_csv(out / "summary.csv", summary, tuple(key for key, _ in SUMMARY_HEADINGS))
    table = markdown(summary, {"merged from": ", ".join(map(str, paths))}, [])
    (out / "summary.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
