"""Using trained scenes from the CLI: eval, export (PLY / .splat), PLY initialisation, videos."""

from __future__ import annotations

import json
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from conftest import write_yaml

from gsrecon.cameras import Cameras
from gsrecon.cli import main
from gsrecon.config import parse_structured
from gsrecon.engine.checkpoints import load_checkpoint_file
from gsrecon.engine.trainer import DefaultTrainer
from gsrecon.export.compressed_ply import load_compressed_ply
from gsrecon.export.spz import load_spz
from gsrecon.metrics import psnr
from gsrecon.model.ply import load_ply, ply_antialiased
from gsrecon.render.torch_renderer import TorchRenderer


@pytest.fixture
def trained(make_config, tmp_path: Path) -> Path:
    """A finished tiny run; returns its exp_dir."""
    config = write_yaml(tmp_path / "train.yaml", make_config("trained", max_steps=6))
    assert main(["train", "--config", str(config)]) == 0
    return tmp_path / "trained"


def test_training_ends_with_a_reference_ply(trained: Path) -> None:
    params = load_ply(trained / "point_cloud.ply")
    last = load_checkpoint_file(trained / "checkpoints" / "last.pt")["params"]
    for name, value in last.items():
        assert torch.equal(params[name], value), name


def test_eval_writes_renders_ground_truth_and_metrics(trained: Path, capsys) -> None:
    assert main(["eval", "--exp-dir", str(trained), "--device", "cpu"]) == 0
    assert "2 test views" in capsys.readouterr().out
    training_metrics = (trained / "metrics.json").read_text()
    metrics = json.loads((trained / "eval" / "metrics.json").read_text())
    assert (trained / "metrics.json").read_text() == training_metrics  # the training record stays
    assert metrics["step"] == 6 and metrics["num_gaussians"] == 300
    assert metrics["resolution"] == ["32x24"] and metrics["render_fps"] > 0
    assert {v["name"] for v in metrics["images"]} == {"view_000", "view_008"}
    assert set(metrics["mean"]) == {"psnr", "ssim", "lpips"}
    assert metrics["lpips"]["net"] == "none"  # as the run's config says
    for view in metrics["images"]:
        render = iio.imread(trained / "eval" / "renders" / "test" / f"{view['name']}.png")
        gt = iio.imread(trained / "eval" / "gt" / f"{view['name']}.png")
        assert render.shape == gt.shape == (24, 32, 3)
        mse = np.mean((render / 255.0 - gt / 255.0) ** 2)
        assert -10 * np.log10(mse) == pytest.approx(view["psnr"], abs=0.1)  # metrics describe the PNGs


def test_eval_writes_the_cameras_it_rendered_so_others_can_render_them_again(trained: Path, tmp_path: Path) -> None:
    assert main(["eval", "--exp-dir", str(trained), "--out", str(tmp_path / "eval")]) == 0
    cameras = json.loads((tmp_path / "eval" / "cameras.json").read_text())
    assert [c["name"] for c in cameras if c["split"] == "train"] == [f"view_{i:03d}" for i in range(1, 8)]
    cameras = [c for c in cameras if c["split"] == "test"]
    assert [c["name"] for c in cameras] == ["view_000", "view_008"]
    params = load_checkpoint_file(trained / "checkpoints" / "last.pt")["params"]
    renderer = TorchRenderer(TorchRenderer.Config())
    for camera in cameras:
        viewmat, K = torch.tensor(camera["world_to_camera"]), torch.tensor(camera["K"])
        assert viewmat.shape == (4, 4) and K.shape == (3, 3) and viewmat[3].tolist() == [0, 0, 0, 1]
        with torch.no_grad():
            out = renderer.render(
                params, Cameras(viewmat[None], K[None], camera["width"], camera["height"]), 1, torch.zeros(1, 3)
            )
        png = torch.from_numpy(iio.imread(tmp_path / "eval" / "renders" / "test" / f"{camera['name']}.png")) / 255.0
        assert psnr(out.image[0].clamp(0, 1), png) > 40  # the same view, up to 8-bit rounding


