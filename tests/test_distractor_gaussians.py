"""Per-view distractor Gaussians (DeSplat; gsrecon.model.views.distractors, views: {name: distractors})."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gsrecon.cameras import CameraModel, Cameras
from gsrecon.cameras.lens import project_points
from gsrecon.cli import main
from gsrecon.component import RunFacts, RunSetup
from gsrecon.data.pipeline import Batch
from gsrecon.engine.checkpoints import load_checkpoint_file
from gsrecon.io.ply import read_ply
from gsrecon.model.views.base import ViewModules
from gsrecon.model.views.distractors import DistractorGaussians
from gsrecon.optim import LambdaLR
from gsrecon.registry import RENDERER_REGISTRY
from tests.conftest import SCRIPTS, write_yaml

DISTRACTORS = {"distractors": {"name": "distractors", "count": 60}}
K = torch.tensor([[30.0, 0.0, 16.0], [0.0, 30.0, 12.0], [0.0, 0.0, 1.0]])
NAMES = ["a", "b", "c"]


def _frame(name: str) -> SimpleNamespace:
    return SimpleNamespace(name=name, K=K, width=32, height=24)


def _module(renderer: str = "torch", **options) -> DistractorGaussians:
    """A module for three 32x24 training views, placed and given ``renderer``."""
    torch.manual_seed(0)
    module = DistractorGaussians(DistractorGaussians.Config(**{"count": 60, **options}), NAMES)
    data = SimpleNamespace(train_frames=[_frame(name) for name in reversed(NAMES)])
    module.setup(RunSetup(print, data, render=RENDERER_REGISTRY.build({"name": renderer}).render))
    return module


def _batch(names: list[str], images: torch.Tensor | None = None) -> Batch:
    viewmats = torch.eye(4).repeat(len(names), 1, 1)
    viewmats[:, 2, 3] = 4.0  # anywhere: the distractors live in the camera's own frame
    cameras = Cameras(viewmats, K.repeat(len(names), 1, 1), 32, 24)
    images = torch.rand(len(names), 24, 32, 3) if images is None else images
    return Batch(images, cameras, torch.zeros(len(names), 3), names)


def test_each_view_starts_with_its_own_gaussians_on_a_plane_in_front_of_it_over_its_whole_image() -> None:
    module = _module(distance=0.05)
    assert module.means.shape == (3, 60, 3) and module.opacities.shape == (3, 60)
    torch.testing.assert_close(module.means[..., 2], torch.full((3, 60), 0.05))
    for row in range(3):
        pixels, seen = project_points(module.means[row].detach(), torch.eye(4), K, CameraModel())
        assert seen.all()
        assert (pixels[:, 0] >= 0).all() and (pixels[:, 0] <= 32).all()
        assert (pixels[:, 1] >= 0).all() and (pixels[:, 1] <= 24).all()
        assert pixels[:, 0].std() > 6 and pixels[:, 1].std() > 4  # spread over the image, not clumped
    assert not torch.equal(module.means[0], module.means[1])  # each view its own set
    torch.testing.assert_close(torch.sigmoid(module.opacities), torch.full((3, 60), 0.1))
    torch.testing.assert_close(module.quats.norm(dim=-1), torch.ones(3, 60))


@pytest.mark.parametrize("renderer", ["torch", "cpu"])
def test_the_image_is_the_distractors_over_the_scene_and_only_its_view_learns(renderer: str) -> None:
    """c = c_d + (1 - a_d) c_s with the view's own Gaussians drawn by the run's renderer; the gradient reaches the
    Gaussians of the views in the batch and no other view's."""
    module = _module(renderer)
    batch = _batch(["b"])
    static = torch.rand(1, 24, 32, 3, requires_grad=True)
    image = module.adjust_image(static, batch, SimpleNamespace())
    color, alpha = module.draw(batch)
    assert alpha.min() > 0.0 and alpha.max() < 1.0  # a veil over the whole image at the start
    torch.testing.assert_close(image, color + (1.0 - alpha) * static)
    (image - batch.images).abs().mean().backward()
    for name in ("means", "scales", "quats", "opacities", "colors"):
        grad = getattr(module, name).grad
        assert grad[1].abs().sum() > 0, name  # view b's row
        assert grad[[0, 2]].abs().sum() == 0, name  # a's and c's rows untouched
    assert static.grad.abs().sum() > 0  # the scene still learns beneath them


def test_cpu_and_torch_draw_the_same_distractors() -> None:
    batch = _batch(["a", "c"])
    with torch.no_grad():
        drawn = [_module(renderer).draw(batch) for renderer in ("torch", "cpu")]
    for torch_drawn, cpu_drawn in zip(*drawn):
        torch.testing.assert_close(cpu_drawn, torch_drawn, atol=2e-4, rtol=0)


