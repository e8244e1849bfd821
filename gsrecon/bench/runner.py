"""Running a suite: each scene trained by gsrecon (and the peers) under the protocol, scored, and recorded, so that
an interrupted suite resumes (a finished scene is kept, a half-trained one continues from its checkpoint)."""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gsrecon.atomic import write_json
from gsrecon.bench.peers import bench_vs_gsplat, check_peers, run_gsplat, run_opensplat, train_only_scene
from gsrecon.bench.protocol import COLMAP, check_scene
from gsrecon.bench.report import RESULT_FILES, write_results
from gsrecon.bench.request import SCHEDULES, SETTINGS_FILE, STRATEGIES, SuiteRun
from gsrecon.errors import InputError
from gsrecon.logging.console import Logger


@dataclass
class SuiteOutcome:
    """What a suite produced: the records per scene, and why it stopped early (None: it finished)."""

    records: dict[str, list[dict[str, Any]]]
    written: list[Path]
    stop_reason: str | None = None
    stop_signal: int | None = None

    def report(self) -> list[str]:
        if self.stop_reason is not None:
            return [f"suite stopped: {self.stop_reason}; run the same command again to resume"]
        return [f"wrote {path}" for path in self.written]


def check_request(run: SuiteRun) -> None:
    """Refuse, before anything trains, what would make the suite fail later: a missing scene, a scene in another
    layout or without images at the protocol's downscale, a peer that cannot run, settings that do not fit.

    Raises:
        InputError: naming the scene, path, peer or setting.
    """
    if run.steps < 1:
        raise InputError(f"--steps must be >= 1, got {run.steps}")
    if run.schedule not in SCHEDULES:
        raise InputError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {run.schedule!r}")
    if run.strategy not in STRATEGIES:
        raise InputError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {run.strategy!r}")
    if not run.data.is_dir():
        raise InputError(f"{run.data}: --data must be the folder holding the {run.suite.name} scenes")
    for name in run.scenes:
        run.suite.data_overrides(run.data, run.suite.scene(name))
    if "gsplat" in run.peers and run.schedule != "3dgs":
        raise InputError(
            "peer gsplat trains with the 3DGS paper's schedule scaled to the steps: add --schedule 3dgs so that "
            "gsrecon trains with the same"
        )
    if "opensplat" in run.peers and run.suite.layout != COLMAP:
        raise InputError(f"peer opensplat: trains COLMAP scenes, and suite {run.suite.name} is not one")
    check_peers(run.peers, run.peer_setup)


def prepare_out(run: SuiteRun, overwrite: bool) -> None:
    """Make ``run.out`` ready: new, or a suite with the same settings to resume, or (``overwrite``) cleared of
    what an earlier suite wrote there (its scene folders and results files; nothing else).

    Raises:
        InputError: the folder holds a finished suite, or one with other settings, and ``overwrite`` is off.
    """
    settings_path = run.out / SETTINGS_FILE
    if overwrite:
        for name in (SETTINGS_FILE, *RESULT_FILES):
            (run.out / name).unlink(missing_ok=True)
        for name in run.suite.scene_names:  # the scene folders a suite wrote (its gsrecon run inside)
            if (run.out / name / "gsrecon").is_dir():
                shutil.rmtree(run.out / name)
    elif settings_path.is_file():
        before = json.loads(settings_path.read_text())
        changed = [key for key, value in run.settings().items() if before.get(key) != value]
        if changed:
            shown = ", ".join(f"{key} {before.get(key)!r} -> {run.settings()[key]!r}" for key in changed)
            raise InputError(
                f"{run.out}: holds a suite run with other settings ({shown}); use another --out, or --overwrite to "
                "replace it"
            )
        if (run.out / RESULT_FILES[0]).is_file() and all((run.out / s / "metrics.json").is_file() for s in run.scenes):
            raise InputError(f"{run.out}: the suite's results are already written; --overwrite replaces them")
    elif run.out.is_dir() and any(run.out.iterdir()):
        raise InputError(f"{run.out}: not empty and not a suite's results folder; choose a new or empty --out")
    run.out.mkdir(parents=True, exist_ok=True)
    write_json(settings_path, run.settings())


