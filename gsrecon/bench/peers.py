"""The peers a suite runs beside gsrecon on the same scenes, steps, images and test views: gsplat's
``simple_trainer.py`` (CUDA; its command line and stats files are scripts/bench_vs_gsplat.py's) and OpenSplat (CPU,
where built; scored by gsrecon on the protocol's test views from the PLY it writes)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from gsrecon.errors import InputError

PEERS = ("gsplat", "opensplat")
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"  # beside the package in a source checkout, as configs/


class PeerFailedError(InputError):
    """A peer's trainer failed (its log is named): the suite stops there, and resumes past what finished."""


@dataclass(frozen=True)
class PeerSetup:
    """Where the peers are: gsplat's examples/ (scripts/fetch_gsplat_examples.sh) and the opensplat binary."""

    gsplat_examples: Path = Path(".gsplat_examples")
    opensplat: str = "opensplat"  # a path, or a name on PATH
    python: str = sys.executable


def bench_vs_gsplat() -> ModuleType:
    """scripts/bench_vs_gsplat.py, which holds simple_trainer.py's command line and reads its stats files."""
    path = SCRIPTS / "bench_vs_gsplat.py"
    if not path.is_file():
        raise InputError(f"peer gsplat: {path} is missing (the gsplat peer runs from a source checkout of gsrecon)")
    module = sys.modules.get("bench_vs_gsplat")
    if module is None:
        spec = importlib.util.spec_from_file_location("bench_vs_gsplat", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return module


def check_peers(peers: tuple[str, ...], setup: PeerSetup) -> None:
    """Refuse a peer that cannot run here, naming it and what it lacks.

    Raises:
        InputError: an unknown peer; gsplat without CUDA, without the gsplat package or without simple_trainer.py;
            opensplat without its binary.
    """
    for peer in peers:
        if peer not in PEERS:
            raise InputError(f"--peer {peer}: unknown; the peers are {', '.join(PEERS)}")
        if peer == "gsplat":
            import torch

            if not torch.cuda.is_available():
                raise InputError("peer gsplat: needs a CUDA device (simple_trainer.py trains on the GPU), none here")
            if importlib.util.find_spec("gsplat") is None:
                raise InputError("peer gsplat: the gsplat package is not installed")
            if not (setup.gsplat_examples / "simple_trainer.py").is_file():
                raise InputError(
                    f"peer gsplat: {setup.gsplat_examples / 'simple_trainer.py'} is missing; "
                    "bash scripts/fetch_gsplat_examples.sh GSPLAT_GIT extracts it (or pass --gsplat-examples DIR)"
                )
            bench_vs_gsplat()
        elif shutil.which(setup.opensplat) is None:
            raise InputError(
                f"peer opensplat: {setup.opensplat} is not installed (not an executable file nor on PATH); build "
                "OpenSplat and pass --opensplat PATH"
            )


def run_gsplat(
    setup: PeerSetup, scene_dir: Path, factor: int, steps: int, strategy: str, cap_max: int, out: Path, seed: int
) -> dict:
    """Train the scene with simple_trainer.py (``strategy``: default or mcmc with ``cap_max`` Gaussians; its log in
    ``out``.log) and read its results: PSNR, SSIM, LPIPS (torchmetrics, alex), Gaussians, peak GPU GiB, train
    seconds, steps/s; and the process's wall seconds."""
    bench = bench_vs_gsplat()
    config = bench.Setup(
        data=str(scene_dir.resolve()), out=out.parent, steps=steps, factor=factor, cap_max=cap_max,
        gsplat_examples=setup.gsplat_examples.resolve(), python=setup.python,
    )  # fmt: skip
    run = bench.Run("gsplat", strategy, seed)
    command = bench.gsplat_command(config, run)
    command[command.index("--result_dir") + 1] = str(out)
    wall = _run("gsplat", command, out, cwd=setup.gsplat_examples)
    return {**bench.read_gsplat(out, steps), "wall_s": wall}


def train_only_scene(scene_dir: Path, test_names: set[str], out: Path) -> Path:
    """A scene folder in ``out`` whose COLMAP model lists the views of ``scene_dir`` but ``test_names`` (image file
    names), its image folders linked: OpenSplat trains on every view its model lists."""
    import pycolmap

    from gsrecon.data.formats.colmap_model import find_sparse_dir

    model = pycolmap.Reconstruction(str(find_sparse_dir(scene_dir)))
    for image_id, image in list(model.images.items()):
        if image.name in test_names:
            model.deregister_image(image_id)
    sparse = out / "sparse" / "0"
    sparse.mkdir(parents=True, exist_ok=True)
    model.write(str(sparse))
    for folder in scene_dir.glob("images*"):
        link = out / folder.name
        if not link.exists():
            link.symlink_to(folder.resolve(), target_is_directory=True)
    return out


def run_opensplat(setup: PeerSetup, train_scene: Path, factor: int, steps: int, out: Path) -> tuple[Path, float]:
    """Train OpenSplat on ``train_scene`` (a scene folder whose model lists the training views only) on the CPU;
    returns its PLY and the process's wall seconds."""
    out.mkdir(parents=True, exist_ok=True)
    ply = out / "splat.ply"
    command = [
        setup.opensplat, str(train_scene), "-n", str(steps), "-d", str(factor), "--cpu", "--num-downscales", "0",
        "-o", str(ply),
    ]  # fmt: skip
    return ply, _run("opensplat", command, out)


def _run(peer: str, command: list[str], out: Path, cwd: Path | None = None) -> float:
    """Run ``peer`` (its output in ``<out>.log``); its wall seconds. A peer that fails stops the suite, naming it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.with_suffix(".log")
    start = time.perf_counter()
    with log.open("w") as file:
        done = subprocess.run(command, cwd=cwd, stdout=file, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise PeerFailedError(f"peer {peer} exited with {done.returncode}; see {log}")
    return time.perf_counter() - start
