"""Trained levels of detail of a run: ``gsrecon lod``.

Level 0 is the run's trained scene. Level ``k`` (1..K) is level ``k - 1`` with neighbours merged in pairs by
moment matching (:func:`gsrecon.export.lod.merge.halve`), then trained alone on the training photos at
``scale**k`` times the run's ``data.factor`` for ``steps`` steps, by the run's own trainer and config
(:func:`gsrecon.engine.tuning.tuning_config`: renderer, device, threads, loss and per-view modules; no
densification), its per-view modules starting from the run's trained ones where their shapes match (a merged block
run has none: they start untrained). One level is in memory at a time.

``<exp_dir>/lod/level_<k>/`` holds the level's merged start (``merged.ply``) and its training run (``run/``);
``<exp_dir>/lod/levels.json`` records each finished level (Gaussians, factor, steps, test PSNR, CPU seconds, peak
memory), the cameras' region and what was asked (levels, steps, scale); it is written before the first level is
trained and rewritten after each, so that a build stopped part-way is known as unfinished. A level whose record
matches what is asked is kept; an interrupted level resumes from its run's checkpoint where that stopped before the
level's steps at the level's factor (one at or past them, or at another factor, is trained anew), and everything
after a level built anew is built anew. The run's lock is held meanwhile: no other process trains it.
"""

from __future__ import annotations

import dataclasses
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from gsrecon.atomic import write_json
from gsrecon.data.formats.images import FACTORS
from gsrecon.data.pipeline import read_scene
from gsrecon.distributed import DistributedContext
from gsrecon.engine.checkpoints import load_checkpoint_file
from gsrecon.engine.inference import TrainedScene
from gsrecon.engine.resolve import RunConfig
from gsrecon.engine.run_dir import RunDir
from gsrecon.engine.runtime import resolve_device
from gsrecon.engine.tuning import place_start, tuning_config
from gsrecon.errors import InputError
from gsrecon.export.lod.merge import halve
from gsrecon.export.lod.site import CameraRegion
from gsrecon.geometry import camera_centers
from gsrecon.lod.config import LodConfig
from gsrecon.logging.console import Logger
from gsrecon.losses.ssim import WINDOW
from gsrecon.records import ListOf, MayLack, read_record

LOD_DIR = "lod"
LEVELS_FILE = "levels.json"
_LEVEL_RECORD = {
    "level": int,
    "factor": int,
    "steps": int,
    "gaussians": int,
    "psnr": (float, None),
    "cpu_seconds": float,
}
_LEVELS_SCHEMA = {
    "source_step": (int, None),
    "camera_region": (None, {"center": ListOf(float, 3), "radius": float}),
    MayLack("asked"): {"levels": int, "steps": int, "scale": int},  # older records: what they hold was asked
    "levels": ListOf(_LEVEL_RECORD),
}


@dataclass
class LodOutcome:
    """What :func:`build_levels` did: the levels' records, and why it stopped early (a signal) if it did."""

    records: list[dict[str, Any]]
    stop_reason: str | None = None
    stop_signal: int | None = None

    def report(self) -> list[str]:
        """What the command line says."""
        if self.stop_reason:
            return [f"{self.stop_reason}; run gsrecon lod again to resume"]
        return [
            f"level {r['level']}: {r['gaussians']} Gaussians at data.factor {r['factor']}, "
            f"{'no test PSNR' if r['psnr'] is None else 'test PSNR ' + format(r['psnr'], '.2f')} "
            f"({r['cpu_seconds']:.0f} CPU s{', kept' if r.get('kept') else ''})"
            for r in self.records
        ]


def lod_dir(exp_dir: str | Path) -> Path:
    """Where a run's levels are built: ``<exp_dir>/lod``."""
    return Path(exp_dir) / LOD_DIR


def read_levels(exp_dir: str | Path) -> dict[str, Any] | None:
    """The run's ``levels.json``, or None where no level was built; raises RecordError naming the file and the key
    where it does not read back as gsrecon writes it."""
    path = lod_dir(exp_dir) / LEVELS_FILE
    if not path.exists():
        return None
    fix = f"remove it, and gsrecon lod --exp-dir {exp_dir} builds the levels again"
    return read_record(path, _LEVELS_SCHEMA, fix)


