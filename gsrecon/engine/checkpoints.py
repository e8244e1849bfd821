"""What a checkpoint holds, writing one atomically and reading one safely.

A checkpoint is a plain dict saved with ``torch.save`` and read with ``weights_only=True``: tensors,
numbers, strings and containers only, so loading one never imports or runs code. It holds
everything a bit-identical resume needs: the step, the Gaussian parameters, optimiser and
scheduler states, the strategy's state, each hook's state (by hook key), the RNG states, the
resolved config and the scene extent.
"""

from __future__ import annotations

import itertools
import pickle
import random
import resource
import shutil
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gsrecon.atomic import atomic_path
from gsrecon.config import ConfigError, check_config_data
from gsrecon.engine.run_dir import RunDir
from gsrecon.errors import InputError
from gsrecon.model.views.base import current_shape
from gsrecon.optim import load_optimizer_state
from gsrecon.params import check_params

if TYPE_CHECKING:
    from gsrecon.engine.hook import Hook, TrainerView
    from gsrecon.optim import LRScheduler, Optimizer

CHECKPOINT_VERSION = 1


def capture(trainer: TrainerView) -> dict[str, Any]:
    """The checkpoint dict of a trainer's state. It references the live tensors (a copy of the parameters would
    cost their size again at millions of Gaussians): write it before training goes on."""
    params = {k: v.detach() for k, v in trainer.model.params.items()}
    return {
        **scene_checkpoint(params, trainer.step, trainer.resolved_config, trainer.scene_extent),
        "optimizers": {k: o.state_dict() for k, o in trainer.optimizers.items()},
        "schedulers": {k: s.state_dict() for k, s in trainer.schedulers.items()},
        "strategy": {k: v for k, v in trainer.strategy_state.items() if v is not None},
        "views": trainer.views.state_dict(),
        "hooks": {key: hook.state_dict() for key, hook in trainer.hooks.items()},
    }


def scene_checkpoint(
    params: dict[str, torch.Tensor], step: int, config: dict[str, Any], extent: float
) -> dict[str, Any]:
    """A checkpoint of Gaussians ``params`` trained ``step`` steps under the resolved ``config``, with no state of a
    run to resume (empty optimisers, schedulers, strategy, per-view modules and hooks): what ``gsrecon eval``,
    ``export``, ``render`` and ``view`` read, e.g. of blocks merged into one scene. :func:`capture` adds the rest."""
    return {
        "version": CHECKPOINT_VERSION,
        "step": step,
        "params": params,
        "optimizers": {},
        "schedulers": {},
        "strategy": {},
        "views": {},
        "hooks": {},
        "rng": {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "python": random.getstate(),
        },
        "config": config,
        "scene_extent": extent,
    }


def check_version(checkpoint: dict[str, Any]) -> None:
    if checkpoint.get("version") != CHECKPOINT_VERSION:
        raise InputError(f"checkpoint version {checkpoint.get('version')} is not {CHECKPOINT_VERSION}")


def restore_optimization(
    checkpoint: dict[str, Any],
    optimizers: Mapping[str, Optimizer],
    schedulers: Mapping[str, LRScheduler],
    step: int,
) -> list[str]:
    """Load the optimiser and scheduler states into optimisers and schedulers built from this run's config.

    Where this config's learning rate, Adam settings or schedule of a group differ from the saved
    ones, the group keeps its Adam moments and follows this config's schedule from ``step`` on, as
    if the run had used it from the start. Returns the names of those groups.

    Raises:
        InputError: the checkpoint holds an optimiser this run has not, or state that does not fit its parameter
            (named by its key in the checkpoint, ``optimizers.means.state.0.exp_avg``).
    """
    fresh = {name: _settings(o.param_groups[0]) for name, o in optimizers.items()}  # this config's, at step 0
    fresh_schedules = {name: s.state_dict() for name, s in schedulers.items()}
    for name, state in checkpoint["optimizers"].items():
        if name not in optimizers:
            raise InputError(f"optimizers.{name}: this run has no optimiser '{name}' (it has {', '.join(optimizers)})")
        load_optimizer_state(optimizers[name], state, f"optimizers.{name}")
    for name, state in checkpoint["schedulers"].items():
        if name in schedulers:
            schedulers[name].load_state_dict(state)
    saved_gammas = {name: state.get("gamma") for name, state in checkpoint["schedulers"].items()}
    changed = [
        name
        for name, optimizer in optimizers.items()
        if _settings(optimizer.param_groups[0], "initial_lr") != fresh[name]
        or saved_gammas.get(name) != fresh_schedules.get(name, {}).get("gamma")
    ]
    for name in changed:
        group = optimizers[name].param_groups[0]
        group.update(fresh[name])
        group.pop("initial_lr", None)
        if name in schedulers:
            group["initial_lr"] = group["lr"]
            schedulers[name].load_state_dict(fresh_schedules[name])
            for _ in range(step):
                schedulers[name].step()
    return changed


