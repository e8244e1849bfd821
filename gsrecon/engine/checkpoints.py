"""What a checkpoint holds, and reading one safely.

A checkpoint is a plain dict saved with ``torch.save`` and read with ``weights_only=True``: tensors,
numbers, strings and containers only, so loading one never imports or runs code. It holds
everything a bit-identical resume needs: the step, the Gaussian parameters, optimiser and
scheduler states, the strategy's state, each hook's state (by hook key), the RNG states, the
resolved config and the scene extent.
"""

from __future__ import annotations

import pickle
import random
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gsrecon.config import ConfigError
from gsrecon.engine.run_dir import RunDir

if TYPE_CHECKING:
    from gsrecon.hooks.base import Hook

CHECKPOINT_VERSION = 1


def capture(
    *,
    step: int,
    params: Mapping[str, torch.Tensor],
    optimizers: Mapping[str, torch.optim.Optimizer],
    schedulers: Mapping[str, Any],
    strategy_state: Mapping[str, Any],
    hooks: Mapping[str, Hook],
    config: dict[str, Any],
    scene_extent: float,
) -> dict[str, Any]:
    """The checkpoint dict of a training state (parameters are copied; the rest is referenced)."""
    return {
        "version": CHECKPOINT_VERSION,
        "step": step,
        "params": {k: v.detach().clone() for k, v in params.items()},
        "optimizers": {k: o.state_dict() for k, o in optimizers.items()},
        "schedulers": {k: s.state_dict() for k, s in schedulers.items()},
        "strategy": {k: v for k, v in strategy_state.items() if v is not None},
        "hooks": {key: hook.state_dict() for key, hook in hooks.items()},
        "rng": {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "python": random.getstate(),
        },
        "config": config,
        "scene_extent": scene_extent,
    }


def check_version(checkpoint: dict[str, Any]) -> None:
    if checkpoint.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"checkpoint version {checkpoint.get('version')} is not {CHECKPOINT_VERSION}")


def restore_optimization(
    checkpoint: dict[str, Any], optimizers: Mapping[str, torch.optim.Optimizer], schedulers: Mapping[str, Any]
) -> None:
    """Load the optimiser and scheduler states into optimisers built for the checkpoint's parameters."""
    for name, state in checkpoint["optimizers"].items():
        optimizers[name].load_state_dict(state)
    for name, state in checkpoint["schedulers"].items():
        if name in schedulers:
            schedulers[name].load_state_dict(state)


def restore_strategy_state(checkpoint: dict[str, Any], state: dict[str, Any], device: torch.device) -> None:
    """Update a strategy's fresh ``state`` with the saved one, its tensors moved to ``device``."""
    state.update({k: v.to(device) if torch.is_tensor(v) else v for k, v in checkpoint["strategy"].items()})


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
    resume: Any, run_dir: RunDir, model_entry: dict[str, Any], structural: tuple[str, ...], source: str
) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint a run's ``resume`` names (true: the run folder's newest), read and checked
    against the run's model; None for a new run."""
    if resume is False or resume is None:
        return None
    path = Path(resume) if isinstance(resume, str) else run_dir.latest_checkpoint()
    if path is None:
        raise ConfigError(
            f"{source}: nothing to resume: no checkpoint in {run_dir.checkpoints}; "
            f"drop --resume (resume: true) to start a new run"
        )
    checkpoint = load_checkpoint_file(path, "cpu")
    check_resumable(checkpoint, model_entry, structural, path, source)
    return path, checkpoint


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


def changed_settings(old: Any, new: Any, prefix: str = "") -> list[str]:
    """``key: old -> new`` for every leaf of two nested configs that differs."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = list(old) + [k for k in new if k not in old]
        return [c for k in keys for c in changed_settings(old.get(k), new.get(k), f"{prefix}{k}.")]
    return [] if old == new else [f"{prefix[:-1]}: {old} -> {new}"]


def load_checkpoint_file(path: str | Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    """Read a checkpoint safely (``weights_only=True``); a clear error for files that are not checkpoints."""
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint not found: {path}") from None
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, pickle.UnpicklingError) as exc:
        raise ValueError(f"{path} is truncated or not a PyTorch checkpoint ({type(exc).__name__})") from None
    if not isinstance(checkpoint, dict) or "params" not in checkpoint or "step" not in checkpoint:
        raise ValueError(f"{path} is not a gsrecon checkpoint (no 'params'/'step' entries)")
    return checkpoint


def non_finite(params: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of the tensors in ``params`` holding NaN or infinite values (empty when all are finite)."""
    return [name for name, value in params.items() if not torch.isfinite(value).all()]