def test_the_regularisers_are_the_distractors_opacity_and_the_scenes_transparency() -> None:
    module = _module(alpha_reg=0.3, static_alpha_reg=0.2)
    views = ViewModules({"distractors": module})
    batch = _batch(["a"])
    static_alpha = torch.rand(1, 24, 32, 1)
    out = SimpleNamespace(alpha=static_alpha)
    assert views.composite(out, batch) is out  # the render itself is left as it is (test views, the viewer)
    drawn, terms = views.draw(out, batch)  # the training step's composite, with the terms of the scene's render
    assert drawn is out
    _, alpha = module.draw(batch)
    expected = 0.3 * alpha.mean() + 0.2 * (1.0 - static_alpha).mean()
    torch.testing.assert_close(views.regularization(out, batch, terms)["distractors"], expected)
    off = ViewModules({"distractors": _module(alpha_reg=0.0, static_alpha_reg=0.0)})
    assert off.regularization(out, batch, off.draw(out, batch)[1]) == {}


def test_the_views_optimiser_steps_the_trained_view_at_desplats_rates_and_decays_the_positions() -> None:
    module = _module(decay_steps=10)
    views = ViewModules({"distractors": module})
    rates = {group["name"]: group["lr"] for group in views.optimizers["distractors"].param_groups}
    assert rates == {"means": 1.6e-4, "scales": 0.05, "quats": 0.01, "opacities": 0.05, "colors": 0.025}
    before = {name: value.detach().clone() for name, value in module.named_parameters()}
    batch = _batch(["c"])
    out = SimpleNamespace(alpha=torch.rand(1, 24, 32, 1))
    image = views.adjust_image(torch.rand(1, 24, 32, 3), batch, out)
    drawn = views.draw(out, batch)[1]
    ((image - batch.images).abs().mean() + views.regularization(out, batch, drawn)["distractors"]).backward()
    views.step(["c"], SimpleNamespace(enabled=False, all_reduce_grads=lambda grads: None))
    for name, value in module.named_parameters():
        assert not torch.equal(value[2], before[name][2]), name
        assert torch.equal(value[:2], before[name][:2]), name
    for _ in range(9):
        views.schedulers["distractors"].step()
    rates = {group["name"]: group["lr"] for group in views.optimizers["distractors"].param_groups}
    assert rates["means"] == pytest.approx(1.6e-6) and rates["colors"] == 0.025  # only the positions decay


def test_test_views_are_scored_as_the_scene_renders_them(make_trainer) -> None:
    trainer = make_trainer("scored", views=DISTRACTORS, max_steps=2)
    trainer.train()
    batch = next(iter(trainer.datapipeline.val_batches()))
    with torch.no_grad():
        scored = trainer.render(batch).image
        scene = trainer.renderer.render_batch(trainer.model.params, batch, trainer.model.active_sh_degree(2)).image
    assert torch.equal(scored, scene)


def test_distractors_from_the_command_line_train_resume_exactly_evaluate_and_are_not_exported(
    make_config, tmp_path: Path, capsys
) -> None:
    for renderer in ("torch", "cpu"):
        whole = write_yaml(
            tmp_path / f"{renderer}.yaml", make_config(renderer, views=DISTRACTORS, renderer={"name": renderer})
        )
        assert main(["train", "--config", str(whole)]) == 0
        exp_dir = tmp_path / renderer
        step_3 = exp_dir / "checkpoints" / "step_000003.pt"
        resumed_yaml = write_yaml(
            tmp_path / f"{renderer}_resumed.yaml",
            make_config(f"{renderer}_resumed", views=DISTRACTORS, renderer={"name": renderer}, resume=str(step_3)),
        )
        assert main(["train", "--config", str(resumed_yaml)]) == 0
        reference = load_checkpoint_file(exp_dir / "checkpoints" / "last.pt")
        resumed = load_checkpoint_file(tmp_path / f"{renderer}_resumed" / "checkpoints" / "last.pt")
        assert resumed["step"] == 6
        for name, value in reference["params"].items():
            assert torch.equal(resumed["params"][name], value), name
        saved, restored = reference["views"]["distractors"], resumed["views"]["distractors"]
        assert saved["module"].keys() == {"means", "scales", "quats", "opacities", "colors"}
        for name, value in saved["module"].items():
            assert torch.equal(restored["module"][name], value), name
        assert not torch.equal(
            saved["module"]["means"], load_checkpoint_file(step_3)["views"]["distractors"]["module"]["means"]
        )
        for group, state in saved["optimizer"]["state"].items():
            assert all(torch.equal(state[key], restored["optimizer"]["state"][group][key]) for key in state)
        assert restored["scheduler"]["last_epoch"] == saved["scheduler"]["last_epoch"] == 6
    assert main(["eval", "--exp-dir", str(exp_dir), "--device", "cpu"]) == 0
    out = tmp_path / "scene.ply"
    capsys.readouterr()
    assert main(["export", "--exp-dir", str(exp_dir), "--format", "ply", "--out", str(out)]) == 0
    assert "distractor Gaussians are not in it" in capsys.readouterr().err
    vertex = read_ply(out)["vertex"]  # the scene's Gaussians and nothing else
    assert torch.equal(torch.from_numpy(vertex["x"].copy()), reference["params"]["means"][:, 0])


