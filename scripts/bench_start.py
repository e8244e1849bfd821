"""The start of ``gsrecon train``: wall and CPU seconds from the process's exec to its first training step, beside
``import torch`` alone (the floor: every gsrecon process pays it).

Each trial runs a fresh interpreter: the floor (``python -c "import torch"``), and the CLI with a plugin hook
(loaded through the config's ``imports:``, as any user plugin) that prints the wall clock and the process's CPU
seconds when the first step begins and when it ends. ``--code`` runs another checkout's gsrecon (e.g. the commit
before a change), from that checkout's folder (config paths are relative to it); trials alternate between the
checkouts given. The kernels of the ``cpu`` renderer are built
beforehand (one untimed run per checkout), so the figures are those of a start with the kernels cached::

    python scripts/bench_start.py --code /tmp/before --code . --trials 5 -- \\
        --config configs/statuette.yaml data.path=../shared/data/statuette_colmap renderer.name=cpu

Prints one line per trial and the medians; write them to BENCHMARKS.md with the load average printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The plugin: a hook printing, as JSON, wall time and the process's CPU seconds around the first training step.
PLUGIN = """
import json, resource, time
import gsrecon
from gsrecon.engine.hook import Hook
from gsrecon.registry import HOOK_REGISTRY


def _now(event):
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime
    print("START_CLOCK " + json.dumps({"event": event, "wall": time.time(), "cpu": cpu, "gsrecon": gsrecon.__file__}))


@HOOK_REGISTRY.register()
class StartClockHook(Hook):
    def before_train_iter(self, trainer):
        if trainer.step == 0:
            _now("first_step_begins")

    def after_train_iter(self, trainer):
        if trainer.step == 1:
            _now("first_step_ends")
"""


def _child_cpu(before: resource.struct_rusage) -> float:
    """CPU seconds (user + system) of the children waited for since ``before``."""
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def time_import_torch(python: str, env: dict[str, str]) -> dict[str, float]:
    """Wall and CPU seconds from exec to the end of ``import torch`` (read inside the process, as the train runs'
    figures are: the interpreter's exit is not counted)."""
    code = "import json, resource, time, torch; u = resource.getrusage(resource.RUSAGE_SELF)\n"
    code += "print(json.dumps({'wall': time.time(), 'cpu': u.ru_utime + u.ru_stime}))"
    start = time.time()
    result = subprocess.run([python, "-c", code], check=True, env=env, capture_output=True, text=True)
    clock = json.loads(result.stdout.strip().splitlines()[-1])
    return {"wall": clock["wall"] - start, "cpu": clock["cpu"]}


def time_train(code: Path, env: dict[str, str], args: list[str], plugin: Path, exp_dir: Path) -> dict[str, float]:
    """Wall and CPU seconds from exec to the first step's beginning and end, and of the whole process, of the
    checkout ``code``'s gsrecon (run from its folder: ``python -m`` puts the working directory first on the path)."""
    command = [sys.executable, "-m", "gsrecon", "train", *args, f"imports=[{plugin}]", "hooks.StartClockHook={}"]
    command += [f"exp_dir={exp_dir}", "--overwrite", "max_steps=1", "num_threads=1"]
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=code)
    total = {"wall": time.time() - start, "cpu": _child_cpu(before)}
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr}")
    events = {}
    for line in result.stdout.splitlines():
        if line.startswith("START_CLOCK "):
            event = json.loads(line.split(" ", 1)[1])
            events[event["event"]] = event
    begins, ends = events["first_step_begins"], events["first_step_ends"]
    if not Path(begins["gsrecon"]).is_relative_to(code):
        raise SystemExit(f"the run imported {begins['gsrecon']}, not the gsrecon of {code}")
    return {
        "to_first_step_wall": begins["wall"] - start,
        "to_first_step_cpu": begins["cpu"],
        "first_step_done_wall": ends["wall"] - start,
        "first_step_done_cpu": ends["cpu"],
        "process_wall": total["wall"],
        "process_cpu": total["cpu"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", action="append", default=[], help="a checkout whose gsrecon runs (repeatable)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("train_args", nargs="*", help="gsrecon train arguments (after --)")
    args = parser.parse_args()
    codes = [Path(c).resolve() for c in args.code] or [Path(__file__).resolve().parents[1]]
    with tempfile.TemporaryDirectory() as tmp:
        plugin = Path(tmp) / "start_clock.py"
        plugin.write_text(PLUGIN)
        envs = {code: {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"} for code in codes}
        for code in codes:  # untimed: builds (or loads) each checkout's kernels and warms the file cache
            time_train(code, envs[code], args.train_args, plugin, Path(tmp) / "warm")
        results: dict[str, list[dict[str, float]]] = {str(code): [] for code in codes}
        floor: list[dict[str, float]] = []
        for trial in range(args.trials):
            floor.append(time_import_torch(sys.executable, envs[codes[0]]))
            print(f"trial {trial} import torch: {json.dumps({k: round(v, 3) for k, v in floor[-1].items()})}")
            for code in codes:
                result = time_train(code, envs[code], args.train_args, plugin, Path(tmp) / "run")
                results[str(code)].append(result)
                load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
                print(f"trial {trial} {code}: {json.dumps({k: round(v, 3) for k, v in result.items()})} load {load}")
    print("medians:")
    print(f"  import torch: wall {statistics.median(r['wall'] for r in floor):.2f} s, "
          f"cpu {statistics.median(r['cpu'] for r in floor):.2f} s")  # fmt: skip
    for code, runs in results.items():
        medians = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        print(f"  {code}: " + ", ".join(f"{key} {value:.2f} s" for key, value in medians.items()))


if __name__ == "__main__":
    main()
