"""Camera pose refinement (``views: {pose_opt: {name: se3}}``): the twists, their gradients through the renderer,
training, exact resume, the test-view policies, cameras.json and bad input."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SCRIPTS, script_module, write_yaml
from test_colmap import _make_scene

from gsrecon.cameras import Cameras
from gsrecon.cli import main
from gsrecon.config import parse_structured
from gsrecon.data.pipeline import Batch
from gsrecon.data.readers.colmap import load_colmap
from gsrecon.data.readers.transforms import OPENGL_TO_OPENCV, load_transforms
from gsrecon.data.scene import Frame
from gsrecon.engine.checkpoints import load_checkpoint_file
from gsrecon.engine.evaluator import evaluate_views
from gsrecon.engine.trainer import DefaultTrainer
from gsrecon.model.views.base import ViewModules
from gsrecon.model.views.pose import PoseCorrection, corrected_viewmats, fit_pose, resected_twist, se3_exp
from gsrecon.render.torch_renderer import TorchRenderer


def perturbed_viewmats(viewmats: torch.Tensor, rotation_deg: float, translation: float, seed: int) -> torch.Tensor:
    """The benchmark plugin's seeded pose error (see scripts/perturb_poses.py)."""
    return script_module("perturb_poses").perturbed_viewmats(viewmats, rotation_deg, translation, seed)


SE3 = {"name": "se3", "lr": 1e-3}
SE3_ALL = {**SE3, "trust_px": 0.0}  # every view refined: the synthetic scene's poses agree with its keypoints