def test_export_web_formats_and_the_antialiased_warning(make_config, tmp_path: Path, capsys) -> None:
    config = write_yaml(
        tmp_path / "aa.yaml", make_config("aa", max_steps=3, renderer={"name": "torch", "antialiased": True})
    )
    assert (
        main(["train", "--config", str(config), "hooks.SpzCopy={name: ExportHook, path: copy.spz, format: spz}"]) == 0
    )
    run = tmp_path / "aa"
    assert ply_antialiased(run / "point_cloud.ply") is True
    assert load_spz(run / "copy.spz")[1] is True
    capsys.readouterr()
    for fmt, out in (("compressed_ply", "scene.compressed.ply"), ("spz", "scene.spz")):
        assert main(["export", "--exp-dir", str(run), "--format", fmt, "--out", str(tmp_path / out)]) == 0
        err = capsys.readouterr().err
        assert "trained in antialiased mode" in err and "renderer.antialiased=false" in err
    assert load_compressed_ply(tmp_path / "scene.compressed.ply")["means"].shape == (300, 3)
    assert load_spz(tmp_path / "scene.spz")[0]["means"].shape == (300, 3)
    assert main(["export", "--exp-dir", str(run), "--format", "obj", "--out", str(tmp_path / "x.obj")]) == 2
    assert "unknown export format 'obj'" in capsys.readouterr().err


def test_export_ply_and_splat_and_init_from_ply(trained: Path, make_config, tmp_path: Path) -> None:
    ply, splat = tmp_path / "out.ply", tmp_path / "out.splat"
    assert main(["export", "--checkpoint", str(trained / "checkpoints" / "last.pt"), "--out", str(ply)]) == 0
    assert main(["export", "--exp-dir", str(trained), "--format", "splat", "--out", str(splat)]) == 0
    assert splat.stat().st_size == 32 * 300
    params = load_ply(ply)
    # A new run initialised from the PLY starts from exactly these Gaussians.
    cfg = make_config("from_ply", max_steps=1, model={"sh_degree": 1, "init": "ply", "init_path": str(ply)})
    trainer = DefaultTrainer(parse_structured(DefaultTrainer.Config, cfg))
    for name, value in params.items():
        assert torch.equal(trainer.model.params[name].detach(), value), name
    assert trainer.model.active_sh_degree(0) == 1  # the PLY's trained SH bands are used from the start


def test_eval_from_ply_matches_eval_from_checkpoint(trained: Path, tmp_path: Path) -> None:
    assert main(["eval", "--exp-dir", str(trained), "--out", str(tmp_path / "a")]) == 0
    assert (
        main(
            [
                "eval",
                "--ply",
                str(trained / "point_cloud.ply"),
                "--config",
                str(trained / "config.yaml"),
                "--out",
                str(tmp_path / "b"),
            ]
        )
        == 0
    )
    a = json.loads((tmp_path / "a" / "metrics.json").read_text())
    b = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert a["mean"]["psnr"] == pytest.approx(b["mean"]["psnr"], abs=1e-6)


def test_a_gsplat_run_evaluates_on_cpu_with_the_torch_renderer_and_its_settings(
    trained: Path, tmp_path: Path, capsys
) -> None:
    gsplat = ["renderer.name=gsplat", "renderer.antialiased=true", "renderer.eps2d=0.5"]
    assert main(["eval", "--exp-dir", str(trained), "--device", "cpu", "--out", str(tmp_path / "a"), *gsplat]) == 0
    assert "rendering with the torch renderer" in capsys.readouterr().err
    torch_same = ["renderer.name=torch", "renderer.antialiased=true", "renderer.eps2d=0.5", "renderer.alpha_max=0.999"]
    assert main(["eval", "--exp-dir", str(trained), "--device", "cpu", "--out", str(tmp_path / "b"), *torch_same]) == 0
    assert main(["eval", "--exp-dir", str(trained), "--device", "cpu", "--out", str(tmp_path / "c")]) == 0
    a, b, c = (json.loads((tmp_path / x / "metrics.json").read_text())["mean"]["psnr"] for x in "abc")
    assert a == b != c  # the settings came along (and they change the image)