def unrestored_warnings(path: Path | str, optimizers: Mapping[str, Optimizer]) -> list[str]:
    """What a resume from ``path`` says of each of ``optimizers`` that holds no state for one of its parameters
    (its moments start at zero)."""
    return [
        f"{path} holds no optimiser state of {name}: its Adam moments start at zero (not an exact resume)"
        for name, optimizer in optimizers.items()
        if any(not optimizer.state.get(param) for group in optimizer.param_groups for param in group["params"])
    ]


def _settings(group: dict[str, Any], lr_key: str = "lr") -> dict[str, Any]:
    """An optimiser group's hyperparameters, its learning rate read from ``lr_key`` (``initial_lr``: before decay)."""
    settings = {k: v for k, v in group.items() if k not in ("params", "lr", "initial_lr")}
    settings["lr"] = group.get(lr_key, group["lr"])
    return settings


def restore_strategy_state(checkpoint: dict[str, Any], state: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """A strategy's fresh ``state`` updated with the saved one, its tensors moved to ``device``."""
    return {**state, **{k: v.to(device) if torch.is_tensor(v) else v for k, v in checkpoint["strategy"].items()}}


def restore_hooks(checkpoint: dict[str, Any], hooks: Mapping[str, Hook]) -> None:
    """Give each hook the state saved under its key (hooks new to this run keep their initial state)."""
    states = checkpoint.get("hooks", {})
    for key, hook in hooks.items():
        if key in states:
            hook.load_state_dict(states[key])


def restore_rng(checkpoint: dict[str, Any]) -> None:
    """Put the torch, CUDA and Python RNGs back where they were when the checkpoint was taken."""
    rng = checkpoint["rng"]
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    version, internal, gauss = rng["python"]  # random.setstate needs tuples; the file may hold lists
    random.setstate((version, tuple(internal), gauss))


def find_resume(
    resume: Any,
    run_dir: RunDir,
    model_entry: dict[str, Any],
    structural: tuple[str, ...],
    source: str,
    warn: Callable[[str], None],
) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint a run's ``resume`` names, read and checked against the run's model; None for a
    new run. ``resume: true`` takes the run folder's newest readable checkpoint: an unreadable one (a
    truncated ``last.pt``) is passed over with a warning."""
    if resume is False or resume is None:
        return None
    candidates = [Path(resume)] if isinstance(resume, str) else run_dir.checkpoint_files()
    if not candidates:
        raise ConfigError(
            f"{source}: nothing to resume: no checkpoint in {run_dir.checkpoints}; "
            f"drop --resume (resume: true) to start a new run"
        )
    path, checkpoint = first_readable(candidates, warn)
    check_resumable(checkpoint, model_entry, structural, path, source)
    broken = non_finite(checkpoint["params"])
    if broken:
        raise ConfigError(
            f"{source}: cannot resume {path}: Gaussian parameters {', '.join(broken)} are not finite; "
            f"resume from an earlier checkpoint (--config ... resume=<path to a step_*.pt>)"
        )
    return path, checkpoint


def first_readable(candidates: list[Path], warn: Callable[[str], None]) -> tuple[Path, dict[str, Any]]:
    """The first of ``candidates`` that reads as a checkpoint, ``warn`` saying which were passed over (the last
    one's error is raised)."""
    for path, fallback in itertools.pairwise(candidates):
        try:
            return path, load_checkpoint_file(path, "cpu")
        except ValueError as exc:
            warn(f"passing over {path}: {exc}; trying {fallback.name}")
    return candidates[-1], load_checkpoint_file(candidates[-1], "cpu")


def check_resumable(
    checkpoint: dict[str, Any], model_entry: dict[str, Any], structural: tuple[str, ...], path: Path, source: str
) -> None:
    """Refuse a checkpoint whose model differs in a key that decides the parameters' shapes."""
    old_model = checkpoint.get("config", {}).get("model", {})
    for key in structural:
        if key in old_model and old_model[key] != model_entry.get(key):
            raise ConfigError(
                f"{source}: cannot resume {path}: it was trained with model.{key}={old_model[key]} but "
                f"this config has model.{key}={model_entry.get(key)}; set model.{key}={old_model[key]}"
            )


def resume_notes(path: Path, checkpoint: dict[str, Any], config: dict[str, Any], max_steps: int) -> list[str]:
    """The log lines of a resume from ``path``: where it goes on, what changed since, whether steps are left."""
    step = int(checkpoint["step"])
    stored = checkpoint.get("config", {})
    old = current_shape(stored)  # a checkpoint of the old views shape compares as the new
    lines = [f"resumed from {path} at step {step}", *describe_changes(old, config)]
    if old is not stored:
        lines.append(f"{path}'s config has the old top-level appearance:/pose_opt: sections: read as views: entries")
    if step >= max_steps:
        lines.append(f"the checkpoint is already at max_steps ({max_steps}); raise max_steps to go on")
    return lines


def describe_changes(old_config: dict[str, Any], new_config: dict[str, Any]) -> list[str]:
    """Log lines for a resume: the settings that changed since the checkpoint, apart from those that
    only shape a new model (``model.init*``), which a resume cannot apply."""
    changes = changed_settings(old_config, new_config)
    unused = [c for c in changes if c.startswith("model.init")]
    lines = []
    for label, items in (
        ("resuming with changed settings", [c for c in changes if c not in unused]),
        ("not applied on a resume (they only shape a new model)", unused),
    ):
        if items:
            shown = ", ".join(items[:8]) + (f" and {len(items) - 8} more" if len(items) > 8 else "")
            lines.append(f"{label}: {shown}")
    return lines


def changed_settings(old: Any, new: Any, prefix: str = "") -> list[str]:
    """``key: old -> new`` for every leaf of two nested configs that differs."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = list(old) + [k for k in new if k not in old]
        return [c for k in keys for c in changed_settings(old.get(k), new.get(k), f"{prefix}{k}.")]
    return [] if old == new else [f"{prefix[:-1]}: {old} -> {new}"]


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, quota, file-size limit); the previous one is intact."""


def save_checkpoint(checkpoint: dict[str, Any], path: Path) -> None:
    """``torch.save`` into ``path`` atomically; a failed write raises :class:`CheckpointWriteError`
    naming the file and the space it needed, and leaves any previous ``path`` as it was."""
    with atomic_path(path) as tmp:
        write_checkpoint(checkpoint, tmp, path)


def write_checkpoint(checkpoint: dict[str, Any], tmp: Path, path: Path) -> None:
    """``torch.save`` into ``tmp``, the temporary file of ``path`` (:mod:`gsrecon.atomic`); a failed write raises
    :class:`CheckpointWriteError` naming ``path`` and the space it needed."""
    try:
        torch.save(checkpoint, tmp)
    except (OSError, RuntimeError) as exc:
        # torch's zip writer reports a failed write as a RuntimeError from its C++ checks ("enforce fail").
        if isinstance(exc, RuntimeError) and not any(word in str(exc) for word in ("enforce fail", "write")):
            raise
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "the write failed"
        needed = sum(t.numel() * t.element_size() for t in _tensors(checkpoint)) / 2**20
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        # Python ignores SIGXFSZ, so a write past ``ulimit -f`` fails with EFBIG, which torch's writer does not pass on
        if limit != resource.RLIM_INFINITY and (needed * 2**20 >= limit or _size(tmp) >= limit):
            raise CheckpointWriteError(
                f"cannot write {path}: File too large: it needs about {needed:.1f} MiB and the process's file-size "
                f"limit (ulimit -f) is {limit / 2**20:.1f} MiB; raise the limit (ulimit -f unlimited) and resume"
            ) from None
        free = shutil.disk_usage(path.parent).free / 2**20
        raise CheckpointWriteError(
            f"cannot write {path}: {reason} (it needs about {needed:.1f} MiB; {free:.1f} MiB free there); "
            f"free some space (or lower CheckPointHook max_keep) and resume"
        ) from None


def _size(path: Path) -> int:
    """``path``'s size in bytes; 0 where it does not exist."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def load_checkpoint_file(path: str | Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    """Read a checkpoint safely (``weights_only=True``); a clear error for files that are not checkpoints.

    The file is memory-mapped (copy on write): only the tensors a caller touches are read into
    memory, so loading the parameters does not also load the optimiser state.
    """
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=True, mmap=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint not found: {path}") from None
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, pickle.UnpicklingError) as exc:
        raise InputError(f"{path} is truncated or not a PyTorch checkpoint ({type(exc).__name__})") from None
    stored = checkpoint.get("params") if isinstance(checkpoint, dict) else None
    if not isinstance(stored, Mapping) or "step" not in checkpoint:
        raise InputError(f"{path} is not a gsrecon checkpoint (no 'params'/'step' entries)")
    check_config_data(checkpoint.get("config", {}), f"{path} (stored config)")
    try:
        check_params(stored)
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None
    return checkpoint


_FINITE_CHECK_ROWS = 1 << 16  # rows `non_finite` checks at once: isfinite makes a float and three bool temporaries


def non_finite(params: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of the tensors in ``params`` holding NaN or infinite values (empty when all are finite)."""
    return [name for name, value in params.items() if not _all_finite(value)]


def _all_finite(value: torch.Tensor) -> bool:
    """Whether every element of ``value`` is finite."""
    rows = value.reshape(-1) if value.dim() == 0 else value
    return all(bool(torch.isfinite(chunk).all()) for chunk in rows.split(_FINITE_CHECK_ROWS))