def pose_error(moved: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
    """(rotation angle in degrees, distance between the camera centres) of two world-to-camera [4, 4]."""
    relative = moved[:3, :3] @ truth[:3, :3].T
    angle = math.degrees(math.acos(max(-1.0, min(1.0, (relative.trace().item() - 1.0) / 2.0))))
    centre = lambda v: -(v[:3, :3].T @ v[:3, 3])  # noqa: E731
    return angle, (centre(moved) - centre(truth)).norm().item()


def test_zero_twist_is_exactly_the_identity() -> None:
    assert torch.equal(se3_exp(torch.zeros(3, 6)), torch.eye(4).expand(3, 4, 4))
    viewmats = perturbed_viewmats(torch.eye(4).repeat(2, 1, 1), 10.0, 0.5, seed=1)
    assert torch.equal(corrected_viewmats(viewmats, torch.zeros(2, 6)), viewmats)


def test_twist_is_a_rotation_and_a_translation_in_camera_axes() -> None:
    angle = 0.3
    rotation = se3_exp(torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, angle]]))[0]
    expected = torch.eye(4)
    expected[:2, :2] = torch.tensor([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    torch.testing.assert_close(rotation, expected)
    translation = se3_exp(torch.tensor([[0.1, -0.2, 0.3, 0.0, 0.0, 0.0]]))[0]
    torch.testing.assert_close(translation[:3, 3], torch.tensor([0.1, -0.2, 0.3]))
    torch.testing.assert_close(translation[:3, :3], torch.eye(3))


def _cloud(seed: int = 0) -> dict[str, torch.Tensor]:
    """A textured cloud of Gaussians around the origin, seen by cameras 4 units away."""
    generator = torch.Generator().manual_seed(seed)
    n = 600
    return {
        "means": torch.rand(n, 3, generator=generator) * 2.0 - 1.0,
        "scales": torch.full((n, 3), math.log(0.06)),
        "quats": torch.tensor([1.0, 0.0, 0.0, 0.0]).repeat(n, 1),
        "opacities": torch.full((n,), 2.0),
        "sh0": torch.rand(n, 1, 3, generator=generator) * 2.0 - 1.0,
        "shN": torch.zeros(n, 0, 3),
    }


def _batch(viewmat: torch.Tensor, image: torch.Tensor, name: str = "a") -> Batch:
    K = torch.tensor([[40.0, 0.0, 24.0], [0.0, 40.0, 16.0], [0.0, 0.0, 1.0]])
    return Batch(image[None], Cameras(viewmat[None], K[None], 48, 32), torch.zeros(1, 3), [name])


def _true_view() -> torch.Tensor:
    viewmat = torch.eye(4)
    viewmat[2, 3] = 4.0  # the camera at z = -4 looking along +z at the cloud
    return viewmat


def test_a_perturbed_training_camera_is_pulled_back_toward_its_true_pose() -> None:
    params, renderer = _cloud(), TorchRenderer()
    render = lambda batch: renderer.render_batch(params, batch, 0)  # noqa: E731
    truth = _true_view()
    with torch.no_grad():
        photo = render(_batch(truth, torch.zeros(32, 48, 3))).image[0]
    given = perturbed_viewmats(truth[None], 2.0, 0.08, seed=3)[0]
    views = ViewModules({"pose_opt": PoseCorrection(PoseCorrection.Config(lr=3e-3, reg=0.0), ["a"])})
    before = pose_error(given, truth)
    for _ in range(150):
        batch = views.adjust_cameras(_batch(given, photo))
        loss = (render(batch).image - batch.images).abs().mean()
        loss.backward()
        views.step(["a"], dist=_single_process())
    after = pose_error(views.camera_poses(given[None], ["a"])[0].detach(), truth)
    assert after[0] < 0.3 * before[0] and after[1] < 0.3 * before[1], (before, after)


@pytest.mark.parametrize("chunked", [False, True])
def test_torch_renderer_gives_the_camera_its_gradient_in_chunks_too(chunked: bool) -> None:
    params = _cloud(2)
    whole = TorchRenderer()
    renderer = TorchRenderer(TorchRenderer.Config(max_kept_gaussians=0, max_chunk_gaussians=97)) if chunked else whole
    grads = []
    for one in (whole, renderer):
        viewmats = perturbed_viewmats(_true_view()[None], 1.0, 0.05, seed=5).requires_grad_(True)
        out = one.render(
            params,
            Cameras(viewmats, _batch(_true_view(), torch.zeros(32, 48, 3)).cameras.Ks, 48, 32),
            0,
            torch.zeros(1, 3),
        )
        out.image.square().sum().backward()
        grads.append(viewmats.grad)
    assert grads[0].abs().amax() > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-5)


def test_fitting_a_test_view_moves_it_toward_its_photo() -> None:
    params, renderer = _cloud(1), TorchRenderer()
    render = lambda batch: renderer.render_batch(params, batch, 0)  # noqa: E731
    truth = _true_view()
    with torch.no_grad():
        photo = render(_batch(truth, torch.zeros(32, 48, 3))).image[0]
    given = perturbed_viewmats(truth[None], 2.0, 0.08, seed=4)[0]
    with torch.no_grad():  # as the evaluator calls it
        fitted = fit_pose(_batch(given, photo), render, steps=150, lr=3e-3)
    before, after = pose_error(given, truth), pose_error(fitted.cameras.viewmats[0], truth)
    assert after[0] < 0.3 * before[0] and after[1] < 0.3 * before[1], (before, after)
    assert all(p.grad is None for p in params.values())  # only the twist learned


def _single_process():
    from gsrecon.distributed import DistributedContext

    return DistributedContext()


def test_pose_opt_is_off_by_default_and_a_frozen_correction_changes_nothing(make_trainer) -> None:
    default = make_trainer("default")
    assert not default.views and default.resolved_config["views"]["pose_opt"] == {"name": "none"}
    default.train()
    frozen = make_trainer("frozen", views={"pose_opt": {"name": "se3", "lr": 0.0, "reg": 0.0}})
    assert set(frozen.views.modules) == {"pose_opt"}
    frozen.train()
    reference = load_checkpoint_file(default.exp_dir / "checkpoints" / "last.pt")
    other = load_checkpoint_file(frozen.exp_dir / "checkpoints" / "last.pt")
    for name, value in reference["params"].items():
        assert torch.equal(other["params"][name], value), name
    assert default.val_metrics == frozen.val_metrics
    assert torch.equal(other["views"]["pose_opt"]["module"]["twists"], torch.zeros(7, 6))


def test_se3_learns_a_correction_per_training_view_with_its_schedule(make_trainer) -> None:
    trainer = make_trainer("se3", views={"pose_opt": {**SE3_ALL, "lr_final_factor": 0.1}})
    resolved = trainer.resolved_config["views"]["pose_opt"]
    assert resolved["decay_steps"] == 6 and resolved["eval"] == "given"  # the schedule follows max_steps
    trainer.train()
    twists = trainer.views.modules["pose_opt"].twists.detach()
    assert twists.shape == (trainer.datapipeline.num_train, 6) and twists.abs().amax() > 1e-5
    group = trainer.views.optimizers["pose_opt"].param_groups[0]
    assert group["lr"] == pytest.approx(1e-4)  # decayed to lr_final_factor at decay_steps
    assert trainer.outputs["losses"]["pose_opt"].item() > 0.0  # the pull toward the given poses joins the loss
    pull = trainer.views.modules["pose_opt"].regularization(None, None).item()
    assert pull == pytest.approx(1e-3 * twists.square().sum(-1).mean().item(), rel=1e-5)


def test_resume_with_pose_refinement_is_bit_identical(make_trainer) -> None:
    full = make_trainer("full", views={"pose_opt": SE3_ALL})
    full.train()
    step_3 = full.exp_dir / "checkpoints" / "step_000003.pt"
    assert load_checkpoint_file(step_3)["views"]["pose_opt"]["scheduler"]["last_epoch"] == 3
    resumed = make_trainer("resumed", views={"pose_opt": SE3_ALL}, resume=str(step_3))
    resumed.train()
    reference = load_checkpoint_file(full.exp_dir / "checkpoints" / "last.pt")
    again = load_checkpoint_file(resumed.exp_dir / "checkpoints" / "last.pt")
    for name, value in reference["params"].items():
        assert torch.equal(again["params"][name], value), name
    saved, restored = reference["views"]["pose_opt"], again["views"]["pose_opt"]
    assert torch.equal(restored["module"]["twists"], saved["module"]["twists"])
    assert restored["scheduler"] == saved["scheduler"]
    assert torch.equal(restored["optimizer"]["state"][0]["exp_avg"], saved["optimizer"]["state"][0]["exp_avg"])


def test_test_views_are_scored_at_their_given_poses_unless_fitted(make_trainer) -> None:
    given = make_trainer("given", views={"pose_opt": SE3_ALL})
    given.train()
    plain = evaluate_views(given.render, given.datapipeline.val_batches(), given.metrics)
    assert [r["psnr"] for r in plain] == [r["psnr"] for r in given.val_results]
    fitted = make_trainer("fitted", views={"pose_opt": {**SE3_ALL, "eval": "fit", "eval_steps": 5}})
    fitted.train()
    assert fitted.val_metrics != given.val_metrics  # same training, test views scored at fitted poses
    refit = evaluate_views(
        fitted.render,
        fitted.datapipeline.val_batches(),
        fitted.metrics,
        fit_cameras=fitted.views.eval_cameras,
    )
    assert [r["psnr"] for r in refit] == [r["psnr"] for r in fitted.val_results]


def test_eval_writes_the_corrected_training_cameras(make_config, tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "run.yaml", make_config("run", views={"pose_opt": SE3_ALL}))
    assert main(["train", "--config", str(config)]) == 0
    assert main(["eval", "--exp-dir", str(tmp_path / "run")]) == 0
    cameras = json.loads((tmp_path / "run" / "eval" / "cameras.json").read_text())
    test = [c for c in cameras if c["split"] == "test"]
    train = [c for c in cameras if c["split"] == "train"]
    assert [c["name"] for c in test] == ["view_000", "view_008"] and len(train) == 7
    assert all("given_world_to_camera" not in c for c in test)
    twists = load_checkpoint_file(tmp_path / "run" / "checkpoints" / "last.pt")["views"]["pose_opt"]["module"]["twists"]
    moved = [c for c in train if "given_world_to_camera" in c]  # the views trained on in 6 steps
    assert len(moved) == int((twists != 0).any(-1).sum()) >= 5
    for row, camera in enumerate(train):
        given = torch.tensor(camera.get("given_world_to_camera", camera["world_to_camera"]))
        expected = corrected_viewmats(given[None], twists[row : row + 1])[0]
        torch.testing.assert_close(torch.tensor(camera["world_to_camera"]), expected)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("views.pose_opt.name=affine6", r"key 'views.pose_opt.name': .*affine6"),
        ("views.pose_opt.eval=left", r"key 'views.pose_opt'.*eval must be one of given, fit"),
        ("views.pose_opt.lr_final_factor=0", r"key 'views.pose_opt'.*lr_final_factor must be in \(0, 1\]"),
        ("views.pose_opt.trust_px=-1", r"key 'views.pose_opt'.*trust_px must be a finite number >= 0, got -1.0"),
        (
            "views.pose_opt.without_keypoints=fit",
            r"key 'views.pose_opt'.*without_keypoints must be one of refine, keep, got 'fit'",
        ),
        (
            "renderer.name=gsplat data.fisheye=lens",
            r"key 'views.pose_opt': needs gradients of the camera poses.*data.fisheye=undistort",
        ),
    ],
)
def test_bad_pose_opt_is_one_line_and_exit_2(
    make_config, tmp_path: Path, capsys: pytest.CaptureFixture, override: str, message: str
) -> None:
    config = write_yaml(tmp_path / "run.yaml", make_config("run", views={"pose_opt": SE3}))
    assert main(["train", "--config", str(config), *override.split()]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "views.pose_opt.name=affine",
            r"key 'views.pose_opt.name': 'affine' is an appearance module; views.pose_opt takes a pose module \(se3\)",
        ),
        (
            "views.appearance.name=se3",
            r"key 'views.appearance.name': 'se3' is a pose module; views.appearance takes an appearance module "
            r"\(affine, bilateral_grid\)",
        ),
        ("views.pose_opt.name=bilateral_grid", r"key 'views.pose_opt.name': 'bilateral_grid' is an appearance module"),
        ('views.appearance={"name":"affine","mode":"affine"}', r"key 'views.appearance.mode': an alias of"),
    ],
)
def test_a_per_view_section_takes_only_its_kind_of_module_in_one_line_and_exit_2(
    make_config, tmp_path: Path, capsys: pytest.CaptureFixture, override: str, message: str
) -> None:
    config = write_yaml(tmp_path / "run.yaml", make_config("run"))
    assert main(["train", "--config", str(config), *override.split()]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err
    assert not (tmp_path / "run").exists()


def test_a_section_and_a_views_entry_are_one_shape(make_trainer) -> None:
    by_section = make_trainer("section", views={"pose_opt": {"name": "se3", "lr": 1e-3}})
    by_alias = make_trainer("alias", views={"pose_opt": {"mode": "se3", "lr": 1e-3}})
    by_entry = make_trainer("entry", views={"refine": {"name": "se3", "lr": 1e-3}})
    assert by_section.resolved_config["views"]["pose_opt"] == by_alias.resolved_config["views"]["pose_opt"]
    assert {k: v for k, v in by_section.resolved_config["views"]["pose_opt"].items()} == {
        "name": "se3",
        **by_entry.resolved_config["views"]["refine"],
    }
    assert list(by_section.views.modules) == ["pose_opt"] and list(by_entry.views.modules) == ["refine"]


def test_benchmark_perturbation_moves_each_training_camera_by_the_asked_amount(make_trainer) -> None:
    hooks = {"PerturbTrainingPoses": {"rotation_deg": 1.0, "translation": 0.01, "seed": 2}, "LogHook": {}}
    trainer = make_trainer(
        "perturbed", imports=[str(SCRIPTS / "perturb_poses.py")], hooks=hooks, views={"pose_opt": SE3}
    )
    tests_before = [frame.viewmat.clone() for frame in trainer.datapipeline._test]
    truth = torch.stack([frame.viewmat.clone() for frame in trainer.datapipeline._train])
    trainer.train()
    given = torch.stack([frame.viewmat for frame in trainer.datapipeline._train])
    for moved, true in zip(given, truth):
        angle, distance = pose_error(moved, true)
        assert angle == pytest.approx(1.0, abs=1e-3)
        assert distance == pytest.approx(0.01 * trainer.scene_extent, rel=1e-3)
    assert all(torch.equal(f.viewmat, v) for f, v in zip(trainer.datapipeline._test, tests_before))
    log = (trainer.exp_dir / "train.log").read_text()
    assert re.search(r"training cameras from their true poses: given 1.000 deg, 1.000 % of the extent; placed", log)


def test_benchmark_perturbation_measures_a_capture_against_its_true_poses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _make_scene(tmp_path / "scene")[0]
    perturb = script_module("perturb_poses")  # first: the capture script imports it (its hook registered once)
    capture = script_module("make_posed_capture")
    for name, args in (("true", []), ("wrong", ["--rotation-deg", "1", "--translation", "0.01"])):
        monkeypatch.setattr(sys, "argv", ["make_posed_capture.py", str(root), str(tmp_path / name), *args])
        capture.main()
    wrong = load_transforms(str(tmp_path / "wrong"), eval_split="every_8").train
    truth = perturb.true_viewmats([frame.name for frame in wrong], str(tmp_path / "true"))
    given = torch.stack([frame.viewmat for frame in wrong])
    angle, distance = perturb.pose_errors(given, truth)
    assert angle == pytest.approx(1.0, abs=2e-3) and distance > 0
    assert perturb.pose_errors(truth, truth)[0] < 0.01  # float32 poses: acos near 1 is coarse


def _colmap_trainer(make_config, tmp_path: Path, name: str, pose_opt: dict, max_steps: int = 6, **top):
    """A tiny trainer on a COLMAP scene whose keypoints are where its points project at the given poses."""
    root = tmp_path / "scene"
    if not root.exists():
        _make_scene(root)
    data = {"dataset": "colmap", "path": str(root), "eval_split": "every_8"}
    config = make_config(name, max_steps=max_steps, data=data, views={"pose_opt": pose_opt}, **top)
    return DefaultTrainer(parse_structured(DefaultTrainer.Config, config))


def _move_three_views(trainer: DefaultTrainer) -> None:
    """Three training views' poses off by 2 degrees and 5 % of the extent (pixels off their keypoints)."""
    for frame in trainer.datapipeline._train[:3]:
        frame.viewmat.copy_(perturbed_viewmats(frame.viewmat[None], 2.0, 0.05 * trainer.scene_extent, seed=4)[0])


def test_views_whose_given_poses_fit_their_sfm_keypoints_keep_them_bit_for_bit(make_config, tmp_path: Path) -> None:
    off = _colmap_trainer(make_config, tmp_path, "off", {"name": "none"})
    off.train()
    se3 = _colmap_trainer(make_config, tmp_path, "se3", SE3)
    se3.train()
    module = se3.views.modules["pose_opt"]
    assert (module.reprojection_px < 1e-3).all() and not module.refined().any()
    assert torch.equal(module.twists.detach(), torch.zeros(8, 6))
    for name, value in off.model.params.items():
        assert torch.equal(se3.model.params[name], value), name
    assert se3.val_metrics == off.val_metrics
    log = (se3.exp_dir / "train.log").read_text()
    assert "pose_opt: refining 0 of 8 training views; within trust_px 1: 8 keep their given poses (a median" in log


@pytest.mark.parametrize("trust_px", [1.0, 0.0])
def test_views_whose_poses_miss_their_keypoints_are_refined_the_others_kept(
    make_config, tmp_path: Path, trust_px: float
) -> None:
    photometric = {**SE3, "trust_px": trust_px, "resect": False}
    trainer = _colmap_trainer(make_config, tmp_path, "run", photometric, max_steps=16)
    frames = trainer.datapipeline._train
    _move_three_views(trainer)
    trainer.train()
    module = trainer.views.modules["pose_opt"]
    moved = torch.tensor([module.index[frame.name] for frame in frames[:3]])
    kept = torch.tensor([module.index[frame.name] for frame in frames[3:]])
    assert (module.reprojection_px[moved] > 1.0).all() and (module.reprojection_px[kept] < 1e-3).all()
    twists = module.twists.detach()
    assert (twists[moved].abs().amax(-1) > 0).all()  # every view is trained on in 16 steps
    assert (twists[kept].abs().amax(-1) > 0).all() if trust_px == 0 else torch.equal(twists[kept], torch.zeros(5, 6))
    refined = 8 if trust_px == 0 else 3
    assert f"pose_opt: refining {refined} of 8 training views" in (trainer.exp_dir / "train.log").read_text()


def test_views_whose_poses_miss_their_keypoints_keep_the_poses_their_keypoints_give(
    make_config, tmp_path: Path
) -> None:
    trainer = _colmap_trainer(make_config, tmp_path, "run", SE3, max_steps=16)
    frames = trainer.datapipeline._train
    truth = torch.stack([frame.viewmat.clone() for frame in frames[:3]])
    _move_three_views(trainer)
    trainer.train()
    module = trainer.views.modules["pose_opt"]
    assert not module.refined().any()  # every view is within trust_px: no twist learns
    moved = [module.index[frame.name] for frame in frames[:3]]
    given = torch.stack([frame.viewmat for frame in frames[:3]])
    placed = corrected_viewmats(given, module.twists.detach()[moved])
    for start, true, before in zip(placed, truth, given):
        assert pose_error(before, true)[0] == pytest.approx(2.0, abs=1e-3)
        angle, distance = pose_error(start, true)  # float32 poses: an angle's last 0.03 degrees are rounding
        assert angle < 0.05 and distance < 1e-4
    others = [module.index[frame.name] for frame in frames[3:]]
    assert torch.equal(module.twists.detach()[others], torch.zeros(5, 6))
    log = (trainer.exp_dir / "train.log").read_text()
    assert re.search(
        r"pose_opt: refining 0 of 8 training views; within trust_px 1: 5 keep their given poses \(a median 0.00 px\), "
        r"3 keep the poses their keypoints give \(resected: a median 3.\d\d px -> 0.00 px\)\n",
        log,
    ), log


def test_a_resection_from_points_that_cannot_fix_a_pose_leaves_it_where_it_was() -> None:
    K = torch.tensor([[30.0, 0.0, 16.0], [0.0, 30.0, 12.0], [0.0, 0.0, 1.0]])
    frame = Frame(name="a", viewmat=torch.eye(4), K=K, pixels=torch.zeros(24, 32, 3, dtype=torch.uint8), source="x")
    points = torch.tensor([[0.0, 0.0, 3.0]]).repeat(10, 1)  # one point seen ten times: no pose follows from it
    twist, median = resected_twist(frame, points, torch.full((10, 2), 20.0))
    assert torch.isfinite(twist).all() and math.isfinite(median)


@pytest.mark.parametrize("without_keypoints", ["refine", "keep"])
def test_views_without_sfm_keypoints_are_refined_or_kept(make_config, without_keypoints: str) -> None:
    def untracked(name: str, **top) -> DefaultTrainer:  # the synthetic scene's points without tracks, as a PLY gives
        config = make_config(name, **top)
        config["data"]["synthetic"]["tracks"] = False
        return DefaultTrainer(parse_structured(DefaultTrainer.Config, config))

    trainer = untracked("se3", views={"pose_opt": {**SE3, "without_keypoints": without_keypoints}})
    trainer.train()
    module = trainer.views.modules["pose_opt"]
    assert torch.isinf(module.reprojection_px).all()
    assert module.refined().tolist() == [without_keypoints == "refine"] * 7
    log = (trainer.exp_dir / "train.log").read_text()
    if without_keypoints == "refine":
        assert "pose_opt: refining 7 of 7 training views (7 without SfM keypoints); within trust_px 1: none\n" in log
        return
    line = "pose_opt: refining 0 of 7 training views; within trust_px 1: none; 7 without SfM keypoints keep their given"
    assert f"{line} poses (without_keypoints: {without_keypoints})" in log
    off = untracked("off")
    off.train()
    for name, value in off.model.params.items():
        assert torch.equal(trainer.model.params[name], value), name


def test_the_posed_capture_script_moves_the_training_poses_in_the_file(tmp_path: Path) -> None:
    root = _make_scene(tmp_path / "scene")[0]
    script = SCRIPTS / "make_posed_capture.py"
    out = tmp_path / "capture"
    args = [str(root), str(out), "--factor", "2", "--rotation-deg", "1", "--translation", "0.01"]
    subprocess.run([sys.executable, str(script), *args], check=True, capture_output=True)
    frames = json.loads((out / "transforms.json").read_text())["frames"]
    truth = load_colmap(str(root), factor=2, eval_split="none").train
    assert len(frames) == len(truth) == 10 and (out / frames[3]["file_path"]).is_file()
    for index, (entry, frame) in enumerate(zip(frames, truth)):
        c2w = torch.tensor(entry["transform_matrix"], dtype=torch.float64) @ torch.from_numpy(OPENGL_TO_OPENCV)
        angle, _ = pose_error(torch.linalg.inv(c2w).float(), frame.viewmat)
        assert angle == pytest.approx(0.0 if index % 8 == 0 else 1.0, abs=2e-3), index  # test views keep theirs
        assert entry["w"] == frame.width and entry["fl_x"] == pytest.approx(frame.K[0, 0].item())


@pytest.mark.parametrize("resect", [True, False])  # three views resected and kept, or refined photometrically
def test_resume_with_some_views_moved_is_bit_identical(make_config, tmp_path: Path, resect: bool) -> None:
    pose_opt = {**SE3, "resect": resect}
    full = _colmap_trainer(make_config, tmp_path, "full", pose_opt, max_steps=12)
    _move_three_views(full)
    full.train()
    step_6 = full.exp_dir / "checkpoints" / "step_000006.pt"
    resumed = _colmap_trainer(make_config, tmp_path, "resumed", pose_opt, max_steps=12, resume=str(step_6))
    _move_three_views(resumed)  # the poses it trains from, measured again at its first step
    resumed.train()
    assert torch.equal(resumed.views.modules["pose_opt"].refined(), full.views.modules["pose_opt"].refined())
    reference = load_checkpoint_file(full.exp_dir / "checkpoints" / "last.pt")
    again = load_checkpoint_file(resumed.exp_dir / "checkpoints" / "last.pt")
    for name, value in reference["params"].items():
        assert torch.equal(again["params"][name], value), name
    assert torch.equal(
        again["views"]["pose_opt"]["module"]["twists"], reference["views"]["pose_opt"]["module"]["twists"]
    )
