"""``gsrecon bench``: a tiny NeRF-synthetic-layout suite of the synthetic scene trained, interrupted, resumed and
tabled beside the published numbers; the suite folders, peers and results folders it refuses."""

from __future__ import annotations

import csv
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from capture_layouts import colmap, split_capture, tiny_frames
from colmap_writer import write_model
from PIL import Image

from gsrecon.bench import SUITES
from gsrecon.bench.protocol import check_scene
from gsrecon.bench.request import SuiteRun
from gsrecon.bench.runner import prepare_out
from gsrecon.cli import EXIT_INTERRUPTED, EXIT_USAGE, main
from gsrecon.data.errors import DatasetError
from gsrecon.data.formats.colmap_model import ColmapCamera, ColmapPoints, SparseModel
from gsrecon.hooks import Hook
from gsrecon.registry import HOOK_REGISTRY

TINY = [  # a few seconds per scene on one CPU thread
    "device=cpu", "num_threads=1", "model.init_num_points=300", "model.sh_degree=1", "renderer.name=torch",
    "metrics.lpips_net=none", "hooks.LogHook.progress=false",
]  # fmt: skip


def suite_folder(root: Path, cache: Path, scenes: tuple[str, ...]) -> Path:
    """Scene folders of the synthetic scene in the NeRF-synthetic layout (transforms_train.json and
    transforms_test.json), one per name."""
    frames = tiny_frames(cache)
    for name in scenes:
        split_capture(root / name, frames)
    return root


def bench(*args: str) -> int:
    return main(["bench", *args])


def register_interrupt_hook() -> None:
    @HOOK_REGISTRY.register()
    class SigintAtStep(Hook):
        """Sends this process a real SIGINT (as Ctrl-C does) after a given step of the ``run``-th training built."""

        built = 0

        @dataclass
        class Config:
            step: int = 3
            run: int = 2

        def __init__(self, cfg: Config) -> None:
            SigintAtStep.built += 1
            self.cfg, self.armed = cfg, SigintAtStep.built == cfg.run

        def after_train_iter(self, trainer) -> None:
            if self.armed and trainer.step == self.cfg.step:
                os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.slow  # 15 s on the 2 loaded cores: CI's slow run (the default run stays under 5 min)
def test_suite_is_interrupted_resumed_and_tabled_beside_the_published_numbers(tmp_path, synthetic_cache, capsys):
    register_interrupt_hook()
    data = suite_folder(tmp_path / "scenes", synthetic_cache, ("lego", "chair"))
    out = tmp_path / "results"
    argv = ["nerf-synthetic", "--data", str(data), "--out", str(out), "--scenes", "lego,chair", "--steps", "6",
            "--curve", "3", *TINY, "hooks.SigintAtStep={step: 3}"]  # fmt: skip
    # The first call trains lego and stops chair (the second training) at step 3; the second call keeps lego and
    # resumes chair from its checkpoint.
    assert bench(*argv) == EXIT_INTERRUPTED
    lego = json.loads((out / "lego" / "metrics.json").read_text())
    assert (out / "chair" / "gsrecon" / "checkpoints" / "last.pt").is_file()
    assert not (out / "chair" / "metrics.json").exists() and not (out / "results.md").exists()
    assert bench(*argv) == 0
    assert json.loads((out / "lego" / "metrics.json").read_text()) == lego  # finished earlier: kept, not rerun
    for scene, resumed in (("lego", False), ("chair", True)):
        (run,) = json.loads((out / scene / "metrics.json").read_text())["runs"]
        assert run["trainer"] == "gsrecon" and run["steps"] == 6 and run["resumed"] is resumed
        assert 5 < run["psnr"] < 60 and 0 < run["ssim_torchmetrics"] <= 1 and run["gaussians"] > 0
        assert len(run["curve"]) == 3 and run["curve"][0][0] < run["curve"][-1][0]  # validations at steps 2, 4, 6
        assert run["threads"] == 1 and run["train_s"] > 0
        assert len(list((out / scene / "eval" / "renders" / "test").glob("*.png"))) == 2  # transforms_test.json's
    table = (out / "results.md").read_text()
    assert "| lego | 3DGS paper-30k | 30000 | 35.78 |" in table and "gaussian_splatting_spec.py" in table
    assert "| mean of 2 | gsrecon | 6 |" in table and "| chair | gsrecon | 6 |" in table
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert {(r["kind"], r["scene"], r.get("trainer") or r["method"]) for r in rows} >= {
        ("run", "lego", "gsrecon"), ("run", "chair", "gsrecon"), ("published", "chair", "3DGS paper-30k"),
    }  # fmt: skip
    with Image.open(out / "psnr_time.png") as plot:
        assert (
            plot.size == (720, 440) and len(plot.convert("RGB").getcolors(maxcolors=10_000) or ()) > 3
        )  # lines, not a blank page
    capsys.readouterr()
    assert bench(*argv) == EXIT_USAGE  # written results are never replaced without --overwrite
    assert "already written; --overwrite replaces them" in capsys.readouterr().err
    assert bench(*argv[:-1], "--steps", "8", "hooks.SigintAtStep={step: 3}") == EXIT_USAGE
    assert "other settings (steps 6 -> 8)" in capsys.readouterr().err
    (out / "notes.txt").write_text("a user's file")
    prepare_out(SuiteRun(SUITES["nerf-synthetic"], data, out, 6, "blender_lego.yaml", ("lego",)), overwrite=True)
    assert not (out / "lego").exists() and not (out / "chair").exists() and not (out / "results.md").exists()
    assert (out / "notes.txt").read_text() == "a user's file"  # --overwrite removes what a suite wrote, nothing else