def run_suite(run: SuiteRun, overwrite: bool = False, logger: Logger | None = None) -> SuiteOutcome:
    """Run the suite: per scene, gsrecon then each peer, each recorded once finished; then the tables and the plot.

    Raises:
        InputError: what :func:`check_request` and :func:`prepare_out` refuse.
    """
    logger = logger or Logger()
    check_request(run)
    prepare_out(run, overwrite)
    records: dict[str, list[dict[str, Any]]] = {}
    for name in run.scenes:
        done = run.out / name / "metrics.json"
        if done.is_file():
            logger.info(f"{name}: finished earlier ({done}), kept")
            records[name] = json.loads(done.read_text())["runs"]
            continue
        scene_records = []
        for trainer in ("gsrecon", *run.peers):
            record, stop = _trained(run, name, trainer, logger)
            if stop is not None:
                return SuiteOutcome(records, [], *stop)
            scene_records.append(record)
        write_json(done, {"scene": name, "suite": run.suite.name, "runs": scene_records})
        records[name] = scene_records
    return SuiteOutcome(records, write_results(run, records))


def _trained(
    run: SuiteRun, scene: str, trainer: str, logger: Logger
) -> tuple[dict[str, Any], tuple[str, int | None] | None]:
    """One trainer's record of one scene (read back where an earlier call finished it), or why training stopped."""
    path = run.out / scene / f"{trainer}.json"
    if path.is_file():
        return json.loads(path.read_text()), None
    logger.info(f"{scene}: training with {trainer}, {run.steps} steps")
    if trainer == "gsrecon":
        record, stop = _train_gsrecon(run, scene, logger)
        if stop is not None:
            return {}, stop
    elif trainer == "gsplat":
        record = _train_gsplat(run, scene)
    else:
        record = _train_opensplat(run, scene, logger)
    write_json(path, record)
    return record, None


def _gsrecon_overrides(run: SuiteRun, scene: str) -> list[str]:
    """The key=value pairs of one scene's gsrecon run: the protocol's data, the schedule, the run's length and
    outputs, then the user's."""
    exp_dir = run.out / scene / "gsrecon"
    overrides = run.suite.data_overrides(run.data, run.suite.scene(scene))
    if run.schedule == "3dgs":
        bench = bench_vs_gsplat()
        setup = bench.Setup("", run.out, run.steps, factor=1, cap_max=run.cap_max, gsplat_examples=Path())
        overrides += bench.gsrecon_overrides(setup, bench.Run("gsrecon", run.strategy, run.seed))
    elif run.strategy == "mcmc":
        overrides.append(f"strategy={{name: mcmc, cap_max: {run.cap_max}}}")
    interval = run.val_interval
    overrides += [
        f"exp_dir={exp_dir}", f"seed={run.seed}", f"max_steps={run.steps}", f"val_interval={interval}",
        "writers=[{name: JsonlWriter}]", f"hooks.IterTimerHook.log_interval={math.gcd(interval, run.steps)}",
        f"hooks.CheckPointHook.interval={interval}",
    ]  # fmt: skip
    return [*overrides, *run.overrides]


def _train_gsrecon(run: SuiteRun, scene: str, logger: Logger) -> tuple[dict[str, Any], tuple[str, int | None] | None]:
    import torch

    from gsrecon.bench.scoring import reference_scores
    from gsrecon.engine.inference import load_trained_scene
    from gsrecon.engine.resolve import load_run_config
    from gsrecon.engine.run_dir import RunDir
    from gsrecon.engine.scene_eval import evaluate
    from gsrecon.engine.trainer import DefaultTrainer

    cfg, source = load_run_config(run.config, _gsrecon_overrides(run, scene))
    exp_dir = Path(cfg.exp_dir)
    resumed = RunDir(exp_dir).latest_checkpoint() is not None
    if resumed:
        cfg.resume = True
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    load_before = os.getloadavg()[0]
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    # A run folder without a checkpoint is this suite's own start that died before one: started again.
    trainer = DefaultTrainer(cfg, source=source, overwrite=not resumed and exp_dir.is_dir())
    trainer.train()
    if trainer.stop_reason is not None:
        return {}, (f"{scene}: {trainer.stop_reason}", trainer.stop_signal)
    wall, cpu = time.perf_counter() - start_wall, time.process_time() - start_cpu
    threads = torch.get_num_threads()
    load_after = os.getloadavg()[0]
    eval_dir = run.out / scene / "eval"
    result = evaluate(load_trained_scene(exp_dir=str(exp_dir)), eval_dir, device=cfg.device, logger=logger)
    scores, notes = reference_scores(eval_dir)
    mean = result["mean"]
    return {
        "trainer": "gsrecon", "steps": run.steps, "psnr": mean["psnr"], "ssim": mean["ssim"], "lpips": mean["lpips"],
        **scores, "train_s": _last_scalar(exp_dir, "time/total_s"), "wall_s": wall, "cpu_s": cpu,
        "gaussians": result["num_gaussians"], "peak_gpu_gib": _peak_gpu_gib(), "peak_rss_gib": _peak_rss_gib(),
        "threads": threads, "load_before": load_before, "load_after": load_after, "resumed": resumed,
        "curve": psnr_curve(exp_dir), "notes": notes, "resolution": result["resolution"],
    }, None  # fmt: skip


