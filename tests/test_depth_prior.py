"""The depth prior from SfM points (the ``loss.depth_prior`` term): which points each photo observed, where they land in
its image, the loss, training with it, and a scene that has no such points."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from colmap_writer import write_model
from conftest import read_scalars, write_yaml
from PIL import Image
from test_colmap import H, W, _make_scene, _synthetic_model

from gsrecon.cli import main
from gsrecon.component import RunSetup
from gsrecon.config import ConfigError, parse_structured
from gsrecon.data.pipeline import DataPipeline
from gsrecon.engine.trainer import DefaultTrainer
from gsrecon.losses.base import DEFAULT_LOSS, LossInputs
from gsrecon.losses.depth_prior import DepthPriorTerm, ObservedPoints, point_depth_loss
from gsrecon.model.views.pose import PoseCorrection
from gsrecon.render.base import RenderOutput

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GSRECON_CACHE", str(tmp_path / "cache"))


def test_point_depth_loss_is_the_mean_disparity_difference_where_something_is_rendered() -> None:
    depth = torch.full((2, 4, 6, 1), 2.0, requires_grad=True)
    with torch.no_grad():
        depth[1, 0, 0, 0] = 0.0  # nothing rendered at the first pixel of the second view
    observed = [
        torch.tensor([[0.5, 0.5, 1.0], [5.5, 3.5, 4.0]]),  # pixel centres: |1/2 - 1| and |1/2 - 1/4|
        torch.tensor([[0.5, 0.5, 8.0], [2.5, 1.5, 2.0]]),  # the first lands where nothing is rendered: left out
    ]
    loss = point_depth_loss(depth, observed)
    torch.testing.assert_close(loss, torch.tensor((0.5 + 0.25 + 0.0) / 3))
    loss.backward()
    assert depth.grad[0, 0, 0, 0] > 0 and depth.grad[0, 3, 5, 0] < 0  # too far: pulled nearer; too near: pushed back
    assert depth.grad[1, 0, 0, 0] == 0
    assert point_depth_loss(depth, [torch.zeros(0, 3), torch.zeros(0, 3)]) is None


def test_colmap_tracks_become_each_photo_s_points_where_its_keypoints_are(tmp_path: Path) -> None:
    model, _ = _synthetic_model()
    first = min(model.images.values(), key=lambda image: image.name)
    ids = first.point3D_ids.copy()
    ids[::3] = -1  # keypoints without a 3D point
    first = dataclasses.replace(first, point3D_ids=ids)
    model.images[first.id] = first
    model.points.ids[:] = np.arange(100, 140)  # point ids that are not row numbers...
    first.point3D_ids[first.point3D_ids >= 0] += 100  # ... and the images' keypoints name those ids
    for image in model.images.values():
        if image.id != first.id:
            image.point3D_ids[:] = np.arange(100, 140)
    root = tmp_path / "scene"
    _make_scene(root)  # the images
    write_model(model, root / "sparse" / "0", ".bin")

    mask = np.full((H, W), 255, np.uint8)
    mask[:, : W // 2] = 0  # the photo's left half is ignored (a moving person, say)
    (root / "masks").mkdir()
    Image.fromarray(mask).save(root / "masks" / f"{first.name}.png")

    config = DataPipeline.Config(dataset="colmap", path=str(root), eval_split="none")
    pipeline = DataPipeline(config, torch.device("cpu"))
    name = first.name.removesuffix(".png")
    kept = np.flatnonzero(ids >= 0)
    assert pipeline.scene.observed[name].tolist() == kept.tolist()
    kept = kept[(first.xys[kept] >= 0).all(1) & (first.xys[kept, 0] < W) & (first.xys[kept, 1] < H)]
    kept = kept[first.xys[kept, 0] >= W // 2]  # in the image and on kept pixels
    assert 0 < len(kept) < 40
    (depths,) = ObservedPoints(pipeline)([name])
    np.testing.assert_allclose(depths[:, :2].numpy(), first.xys[kept], atol=1e-3)  # where the keypoints are
    viewmat = first.viewmat()
    z = model.points.xyz[kept] @ viewmat[2, :3] + viewmat[2, 3]
    np.testing.assert_allclose(depths[:, 2].numpy(), z, rtol=1e-5)
    assert all(len(pipeline.scene.observed[frame.name]) == 40 for frame in pipeline.scene.train if frame.name != name)


def test_the_prior_sees_the_points_from_the_camera_pose_refinement_moved(tmp_path: Path) -> None:
    root = _make_scene(tmp_path / "scene")[0]
    config = DataPipeline.Config(dataset="colmap", path=str(root), eval_split="none")
    pipeline = DataPipeline(config, torch.device("cpu"))
    batch = next(pipeline.train_batches())
    (name,) = batch.names
    pose = PoseCorrection(PoseCorrection.Config(), [frame.name for frame in pipeline.scene.train])
    with torch.no_grad():
        pose.twists[pose.index[name]] = torch.tensor([0.05, -0.03, 0.02, 0.01, 0.4, 0.015])
    moved = pose.adjust_cameras(batch)
    assert moved.cameras.viewmats.requires_grad  # the pose learns from the render; the prior's target must not move it

    viewmat = moved.cameras.viewmats[0].detach()
    camera = pipeline.scene.points[pipeline.scene.observed[name]] @ viewmat[:3, :3].T + viewmat[:3, 3]  # [P, 3]
    pixels = (camera @ batch.cameras.Ks[0].T)[:, :2] / camera[:, 2:]  # [P, 2]
    inside = (camera[:, 2] > 0) & (pixels >= 0).all(-1) & (pixels[:, 0] < W) & (pixels[:, 1] < H)
    expected = torch.cat([pixels, camera[:, 2:]], dim=-1)[inside]  # [P', 3]
    assert 0 < len(expected) < len(camera)  # the moved camera loses some points off its image
    points = ObservedPoints(pipeline)
    (seen,) = points(moved.names, moved.cameras.viewmats)
    torch.testing.assert_close(seen, expected, rtol=1e-5, atol=1e-4)
    (given,) = points(batch.names)
    assert given.shape != seen.shape or not torch.allclose(given, seen)
    assert points(batch.names, batch.cameras.viewmats)[0] is given  # at the given pose: computed once, kept

    depth = torch.linspace(1.0, 3.0, H * W).reshape(1, H, W, 1)
    render = RenderOutput(image=moved.images, alpha=torch.ones(1, H, W, 1), depth=depth, info={})
    term = DepthPriorTerm(DepthPriorTerm.Config())
    term.setup(RunSetup(print, pipeline))
    value = term(LossInputs(moved.images, render, moved, pipeline))
    torch.testing.assert_close(value, pipeline.scene.extent * point_depth_loss(depth, [expected]))
    assert value != term(LossInputs(batch.images, render, batch, pipeline))


def _disparity_error(trainer: DefaultTrainer) -> float:
    """Mean |1 / rendered depth - 1 / z| at the points every training view observed."""
    with torch.no_grad():
        errors, points = [], ObservedPoints(trainer.datapipeline)
        for batch in trainer.datapipeline.train_batches():
            out = trainer.render(batch)
            errors.append(point_depth_loss(out.depth, points(batch.names)))
    return float(torch.stack(errors).mean())


@pytest.mark.slow  # 36 s on the 2 loaded cores: CI's slow run (the default run stays under 5 min)
def test_the_prior_pulls_rendered_depth_to_the_points(tmp_path: Path, make_config) -> None:
    root = _make_scene(tmp_path / "scene")[0]  # random pixels: the photos say nothing about depth, the points do
    errors = {}
    for depth_lambda in (0.0, 1.0):
        config = make_config(
            f"run_{depth_lambda}",
            max_steps=60,
            data={"dataset": "colmap", "path": str(root), "eval_split": "none"},
            loss={**DEFAULT_LOSS, "depth_prior": {"weight": depth_lambda}},
        )
        config["model"]["init"] = "random"  # Gaussians that know nothing of the points
        trainer = DefaultTrainer(parse_structured(DefaultTrainer.Config, config))
        trainer.train()
        errors[depth_lambda] = _disparity_error(trainer)
    assert errors[1.0] < 0.7 * errors[0.0], errors  # measured: 0.55
    logged = read_scalars(trainer.exp_dir, "train/loss/depth_prior")  # the prior's weighted term, step by step
    assert len(logged) == 60 and logged[60] < 0.7 * logged[1]
    assert read_scalars(trainer.exp_dir.parent / "run_0.0", "train/loss/depth_prior") == {}  # weight 0: off


def test_a_scene_without_sfm_tracks_is_one_line_and_exit_2(tmp_path: Path, make_config, capsys) -> None:
    def untracked(**top):  # the synthetic scene's points without tracks, as a PLY gives them
        config = make_config(**top)
        config["data"]["synthetic"]["tracks"] = False
        return config

    config = write_yaml(tmp_path / "c.yaml", untracked(loss={"depth_prior": {}}))
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "key 'loss.depth_prior'" in err[0] and "loss.depth_prior=null" in err[0], err
    assert not (tmp_path / "run").exists()  # refused before anything was written

    negative = write_yaml(tmp_path / "n.yaml", make_config(loss={"depth_prior": {"weight": -1.0}}))
    assert main(["train", "--config", str(negative)]) == 2
    assert "key 'loss.depth_prior': weight must be a finite number >= 0, got -1.0" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="loss.depth_prior"):
        DefaultTrainer(parse_structured(DefaultTrainer.Config, untracked(loss={"depth_prior": {"weight": 0.5}})))