def test_bad_suite_folders_are_refused_naming_the_scene_and_path(tmp_path, synthetic_cache, capsys):
    data = suite_folder(tmp_path / "scenes", synthetic_cache, ("lego", "bicycle"))
    colmap(data / "garden", synthetic_cache)  # images/ and images_2/ only
    colmap(data / "room", synthetic_cache)  # an indoor scene: images_2/ is its protocol's
    out = str(tmp_path / "results")
    cases = [
        (["nerf-synthetic", "--scenes", "lego,chair"], f"{data / 'chair'}: suite nerf-synthetic needs scene 'chair'"),
        (["nerf-synthetic", "--scenes", "ficus", "--data", str(data / "garden")], "ficus"),
        (["nerf-synthetic", "--scenes", "lego,nope"], "suite nerf-synthetic has no scene 'nope'"),
        (["mipnerf360", "--scenes", "bicycle"], "scene 'bicycle' is not in the mipnerf360 layout"),
        (["mipnerf360", "--scenes", "garden"], "scene 'garden' has no images at the mipnerf360 protocol's downscale"),
        (["mipnerf360", "--scenes", "room", "--peer", "opensplat", "--opensplat", str(tmp_path / "none")],
         f"peer opensplat: {tmp_path / 'none'} is not installed"),
        (["nerf-synthetic", "--scenes", "lego", "--peer", "opensplat"], "peer opensplat: trains COLMAP scenes"),
        (["nerf-synthetic", "--scenes", "lego", "--peer", "gsplat"], "peer gsplat trains with the 3DGS paper's"),
        (["nerf-synthetic", "--scenes", "lego", "--steps", "0"], "--steps must be >= 1"),
    ]  # fmt: skip
    if not torch.cuda.is_available():
        cases.append((["nerf-synthetic", "--scenes", "lego", "--peer", "gsplat", "--schedule", "3dgs"],
                      "peer gsplat: needs a CUDA device"))  # fmt: skip
    for args, message in cases:
        argv = [*args, *([] if "--data" in args else ["--data", str(data)]), "--out", out]
        assert bench(*argv) == EXIT_USAGE, args
        assert message in capsys.readouterr().err.replace("\n", " "), args
    assert not (tmp_path / "results").exists()  # refused before anything was written
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's file")
    assert bench("nerf-synthetic", "--data", str(data), "--out", str(tmp_path / "mine"), "--scenes", "lego") == 2
    assert "not empty and not a suite's results folder" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "a user's file"


def test_llff_takes_images_8_or_a_model_at_504x378(tmp_path):
    llff = SUITES["llff"]
    horns = llff.scene("horns")
    camera = ColmapCamera(1, "SIMPLE_RADIAL", 504, 378, np.array([421.1, 252.0, 189.0, 0.0123]))
    empty = ColmapPoints(np.zeros(0, np.int64), np.zeros((0, 3)), np.zeros((0, 3), np.uint8), np.zeros(0), [])
    write_model(SparseModel({1: camera}, {}, empty), tmp_path / "horns" / "sparse" / "0")
    (tmp_path / "horns" / "images").mkdir()
    assert check_scene(llff, tmp_path, horns) == 1  # images/ as the shared horns holds them: already at 1/8
    full = ColmapCamera(1, "SIMPLE_RADIAL", 4032, 3024, np.array([3368.8, 2016.0, 1512.0, 0.0123]))
    write_model(SparseModel({1: full}, {}, empty), tmp_path / "horns" / "sparse" / "0")
    with pytest.raises(DatasetError, match="images_8/ or images/ with a model at 504x378"):
        check_scene(llff, tmp_path, horns)
    (tmp_path / "horns" / "images_8").mkdir()
    assert check_scene(llff, tmp_path, horns) == 8  # the published images_8/ beside the originals


def test_bench_help_describes_the_command_and_shows_defaults(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    out = capsys.readouterr().out.replace("\n", " ")
    assert exit_info.value.code == 0 and "published protocol" in out and "(default: 7000)" in out
    assert "mipnerf360,tanks-and-temples,deep-blending,nerf-synthetic,llff" in out
