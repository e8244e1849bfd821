"""The documentation cannot lie: the site builds with warnings as errors, its API reference documents every
registry's base class, and every command of README's quickstart runs, as a user types it, on a tiny scene."""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from capture_layouts import colmap

from gsrecon import registry
from gsrecon.cli import main
from gsrecon.data.scene import Scene
from gsrecon.engine.hook import Hook
from gsrecon.export.base import ExportFormat
from gsrecon.logging.writers import Writer
from gsrecon.losses.base import LossTerm
from gsrecon.model.gaussians import GaussianModel
from gsrecon.model.views.base import ViewModule
from gsrecon.render.base import Renderer
from gsrecon.strategy.base import Strategy

ROOT = Path(__file__).resolve().parents[1]
DEADLINE_S = 120

# Each registry and the class a plugin extends to add an entry to it (a dataset reader has no base class: its
# read(data_cfg) returns a Scene, the value the reference documents).
BASE_CLASSES = {
    "HOOK_REGISTRY": Hook,
    "WRITER_REGISTRY": Writer,
    "DATASET_REGISTRY": Scene,
    "MODEL_REGISTRY": GaussianModel,
    "RENDERER_REGISTRY": Renderer,
    "STRATEGY_REGISTRY": Strategy,
    "LOSS_REGISTRY": LossTerm,
    "VIEW_REGISTRY": ViewModule,
    "EXPORT_REGISTRY": ExportFormat,
}

# The quickstart's runs, small: a few steps of a tiny scene on one CPU thread, no LPIPS weights needed.
TINY_RUN = [
    "max_steps=4",
    "val_interval=2",
    "device=cpu",
    "num_threads=1",
    "renderer.name=torch",
    "model.sh_degree=0",
    "metrics.lpips_net=none",
    "hooks.LogHook.progress=false",
    "hooks.LogHook.log_interval=1",
]
TINY_SYNTHETIC = ["data.synthetic.width=32", "data.synthetic.height=24", "data.synthetic.num_views=9",
                  "data.synthetic.num_points=300"]  # fmt: skip


def quickstart() -> list[list[str]]:
    """The commands of README's quickstart, each as its words (comments dropped)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"^## Quickstart\n.*?^```bash\n(.*?)^```", text, re.M | re.S)
    assert block, "README.md has no '## Quickstart' section with a bash block"
    return [shlex.split(line, comments=True) for line in block.group(1).splitlines() if line.strip()]


@pytest.mark.slow  # 14 s on the 2 loaded cores: CI's slow run (the default run stays under 5 min)
def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=DEADLINE_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    api = "".join(page.read_text() for page in (site / "api").rglob("*.html"))
    for name, base in BASE_CLASSES.items():
        assert f'id="{base.__module__}.{base.__qualname__}"' in api, f"the API reference lacks {name}'s {base}"
    assert ":meth:<code>" not in api and ":class:<code>" not in api  # docs/mkdocs_hooks.py shows the roles as code
    assert (site / "extending" / "hook" / "index.html").read_text().count("GaussianCountHook") >= 2  # the example


def test_every_registry_has_a_documented_base_class() -> None:
    registries = {name for name, value in vars(registry).items() if isinstance(value, registry.Registry)}
    assert registries == set(BASE_CLASSES), "a registry without its base class in BASE_CLASSES (and the API pages)"
    for name, base in BASE_CLASSES.items():
        if base is Scene:
            continue
        entries = getattr(registry, name)
        for entry in entries.names():
            assert issubclass(entries.get(entry), base), f"{name}'s '{entry}' is no {base.__name__}"


def _serve(command: list[str], cwd: Path, env: dict[str, str], url_pattern: str) -> tuple[subprocess.Popen, str]:
    """Start a server command; return it and the first URL matching ``url_pattern`` it prints (stdout or stderr)."""
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # Ctrl-C as a terminal delivers it
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    seen = []
    while True:
        try:
            line = lines.get(timeout=DEADLINE_S)
        except queue.Empty:
            proc.kill()
            raise AssertionError(f"{command[:3]} printed no URL: {''.join(seen)}") from None
        seen.append(line)
        found = re.search(url_pattern, line)
        if found:
            return proc, found.group(0)


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=DEADLINE_S) == 0


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=DEADLINE_S) as response:
        return response.read()


@pytest.mark.slow  # 24 s on the 2 loaded cores: CI's slow run (the default run stays under 5 min)
def test_the_readme_quickstart_runs(
    tmp_path: Path, synthetic_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("viser")  # gsrecon view's extra (in .[dev])
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    monkeypatch.chdir(tmp_path)  # outputs/ lands here, and the quickstart's relative paths read from here
    monkeypatch.setenv("GSRECON_CACHE", str(tmp_path / "cache"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    commands = quickstart()
    assert [words[:2] for words in commands] == [
        ["gsrecon", "train"], ["tensorboard", "--logdir"], ["gsrecon", "view"], ["gsrecon", "eval"],
        ["gsrecon", "export"], ["gsrecon", "train"],
    ], "the quickstart changed: say here how this test runs its new commands"  # fmt: skip
    for words in commands:
        program, args = words[0], words[1:]
        if program == "tensorboard":
            proc, url = _serve(
                [str(Path(sys.executable).with_name("tensorboard")), *args, "--port", "0"], tmp_path, env,
                r"http://localhost:\d+/",
            )  # fmt: skip
            tags = json.loads(_get(f"{url}data/plugin/scalars/tags"))
            assert any("train/loss" in run_tags for run_tags in tags.values()), tags
            _stop(proc)
        elif args[0] == "view":
            proc, url = _serve([sys.executable, "-m", "gsrecon", *args, "--port", "0"], tmp_path, env, r"http://\S+")
            assert b"<html" in _get(url).lower()
            _stop(proc)
        else:
            if args[0] == "train":
                data = args[args.index("--data") + 1] if "--data" in args else None
                if data:
                    colmap(tmp_path / data, synthetic_cache)  # a tiny COLMAP capture where the quickstart says
                tiny = [*TINY_SYNTHETIC, f"data.synthetic.cache_dir={synthetic_cache}"]
                args = [*args, *TINY_RUN, *([] if data else tiny)]
            code = main(args)
            out, err = capsys.readouterr()
            assert code == 0, f"{shlex.join(words)}: {out}{err}"
    assert (tmp_path / "outputs" / "synthetic" / "eval" / "metrics.json").is_file()
    assert (tmp_path / "scene.sog").stat().st_size > 0
    assert (tmp_path / "outputs" / "capture" / "point_cloud.ply").is_file()
