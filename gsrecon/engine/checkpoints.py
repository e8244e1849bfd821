"""Checkpoint files: finding the newest one of a run, reading one safely, and marking run folders."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

RUN_MARKER = ".gsrecon-run"  # in every exp_dir gsrecon created; `--overwrite` replaces only such folders


def latest_checkpoint(directory: Path) -> Path | None:
    """``last.pt`` in ``directory`` if present, else the ``step_*.pt`` with the highest step, else None."""
    if (directory / "last.pt").is_file():
        return directory / "last.pt"
    steps = sorted(directory.glob("step_*.pt"))
    return steps[-1] if steps else None


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


def non_finite(params: dict[str, torch.Tensor]) -> list[str]:
    """Names of the tensors in ``params`` holding NaN or infinite values (empty when all are finite)."""
    return [name for name, value in params.items() if not torch.isfinite(value).all()]