def _train_gsplat(run: SuiteRun, scene: str) -> dict[str, Any]:
    factor = check_scene(run.suite, run.data, run.suite.scene(scene))
    load_before = os.getloadavg()[0]
    record = run_gsplat(
        run.peer_setup,
        run.data / scene,
        factor,
        run.steps,
        run.strategy,
        run.cap_max,
        run.out / scene / "gsplat",
        run.seed,
    )
    return {"trainer": "gsplat", "steps": run.steps, **record, "load_before": load_before,
            "load_after": os.getloadavg()[0], "notes": ["LPIPS: simple_trainer.py's torchmetrics alex"]}  # fmt: skip


def _train_opensplat(run: SuiteRun, scene: str, logger: Logger) -> dict[str, Any]:
    """OpenSplat on the scene's training views, scored by gsrecon on the protocol's test views from its PLY (with
    the config of the scene's gsrecon run, which holds the protocol's data settings)."""
    from gsrecon.engine.inference import load_trained_scene
    from gsrecon.engine.scene_eval import evaluate

    gsrecon_run = json.loads((run.out / scene / "gsrecon.json").read_text())
    eval_names = {path.stem for path in (run.out / scene / "eval" / "gt").glob("*.png")}
    folder = run.data / scene
    test_names = {p.name for p in (folder / "images").iterdir() if p.stem in eval_names}
    factor = check_scene(run.suite, run.data, run.suite.scene(scene))
    train_scene = train_only_scene(folder, test_names, run.out / scene / "opensplat_scene")
    load_before = os.getloadavg()[0]
    ply, wall = run_opensplat(run.peer_setup, train_scene, factor, run.steps, run.out / scene / "opensplat")
    config = str(run.out / scene / "gsrecon" / "config.yaml")
    scored = load_trained_scene(ply=str(ply), config=config)
    result = evaluate(scored, run.out / scene / "opensplat_eval", logger=logger)
    mean = result["mean"]
    return {
        "trainer": "opensplat", "steps": run.steps, "psnr": mean["psnr"], "ssim": mean["ssim"], "lpips": mean["lpips"],
        "wall_s": wall, "gaussians": result["num_gaussians"], "load_before": load_before,
        "load_after": os.getloadavg()[0], "threads": gsrecon_run.get("threads"),
        "notes": ["scored by gsrecon eval from OpenSplat's PLY"],
    }  # fmt: skip


def _scalars(exp_dir: Path, name: str) -> dict[int, float]:
    """``{step: value}`` of one scalar of a run's scalars.jsonl (later records win)."""
    path = exp_dir / "scalars.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return {r["step"]: r["value"] for r in records if r["name"] == name}


def _last_scalar(exp_dir: Path, name: str) -> float | None:
    values = _scalars(exp_dir, name)
    return values[max(values)] if values else None


def psnr_curve(exp_dir: Path) -> list[tuple[float, float]]:
    """(training seconds, validation PSNR) at each validation of a run, in step order."""
    seconds, psnr = _scalars(exp_dir, "time/total_s"), _scalars(exp_dir, "val/psnr")
    return [(seconds[step], psnr[step]) for step in sorted(psnr) if step in seconds]


def _peak_gpu_gib() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def _peak_rss_gib() -> float:
    """The process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