def level_loaders(scene: TrainedScene, exp_dir: str | Path, levels: int) -> list[Callable[[], dict[str, Tensor]]]:
    """Loaders of levels 0..``levels`` of the run: its trained scene, then each level's newest checkpoint."""

    def load(level: int) -> dict[str, Tensor]:
        found = RunDir(lod_dir(exp_dir) / f"level_{level}" / "run").latest_checkpoint()
        if found is None:
            raise InputError(f"{exp_dir}: level {level} has no checkpoint; run gsrecon lod --exp-dir {exp_dir}")
        return {k: v.float() for k, v in load_checkpoint_file(found)["params"].items()}

    return [lambda: scene.params, *[lambda level=level: load(level) for level in range(1, levels + 1)]]


def level_factor(base: int, scale: int, level: int, shortest: int) -> int:
    """The ``data.factor`` level ``level`` trains at: ``base * scale**level``, at most the largest of FACTORS; the
    halving stops (the factor of the level before) where the shortest side of the training photos, ``shortest``
    pixels at ``base``, would get under the SSIM window's reach (6 px: each window reaches 5 px to either side; under
    it a level's D-SSIM sees mostly reflected borders)."""
    factor = min(base * scale**level, FACTORS[-1])
    while factor > base and shortest * base / factor < WINDOW // 2 + 1:
        factor //= scale
    return factor


def build_levels(
    scene: TrainedScene,
    exp_dir: str | Path,
    lod: LodConfig,
    device: str = "auto",
    logger: Logger | None = None,
    held: bool = False,
) -> LodOutcome:
    """Build (or keep, or resume) levels 1..``lod.levels`` of the run in ``exp_dir`` whose trained scene is ``scene``
    (see the module docstring), holding the run's lock meanwhile (unless the caller ``held`` it: the run's training,
    exporting the site when it ends).

    Raises InputError for a ``device`` this machine lacks, or a run another process holds (its lock), before
    anything is written."""
    cfg = scene.cfg if device == "auto" else dataclasses.replace(scene.cfg, device=device)
    resolve_device(cfg.device, DistributedContext())
    if held:
        return _build_levels(scene, exp_dir, lod, cfg, logger or Logger())
    run_dir = RunDir(exp_dir, "gsrecon lod")
    run_dir.lock()
    try:
        return _build_levels(scene, exp_dir, lod, cfg, logger or Logger())
    finally:
        run_dir.release()


