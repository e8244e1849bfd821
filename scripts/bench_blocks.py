"""Block training against one run of the whole scene: test PSNR, seams, peak memory, wall time.

    nice -n 5 python scripts/bench_blocks.py --out /tmp/blocks --seeds 0,1,2 --blocks 4 \\
        --config configs/street.yaml [--set data.synthetic.street_length=48 ...] [--parallel]

Per seed: the whole scene in one process (``partition.blocks=1``), then each block in a process of its own
(``partition.only=i``, the job-array way, so that each block's peak RSS is its own) and ``gsrecon merge``; every
process with ``num_threads`` torch threads. Printed per seed and as mean ± spread (half the range): test PSNR of
the single run and of the merged scene; the merged scene's test views that see two or more blocks' cells (across
a border) against the others, and the same split of the single run (so that views that are harder anyway do not
count as seams); peak RSS of the single run, of the largest block and of the merge, and of an idle process that
only imported gsrecon's trainer and torch (what every process pays before any data). ``--parallel`` also times
the blocks of seed 0 in one process one after another against two torchrun processes sharing them (2 free cores
needed). Results go to ``<out>/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(argv: list[str]) -> None:
    """Run ``gsrecon`` with ``argv`` in this process (the heap setting of the console script applied) and print
    this process's peak RSS in MiB as the last line."""
    from gsrecon.cli import main
    from gsrecon.heap import unmap_large_blocks

    unmap_large_blocks()
    code = main(argv) if argv else 0
    if not argv:
        import gsrecon.engine.trainer  # noqa: F401  # the idle baseline: what every run imports
    print(json.dumps({"code": code, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def measure(argv: list[str], threads: int, log: Path) -> dict:
    """Run ``gsrecon argv`` in a child process: its peak RSS (MiB) and wall seconds, also written beside ``log``
    (``<log>.json``); a run whose figures are there already is not run again (an interrupted benchmark goes on)."""
    done = log.with_suffix(".json")
    if done.is_file():
        return json.loads(done.read_text())
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    with log.open("w") as out:
        result = subprocess.run(
            [sys.executable, __file__, "--child", *argv], stdout=subprocess.PIPE, stderr=out, text=True, env=env
        )
    wall = time.perf_counter() - start
    report = json.loads(result.stdout.strip().splitlines()[-1])
    if report["code"] != 0:
        raise SystemExit(f"gsrecon {' '.join(argv)} failed (exit {report['code']}); see {log}")
    figures = {"peak_rss_mib": report["peak_rss_mib"], "wall_s": wall}
    done.write_text(json.dumps(figures))
    return figures


def split_psnr(views: list[dict], border: set[str]) -> tuple[float, float]:
    """Mean PSNR of the views named in ``border`` and of the others."""
    across = [v["psnr"] for v in views if v["name"] in border]
    others = [v["psnr"] for v in views if v["name"] not in border]
    return statistics.fmean(across) if across else float("nan"), statistics.fmean(others) if others else float("nan")


def run_seed(args: argparse.Namespace, seed: int, out: Path) -> dict:
    common = [*args.set, f"seed={seed}", f"num_threads={args.threads}", "hooks.LogHook.progress=false"]
    single_dir, blocks_dir = out / f"single_{seed}", out / f"blocks_{seed}"
    train = ["train", "--config", args.config, "--overwrite", *common]
    single = measure([*train, f"exp_dir={single_dir}"], args.threads, out / f"single_{seed}.log")
    blocks = [
        measure(
            [*train, f"exp_dir={blocks_dir}", f"partition.blocks={args.blocks}", f"partition.only={i}"],
            args.threads,
            out / f"block_{seed}_{i}.log",
        )
        for i in range(args.blocks)
    ]
    merge = measure(["merge", "--exp-dir", str(blocks_dir)], args.threads, out / f"merge_{seed}.log")
    single_metrics = json.loads((single_dir / "metrics.json").read_text())
    merged_metrics = json.loads((blocks_dir / "metrics.json").read_text())
    border = {v["name"] for v in merged_metrics["images"] if len(v["blocks"]) >= 2}
    merged_across, merged_others = split_psnr(merged_metrics["images"], border)
    single_across, single_others = split_psnr(single_metrics["images"], border)
    return {
        "seed": seed,
        "single_psnr": single_metrics["mean"]["psnr"],
        "merged_psnr": merged_metrics["mean"]["psnr"],
        "single_gaussians": single_metrics["num_gaussians"],
        "merged_gaussians": merged_metrics["num_gaussians"],
        "border_views": sorted(border),
        "test_views": len(merged_metrics["images"]),
        "merged_border_minus_others": merged_across - merged_others,
        "single_border_minus_others": single_across - single_others,
        "single_rss_mib": single["peak_rss_mib"],
        "block_rss_mib": [b["peak_rss_mib"] for b in blocks],
        "merge_rss_mib": merge["peak_rss_mib"],
        "single_wall_s": single["wall_s"],
        "blocks_wall_s": sum(b["wall_s"] for b in blocks) + merge["wall_s"],
    }


def parallel(args: argparse.Namespace, out: Path) -> dict:
    """Wall time of the blocks of seed 0 one after another in one process against two torchrun processes."""
    common = [*args.set, "seed=0", f"num_threads={args.threads}", "hooks.LogHook.progress=false"]
    train = ["train", "--config", args.config, "--overwrite", *common, f"partition.blocks={args.blocks}"]
    serial = measure([*train, f"exp_dir={out / 'serial'}"], args.threads, out / "serial.log")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    with (out / "torchrun.log").open("w") as log:
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "gsrecon",
             *train, f"exp_dir={out / 'torchrun'}"],
            check=True, stdout=log, stderr=log, env=env,
        )  # fmt: skip
    return {"serial_wall_s": serial["wall_s"], "torchrun_2_wall_s": time.perf_counter() - start}


def summary(rows: list[dict]) -> list[str]:
    def stat(values: list[float]) -> str:
        return f"{statistics.fmean(values):.2f} ± {(max(values) - min(values)) / 2:.2f}"

    ratio = [max(r["block_rss_mib"]) / r["single_rss_mib"] for r in rows]
    return [
        f"single run test PSNR {stat([r['single_psnr'] for r in rows])}",
        f"merged blocks test PSNR {stat([r['merged_psnr'] for r in rows])}",
        f"merged − single {stat([r['merged_psnr'] - r['single_psnr'] for r in rows])} dB",
        f"border − other views, merged {stat([r['merged_border_minus_others'] for r in rows])} dB, "
        f"single {stat([r['single_border_minus_others'] for r in rows])} dB",
        f"peak RSS: single {stat([r['single_rss_mib'] for r in rows])} MiB, largest block "
        f"{stat([max(r['block_rss_mib']) for r in rows])} MiB (ratio {stat(ratio)}), merge "
        f"{stat([r['merge_rss_mib'] for r in rows])} MiB",
    ]


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--config", default=str(ROOT / "configs" / "street.yaml"))
    parser.add_argument("--set", action="append", default=[], help="a key=value override of every run (repeat)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--parallel", action="store_true", help="also time serial blocks against 2 torchrun ranks")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"command": sys.argv, "load_before": os.getloadavg()[0]}
    results["idle_rss_mib"] = measure([], args.threads, out / "idle.log")["peak_rss_mib"]
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        rows.append(run_seed(args, seed, out))
        print(json.dumps(rows[-1]), flush=True)
    results["seeds"] = rows
    if args.parallel:
        results["parallel"] = parallel(args, out)
    results["load_after"] = os.getloadavg()[0]
    results["summary"] = summary(rows)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"idle process: {results['idle_rss_mib']:.0f} MiB; load {results['load_before']:.2f} -> "
          f"{results['load_after']:.2f}")  # fmt: skip
    for line in results["summary"]:
        print(line)
    if args.parallel:
        print(json.dumps(results["parallel"]))


if __name__ == "__main__":
    main()