def test_render_video_along_paths(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "video.mp4"
    assert (
        main(["render", "--exp-dir", str(trained), "--path", "ellipse", "--frames", "8", "--depth", "--out", str(out)])
        == 0
    )
    frames = list(iio.imiter(out))
    assert len(frames) == 8 and frames[0].shape[:2] == (24, 32)
    assert len(list(iio.imiter(tmp_path / "video_depth.mp4"))) == 8
    assert (
        main(
            [
                "render",
                "--exp-dir",
                str(trained),
                "--path",
                "interp",
                "--frames",
                "5",
                "--out",
                str(tmp_path / "interp.mp4"),
            ]
        )
        == 0
    )
    assert len(list(iio.imiter(tmp_path / "interp.mp4"))) == 5


def test_render_notes_when_it_pads_an_odd_frame_size(trained: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "odd.mp4"
    argv = ["render", "--exp-dir", str(trained), "--frames", "2", "--out", str(out), "data.synthetic.width=33"]
    assert main(argv) == 0
    assert "33x24: H.264 needs even sizes, so the video repeats the last column" in capsys.readouterr().err
    assert next(iter(iio.imiter(out))).shape[:2] == (24, 34)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["eval", "--exp-dir", "{tmp}/nothing"], "no checkpoint"),
        (["eval", "--ply", "{tmp}/x.ply"], "--ply needs --config"),
        (["export", "--checkpoint", "{tmp}/missing.pt", "--out", "{tmp}/o.ply"], "checkpoint not found"),
        (["render", "--exp-dir", "{trained}", "--frames", "1", "--out", "{tmp}/v.mp4"], "at least 2"),
        (["render", "--exp-dir", "{trained}", "--out", "{tmp}/v.gif"], "must be an .mp4 file"),
    ],
)
def test_bad_inference_input_is_one_line(trained: Path, tmp_path: Path, capsys, argv, message) -> None:
    argv = [a.format(tmp=tmp_path, trained=trained) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


TEST_VIEW_POLICIES = {
    "default": {},
    "fit_left": {"views": {"appearance": {"name": "affine", "eval": "fit_left", "eval_steps": 20}}},
    "pose_fit": {"views": {"pose_opt": {"name": "se3", "eval": "fit", "eval_steps": 5}}},
}


@pytest.mark.parametrize("policy", list(TEST_VIEW_POLICIES))
def test_eval_scores_test_views_as_the_last_validation_did(make_config, tmp_path: Path, policy: str) -> None:
    config = write_yaml(tmp_path / "run.yaml", make_config("run", **TEST_VIEW_POLICIES[policy]))
    assert main(["train", "--config", str(config)]) == 0
    validation = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert main(["eval", "--exp-dir", str(tmp_path / "run"), "--device", "cpu"]) == 0
    evaluated = json.loads((tmp_path / "run" / "eval" / "metrics.json").read_text())
    assert evaluated["step"] == validation["step"] == 6
    assert [v["name"] for v in evaluated["images"]] == [v["name"] for v in validation["images"]]
    for ours, theirs in zip(evaluated["images"], validation["images"]):
        assert ours["psnr"] == pytest.approx(theirs["psnr"], abs=1e-4), ours["name"]
        assert ours["ssim"] == pytest.approx(theirs["ssim"], abs=1e-4), ours["name"]
    if policy == "fit_left":  # the right half is scored, and the render written is what was scored
        render = iio.imread(tmp_path / "run" / "eval" / "renders" / "test" / "view_000.png")
        assert render.shape == (24, 16, 3)
    if policy != "default":  # the policy is what makes the numbers agree: without it they differ
        off = {"fit_left": "views.appearance.eval=identity", "pose_fit": "views.pose_opt.eval=given"}[policy]
        out = tmp_path / "off"
        assert main(["eval", "--exp-dir", str(tmp_path / "run"), "--device", "cpu", "--out", str(out), off]) == 0
        plain = json.loads((out / "metrics.json").read_text())
        assert plain["mean"]["psnr"] != pytest.approx(validation["mean"]["psnr"], abs=1e-4)


def test_eval_of_a_ply_applies_its_configs_test_view_policy(make_config, tmp_path: Path) -> None:
    policy = TEST_VIEW_POLICIES["fit_left"]
    config = write_yaml(tmp_path / "run.yaml", make_config("run", **policy))
    assert main(["train", "--config", str(config)]) == 0
    validation = json.loads((tmp_path / "run" / "metrics.json").read_text())
    ply, resolved = tmp_path / "run" / "point_cloud.ply", tmp_path / "run" / "config.yaml"
    assert main(["eval", "--ply", str(ply), "--config", str(resolved), "--out", str(tmp_path / "ply")]) == 0
    evaluated = json.loads((tmp_path / "ply" / "metrics.json").read_text())
    assert evaluated["mean"]["psnr"] == pytest.approx(validation["mean"]["psnr"], abs=1e-4)
