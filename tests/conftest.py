"""Shared fixtures: tiny, fast training configs on the built-in synthetic scene."""

from __future__ import annotations

import copy
import functools
import importlib.util
import math
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import yaml

from gsrecon.config import parse_structured
from gsrecon.engine.trainer import DefaultTrainer
from gsrecon.plugins import PLUGIN_PREFIX
from gsrecon.registry import HOOK_REGISTRY, LOSS_REGISTRY, VIEW_REGISTRY, Registry

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def random_gaussians(n: int = 5000, sh_degree: int = 3, seed: int = 0, scale: float = 0.04) -> dict[str, torch.Tensor]:
    """``n`` random Gaussians about 4 units down +z (in front of a camera at the origin), sizes about ``scale``, all
    SH bands non-zero."""
    g = torch.Generator().manual_seed(seed)
    n_rest = (sh_degree + 1) ** 2 - 1
    means = torch.randn(n, 3, generator=g) * torch.tensor([1.2, 0.9, 0.8]) + torch.tensor([0.0, 0.0, 4.0])
    return {
        "means": means,
        "scales": math.log(scale) + 0.5 * torch.randn(n, 3, generator=g),
        "quats": torch.randn(n, 4, generator=g),
        "opacities": torch.randn(n, generator=g),
        "sh0": 0.6 * torch.randn(n, 1, 3, generator=g),
        "shN": 0.2 * torch.randn(n, n_rest, 3, generator=g),
    }


def tiny_config(exp_dir: Path, cache_dir: Path, **top: Any) -> dict[str, Any]:
    """A config dict that trains in about a second on a CPU (32x24 images, 300 Gaussians)."""
    cfg: dict[str, Any] = {
        "exp_dir": str(exp_dir),
        "seed": 0,
        "device": "cpu",
        "num_threads": 1,  # fixed: auto threads follow the machine's load, and exact-resume tests compare runs
        "max_steps": 6,
        "val_interval": 3,
        "data": {
            "dataset": "synthetic",
            "synthetic": {
                "width": 32,
                "height": 24,
                "num_views": 9,
                "num_points": 300,
                "supersample": 2,
                "cache_dir": str(cache_dir),
            },
        },
        "model": {"sh_degree": 1, "sh_degree_interval": 3},
        "renderer": {"name": "torch"},
        "metrics": {"lpips_net": "none"},
        "writers": [{"name": "JsonlWriter"}],
        "hooks": {
            "IterTimerHook": {"log_interval": 1},
            "CheckInvalidLossHook": {},
            "LogHook": {"log_interval": 1, "progress": False},
            "MetricsHook": {},
            "CheckPointHook": {"interval": 3, "max_keep": 0},
            "ExportHook": {},
        },
    }
    cfg.update(copy.deepcopy(top))
    return cfg


@pytest.fixture(autouse=True)
def hook_registry() -> Registry:
    """The hook registry, scoped to one test: what a test (or a plugin it imports) registers is undone after it
    (so are the loss-term and per-view module registries), and the plugin files it imported through ``imports:`` are
    forgotten, so the next test naming one imports it afresh and finds its registrations."""
    plugins_before = {name for name in sys.modules if name.startswith(PLUGIN_PREFIX)}
    with HOOK_REGISTRY.scoped() as registry, LOSS_REGISTRY.scoped(), VIEW_REGISTRY.scoped():
        yield registry
    for name in [name for name in sys.modules if name.startswith(PLUGIN_PREFIX) and name not in plugins_before]:
        del sys.modules[name]


@pytest.fixture
def shared_data() -> Path:
    """``../shared/data`` beside the checkout (real captures for development); the test skips where it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is not available (it sits beside a developer's checkout, not a user's clone)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's ``chromium`` for the browser tests. It skips where Chromium is missing, but fails under
    ``GSRECON_REQUIRE_CHROMIUM=1`` (``.ci/run`` installs it and sets that, so CI never skips a browser test)."""
    path = shutil.which("chromium")
    if path is None:
        if os.environ.get("GSRECON_REQUIRE_CHROMIUM") == "1":
            pytest.fail("GSRECON_REQUIRE_CHROMIUM=1 but chromium is not on PATH (apt-get install chromium)")
        pytest.skip("needs chromium (apt-get install chromium)")
    return path


@pytest.fixture(scope="session")
def web_readers() -> Path:
    """The ``node_modules`` of the web formats' independent readers (``scripts/web_readers.sh``; or the folder
    ``GSRECON_WEB_READERS`` names): glTF-Validator, Babylon.js, splat-transform, the PlayCanvas engine. Run scripts
    with ``node`` and ``NODE_PATH`` set to it. The test skips where node or the folder is missing."""
    root = Path(os.environ.get("GSRECON_WEB_READERS", Path(__file__).resolve().parents[1] / ".web_readers"))
    if shutil.which("node") is None or not (root / "node_modules").is_dir():
        pytest.skip(f"needs node and the web readers in {root} (scripts/web_readers.sh)")
    return root / "node_modules"


@pytest.fixture(scope="session")
def synthetic_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("synthetic_cache")


@pytest.fixture
def make_config(tmp_path: Path, synthetic_cache: Path):
    """``make_config(name="run", **top_level_keys) -> dict``: a tiny config writing into ``tmp_path/name``."""

    def make(name: str = "run", **top: Any) -> dict[str, Any]:
        return tiny_config(tmp_path / name, synthetic_cache, **top)

    return make


@pytest.fixture
def make_trainer(make_config):
    """``make_trainer(name="run", **top_level_keys) -> DefaultTrainer`` built from a tiny config."""

    def make(name: str = "run", overwrite: bool = False, **top: Any) -> DefaultTrainer:
        cfg = parse_structured(DefaultTrainer.Config, make_config(name, **top))
        return DefaultTrainer(cfg, overwrite=overwrite)

    return make


SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@functools.cache
def script_module(name: str) -> ModuleType:
    """The module ``scripts/<name>.py``, imported once. A plugin registering hooks is imported inside the first test
    using it (the hooks it registers are undone after each test)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def read_scalars(exp_dir: Path, name: str) -> dict[int, float]:
    """``{step: value}`` of one scalar from a run's scalars.jsonl (later records win)."""
    import json

    records = [json.loads(line) for line in (Path(exp_dir) / "scalars.jsonl").read_text().splitlines()]
    return {r["step"]: r["value"] for r in records if r["name"] == name}