def _build_levels(
    scene: TrainedScene, exp_dir: str | Path, lod: LodConfig, cfg: RunConfig, logger: Logger
) -> LodOutcome:
    from gsrecon.engine.trainer import DefaultTrainer

    folder = lod_dir(exp_dir)
    previous = read_levels(exp_dir) or {}
    recorded = previous.get("levels", []) if previous.get("source_step") == scene.step else []
    region = previous.get("camera_region")
    shortest = min(
        min(frame.width, frame.height) for frame in read_scene(dataclasses.replace(cfg.data, cache="disk")).train
    )
    asked = [
        {"level": level, "factor": level_factor(cfg.data.factor, lod.scale, level, shortest), "steps": lod.steps}
        for level in range(1, lod.levels + 1)
    ]
    kept = 0  # the levels kept: the first ones whose record matches what is asked and whose run has a checkpoint
    for old, wanted in zip(recorded, asked):
        run = folder / f"level_{wanted['level']}" / "run"
        if any(old[k] != v for k, v in wanted.items()) or RunDir(run).latest_checkpoint() is None:
            break
        kept += 1
    records = [{**old, "kept": True} for old in recorded[:kept]]
    _write_levels(exp_dir, scene, region, records, lod)  # before any training: a build stopped part-way is known
    params: dict[str, Tensor] = level_loaders(scene, exp_dir, kept)[kept]()
    for wanted in asked[kept:]:
        level, factor = wanted["level"], wanted["factor"]
        run = folder / f"level_{level}" / "run"
        start_cpu, start_wall = _cpu_seconds(), time.perf_counter()
        merged = halve(params)
        del params
        same_start = place_start(merged, folder / f"level_{level}" / "merged.ply", run, scene.antialiased)
        stopped = _stopped_at(run) if same_start else None
        resume = stopped is not None and stopped[0] < lod.steps and stopped[1] == factor
        if stopped is not None and not resume:
            logger.info(
                f"level {level}: its run is at step {stopped[0]} at data.factor {stopped[1]}, not before step "
                f"{lod.steps} at data.factor {factor}: trained anew"
            )
        level_cfg = tuning_config(
            cfg, folder / f"level_{level}" / "merged.ply", run, lod.steps, resume,
            data=dataclasses.replace(cfg.data, factor=factor), hooks=_level_hooks(cfg.hooks),
        )  # fmt: skip
        source = f"{exp_dir} (level of detail {level})"
        trainer = DefaultTrainer(level_cfg, source, overwrite=not resume, logger=logger)
        if not resume:  # a resumed level has its own per-view state in its checkpoint
            untrained = trainer.views.start_from(scene.views)
            if untrained:
                logger.info(f"level {level}: per-view modules {', '.join(untrained)} start untrained (not in the run)")
        trainer.train()
        if trainer.stop_reason:
            return LodOutcome(records, f"level {level} stopped: {trainer.stop_reason}", trainer.stop_signal)
        if region is None:
            centers = camera_centers(trainer.datapipeline.scene.train_cameras.viewmats)  # [F, 3]
            region = dataclasses.asdict(CameraRegion.of(centers.cpu()))
        params = {name: value.detach().cpu() for name, value in trainer.model.params.items()}
        records.append(
            {
                **wanted,
                "gaussians": len(params["means"]),
                "psnr": trainer.val_metrics.get("psnr"),
                "cpu_seconds": _cpu_seconds() - start_cpu,
                "wall_seconds": time.perf_counter() - start_wall,
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
        del trainer
        logger.info(f"level {level}: {len(params['means'])} Gaussians at data.factor {factor}")
        _write_levels(exp_dir, scene, region, records, lod)
    return LodOutcome(records)


def _level_hooks(hooks: Any) -> Any:
    """A level's hooks: the run's, less an ``ExportHook`` writing the ``lod`` site (a level is part of the site the run
    exports, not a run with levels of its own)."""
    if not isinstance(hooks, dict):
        return hooks
    return {
        key: None if entry and entry.get("name", key) == "ExportHook" and entry.get("format") == "lod" else entry
        for key, entry in hooks.items()
    }


def _stopped_at(run: Path) -> tuple[int, int | None] | None:
    """The step and ``data.factor`` of the newest checkpoint of the level's run in ``run``; None where it has no
    readable one."""
    found = RunDir(run).latest_checkpoint()
    if found is None:
        return None
    try:
        checkpoint = load_checkpoint_file(found)
    except InputError:
        return None
    return int(checkpoint["step"]), checkpoint.get("config", {}).get("data", {}).get("factor")


def camera_region(exp_dir: str | Path) -> CameraRegion | None:
    """The cameras' region recorded in the run's ``levels.json`` (None: no levels built)."""
    recorded = (read_levels(exp_dir) or {}).get("camera_region")
    return None if recorded is None else CameraRegion(tuple(recorded["center"]), recorded["radius"])


def built_levels(exp_dir: str | Path, step: int | None) -> int:
    """How many levels below the trained scene (at ``step``) the run's ``levels.json`` records as built.

    Raises InputError where the build it records stopped before the last level it was asked for (a site of fewer
    levels than asked would say nothing of it)."""
    recorded = read_levels(exp_dir) or {}
    if recorded.get("source_step") != step:
        return 0
    done, asked = len(recorded["levels"]), recorded.get("asked")
    if asked is not None and done < asked["levels"]:
        again = f"gsrecon lod --exp-dir {exp_dir} --steps {asked['steps']} --scale {asked['scale']} --levels"
        keep = f", or keep the {done} finished with {again} {done}" if done else ""
        raise InputError(
            f"{lod_dir(exp_dir) / LEVELS_FILE}: level {done + 1} of the {asked['levels']} levels gsrecon lod was asked "
            f"for is unfinished (the build was stopped); finish it with {again} {asked['levels']}{keep}"
        )
    return done


def _write_levels(
    exp_dir: str | Path,
    scene: TrainedScene,
    region: dict[str, Any] | None,
    records: Sequence[dict[str, Any]],
    lod: LodConfig,
) -> None:
    write_json(
        lod_dir(exp_dir) / LEVELS_FILE,
        {
            "source_step": scene.step,
            "camera_region": region,
            "asked": {"levels": lod.levels, "steps": lod.steps, "scale": lod.scale},
            "levels": [{k: v for k, v in r.items() if k != "kept"} for r in records],
        },
    )


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children (a kernel build) so far."""
    usages = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(usage.ru_utime + usage.ru_stime for usage in usages)