def test_a_run_resumes_without_the_distractors_and_with_them_added(make_config, tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "run.yaml", make_config("run", views=DISTRACTORS, max_steps=3))
    assert main(["train", "--config", str(path)]) == 0
    exp_dir = tmp_path / "run"
    assert main(["train", "--config", str(path), "resume=true", "max_steps=5", "views.distractors=null"]) == 0
    assert "views.distractors" in (exp_dir / "train.log").read_text().split("resumed from")[-1]
    assert "distractors" not in load_checkpoint_file(exp_dir / "checkpoints" / "last.pt")["views"]
    assert main(["train", "--config", str(path), "resume=true", "max_steps=6"]) == 0  # added back: starts afresh
    saved = load_checkpoint_file(exp_dir / "checkpoints" / "last.pt")["views"]["distractors"]["module"]
    assert saved["means"].shape == (7, 60, 3) and (saved["means"][..., 2] > 0).all()


@pytest.mark.slow
def test_a_distractor_pasted_into_one_photo_is_drawn_by_that_photos_gaussians(make_trainer) -> None:
    """What only one training photo shows is where its distractor Gaussians grow opaque (150 steps, ~20 s)."""
    hooks = {"PasteDistractors": {"seed": 1}, "CheckPointHook": {"interval": 1000, "max_keep": 0}}
    trainer = make_trainer(
        "pasted",
        data={"dataset": "synthetic", "synthetic": {"width": 64, "height": 48, "num_views": 9, "supersample": 2}},
        views={"distractors": {"name": "distractors", "count": 200}},
        max_steps=150,
        val_interval=1000,
        hooks=hooks,
        imports=[str(SCRIPTS / "paste_distractors.py")],
    )
    trainer.train()
    paste = next(hook for hook in trainer.hooks.values() if type(hook).__name__ == "PasteDistractors")
    module = trainer.views.modules["distractors"]
    for name, covered in paste.covered.items():
        batch = next(b for b in map(trainer.datapipeline.next_train, range(150, 250)) if b.names == [name])
        with torch.no_grad():
            alpha = module.draw(batch)[1][0, ..., 0]  # [H, W]
        assert alpha[covered].mean() > alpha[~covered].mean() + 0.1, name  # measured: 0.57 vs 0.20, 0.37 vs 0.20


@pytest.mark.parametrize(
    ("options", "renderer"),
    [
        ({"count": 0}, {}),
        ({"count": "many"}, {}),
        ({"count": True}, {}),
        ({"count": 10**6}, {}),
        ({"distance": -0.02}, {}),
        ({"distance": float("nan")}, {}),
        ({"distance": 0.005}, {}),  # behind the renderer's near plane (0.01): never drawn
        ({"alpha_reg": float("nan")}, {}),
        ({"static_alpha_reg": -0.01}, {}),
        ({"means_lr": 2.0}, {}),
        ({"opacity_lr": "fast"}, {}),
        ({"means_lr_final_factor": 0.0}, {}),
        ({"decay_steps": 0}, {}),
        ({"lr": float("inf")}, {}),
        ({}, {"near_plane": 0.05}),
    ],
)
def test_bad_distractor_options_name_the_key(make_config, tmp_path: Path, capsys, options, renderer) -> None:
    cfg = make_config("bad", views={"distractors": {"name": "distractors", **options}})
    cfg["renderer"].update(renderer)
    assert main(["train", "--config", str(write_yaml(tmp_path / "bad.yaml", cfg))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "views.distractors" in err[0]


def test_a_renderer_with_sparse_gradients_is_refused() -> None:
    module = DistractorGaussians(DistractorGaussians.Config(), NAMES)
    facts = RunFacts({"renderer": {"name": "gsplat", "packed": True, "sparse_grad": True}}, 10, False, False)
    with pytest.raises(ValueError, match="renderer.sparse_grad"):
        module.check(facts)


def test_a_schedule_takes_one_function_per_group_and_refuses_a_list_of_another_length() -> None:
    optimizer = DistractorGaussians(DistractorGaussians.Config(), NAMES).build_optimizer()
    scheduler = LambdaLR(optimizer, [lambda step: 0.5**step] + [lambda step: 1.0] * 4)
    scheduler.step()
    assert [group["lr"] for group in optimizer.param_groups] == [0.8e-4, 0.05, 0.01, 0.05, 0.025]
    with pytest.raises(ValueError, match="2 lr_lambdas for 5 parameter groups"):
        LambdaLR(optimizer, [lambda step: 1.0] * 2)
