"""The multiview strategy: growth only where the views' errors agree, the late pruning, exact resumes, bad options."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import write_yaml

from gsrecon.cli import main
from gsrecon.strategy.multiview import high_error_weights

GROWING = {"refine_start": 1, "refine_every": 2, "grow_grad2d": 1e-5, "reset_every": 1000}


@pytest.mark.parametrize("renderer", ["torch", "cpu"])
def test_the_weights_of_the_high_error_pixels_add_up_to_their_opacity(make_trainer, renderer: str) -> None:
    """Summed over the Gaussians, the blending weights in the flagged pixels are those pixels' accumulated opacity."""
    trainer = make_trainer(renderer={"name": renderer}, strategy={"name": "multiview"})
    params, batch = trainer.model.params, trainer.datapipeline.train_view(2)
    weights, loss = high_error_weights(trainer.strategy._draw, params, batch, 0, threshold=0.3)
    with torch.no_grad():
        out = trainer.renderer.render_batch(params, batch, 0)
        error = (out.image - batch.images).abs().mean(dim=-1)  # [1, H, W]
        normalised = (error - error.min()) / (error.max() - error.min())
        flagged = normalised > 0.3
    assert 0 < int(flagged.sum()) < flagged.numel()
    assert weights.shape == (trainer.model.num_gaussians,) and (weights >= -1e-6).all()
    torch.testing.assert_close(weights.sum(), out.alpha[..., 0][flagged].sum(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(loss, error.mean())


def test_growth_needs_the_views_to_agree(make_trainer) -> None:
    counts = {}
    for name, strategy in {
        "default": {"name": "default", **GROWING},
        "agreed": {"name": "multiview", **GROWING, "grow_score": 0.0},
        "never": {"name": "multiview", **GROWING, "grow_score": 1e9},
    }.items():
        trainer = make_trainer(name, max_steps=6, strategy=strategy)
        trainer.train()
        counts[name] = trainer.model.num_gaussians
    assert counts["never"] <= 300 < counts["agreed"] <= counts["default"]


def test_late_pruning_removes_the_transparent_and_the_worst_scored(make_trainer) -> None:
    strategy = {
        "name": "multiview", **GROWING, "refine_stop": 2, "late_prune_every": 4, "late_prune_stop": 100,
        "late_prune_opa": 0.4, "prune_score": 0.99,
    }  # fmt: skip
    trainer = make_trainer(max_steps=5, strategy=strategy)  # the late pruning runs after step 4, the last
    with torch.no_grad():
        trainer.model.params["opacities"][:50] = -3.0  # opacity 0.047
        trainer.model.params["opacities"][50:] = 3.0  # 0.95: five steps do not bring these under 0.4
    trainer.train()
    opacities = torch.sigmoid(trainer.model.params["opacities"])
    assert trainer.model.num_gaussians <= 300 - 50 - 1  # the worst scored one at least, besides the transparent
    assert opacities.min() >= 0.4
    for name, param in trainer.model.params.items():
        assert trainer.optimizers[name].state[param]["exp_avg"].shape == param.shape


@pytest.mark.parametrize(
    ("strategy", "kept"),
    [({"name": "multiview"}, True), ({"name": "default"}, False), ({"name": "multiview", "prune_scale3d": 0.1}, False)],
)
def test_large_gaussians_are_pruned_for_their_size_by_the_default_only(make_trainer, strategy, kept) -> None:
    """After the first opacity reset the default prunes Gaussians over ``prune_scale3d`` x the scene's extent; the
    multiview strategy, whose gate would not regrow the background they cover, keeps them unless asked."""
    schedule = {"refine_start": 1, "refine_every": 2, "grow_grad2d": 1e9, "reset_every": 2, "refine_stop": 100}
    trainer = make_trainer(max_steps=5, strategy={**strategy, **schedule})  # refines at 2 and 4, resets at 2 and 4
    extent = trainer.strategy_state["scene_scale"]
    with torch.no_grad():
        trainer.model.params["scales"][:20] = math.log(0.5 * extent)  # 5x the default's limit of 0.1 x the extent
        trainer.model.params["scales"][20:] = math.log(0.01 * extent)
        trainer.model.params["opacities"][:] = 3.0  # the resets leave 0.01, over prune_opa: none pruned for opacity
    trainer.train()
    large = torch.exp(trainer.model.params["scales"]).amax(dim=-1) > 0.1 * extent
    assert int(large.sum()) == (20 if kept else 0)
    assert trainer.model.num_gaussians == (300 if kept else 280)


def test_a_resumed_run_is_bit_identical(make_trainer) -> None:
    strategy = {"name": "multiview", **GROWING, "grow_score": 0.5, "refine_stop": 5, "late_prune_every": 2}
    hooks = [{"name": "LogHook", "progress": False}, {"name": "CheckPointHook", "interval": 3}]
    full = make_trainer("full", max_steps=8, strategy=strategy, hooks=hooks)
    full.train()
    resumed = make_trainer(
        "resumed", max_steps=8, strategy=strategy, hooks=hooks,
        resume=str(full.exp_dir / "checkpoints" / "step_000003.pt"),
    )  # fmt: skip
    resumed.train()
    assert full.model.num_gaussians != 300
    for name, param in full.model.params.items():
        assert torch.equal(param, resumed.model.params[name]), name


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("strategy.score_views=0", "strategy.score_views must be >= 1, got 0"),
        ("strategy.error_threshold=nan", "strategy.error_threshold must be in [0, 1], got nan"),
        ("strategy.prune_score=1.5", "strategy.prune_score must be in [0, 1], got 1.5"),
        ("strategy.grow_score=-1", "strategy.grow_score must be a finite number >= 0, got -1.0"),
        ("strategy.late_prune_every=-3", "strategy.late_prune_every must be >= 1, got -3"),
        ("strategy.score_views=many", "strategy.score_views"),
    ],
)
def test_bad_options_exit_2_in_one_line_naming_the_key(make_config, tmp_path, capsys, override, words) -> None:
    config = write_yaml(tmp_path / "c.yaml", make_config(strategy={"name": "multiview"}))
    assert main(["train", "--config", str(config), override]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err
