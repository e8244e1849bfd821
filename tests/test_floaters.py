"""PruneFloatersHook: which Gaussians count as in front of every view that sees them, pruning during training,
exact resume with it."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import write_yaml

from gsrecon.cameras import Cameras
from gsrecon.cli import main
from gsrecon.data.pipeline import Batch
from gsrecon.engine.checkpoints import load_checkpoint_file
from gsrecon.hooks import Hook
from gsrecon.model.ops import row_counts
from gsrecon.registry import RENDERER_REGISTRY
from gsrecon.strategy.floaters import find_floaters

torch.set_num_threads(1)

W, H = 64, 48


def _view(x: float) -> Batch:
    """A camera at (x, 0, -3) looking along +z (world and camera axes aligned)."""
    viewmat = torch.eye(4)
    viewmat[:3, 3] = torch.tensor([-x, 0.0, 3.0])
    K = torch.tensor([[40.0, 0.0, W / 2], [0.0, 40.0, H / 2], [0.0, 0.0, 1.0]])
    return Batch(torch.zeros(1, H, W, 3), Cameras(viewmat[None], K[None], W, H), torch.zeros(1, 3), [f"x{x}"])


def _gaussians(centres: list[tuple[float, float, float]], opacities: list[float], sizes: list[float]) -> dict:
    n = len(centres)
    return {
        "means": torch.tensor(centres),
        "scales": torch.log(torch.tensor(sizes))[:, None].expand(n, 3).clone(),
        "quats": torch.tensor([[1.0, 0.0, 0.0, 0.0]]).expand(n, 4).clone(),
        "opacities": torch.logit(torch.tensor(opacities)),
        "sh0": torch.full((n, 1, 3), 0.5),
        "shN": torch.zeros(n, 0, 3),
    }


def test_only_translucent_gaussians_in_front_of_every_view_are_floaters() -> None:
    grid = torch.linspace(-1.5, 1.5, 31).tolist()
    wall = [(x, y, 0.0) for x in grid for y in grid]  # an opaque wall 3 m in front of the cameras
    others = {
        "haze": ((0.0, 0.0, -1.5), 0.2, 0.05),  # translucent, half-way to the wall: in front in every view
        "opaque": ((0.4, 0.3, -1.5), 0.99, 0.1),  # as near, but it is what its pixels show
        "behind": ((0.2, -0.2, 1.0), 0.5, 0.05),  # behind the wall
        "unseen": ((5.0, 5.0, -1.5), 0.2, 0.05),  # outside every image
        "haze_beside": ((-0.3, 0.2, -1.0), 0.3, 0.05),
        "past_the_edge": ((-0.5, 0.2, -2.0), 0.3, 0.05),  # one view sees only empty space behind it
    }
    params = _gaussians(
        wall + [c for c, _, _ in others.values()],
        [0.99] * len(wall) + [o for _, o, _ in others.values()],
        [0.06] * len(wall) + [s for _, _, s in others.values()],
    )
    renderer = RENDERER_REGISTRY.build({"name": "torch"})

    def render(batch: Batch):
        return renderer.render_batch(params, batch, 0)

    views = [_view(x) for x in (-0.3, 0.0, 0.3)]
    floaters = find_floaters(render, views, len(params["means"]), margin=0.2, min_alpha=0.5)
    flagged = {name for i, name in enumerate(others) if floaters[len(wall) + i]}
    assert flagged == {"haze", "haze_beside"}
    assert not floaters[: len(wall)].any()

    # A wall too faint to count as a surface (opacity below min_alpha at every pixel) hides nothing.
    assert not find_floaters(render, views, len(params["means"]), margin=0.2, min_alpha=1.0).any()
    with pytest.raises(ValueError, match="at least one view"):
        find_floaters(render, [], len(params["means"]), margin=0.2, min_alpha=0.5)


PRUNE = {"start": 2, "every": 2, "stop": 6, "margin": 0.01, "min_alpha": 0.0}
STRATEGY = {"name": "default", "refine_start": 1, "refine_every": 2, "refine_stop": 6, "grow_grad2d": 1e-6}


def test_pruning_during_training_keeps_the_strategy_state_aligned_and_resumes_exactly(make_config, make_trainer):
    hooks = {**make_config()["hooks"], "PruneFloatersHook": PRUNE}
    full = make_trainer("full", strategy=STRATEGY, hooks=hooks)
    full.train()
    hook = full.hooks["PruneFloatersHook"]
    assert hook.pruned > 0
    assert len(full.strategy_state["grad2d"]) == full.model.num_gaussians  # pruned alike, rows still match

    step_3 = full.exp_dir / "checkpoints" / "step_000003.pt"
    resumed = make_trainer("resumed", strategy=STRATEGY, hooks=hooks, resume=str(step_3))
    resumed.train()
    reference = load_checkpoint_file(full.exp_dir / "checkpoints" / "last.pt")
    again = load_checkpoint_file(resumed.exp_dir / "checkpoints" / "last.pt")
    assert again["step"] == reference["step"] == 6
    for name, value in reference["params"].items():
        assert torch.equal(again["params"][name], value), name
    assert math.isfinite(full.val_metrics["psnr"])


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [("margin", 1.5, "margin must be in (0, 1), got 1.5"), ("every", 0, "every must be >= 1, got 0")],
)
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, make_config, capsys, key, value, message) -> None:
    config = make_config(hooks={"PruneFloatersHook": {key: value}})
    path = write_yaml(tmp_path / "c.yaml", config)
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "key 'hooks.PruneFloatersHook'" in err[0] and message in err[0], err
    assert not (tmp_path / "run").exists()


class _RowCheck(Hook):
    """After every step (after the other hooks, pruning included): the rows of everything per Gaussian."""

    def __init__(self) -> None:
        self.counts: list[int] = []

    def after_train_iter(self, trainer) -> None:
        rows = row_counts(
            trainer.model.params, trainer.optimizers, trainer.strategy_state, trainer.strategy.per_gaussian_state
        )
        assert len(set(rows.values())) == 1, rows
        assert any(key.startswith("state.") for key in rows) or trainer.strategy.per_gaussian_state == ()
        self.counts.append(trainer.model.num_gaussians)


@pytest.mark.parametrize(
    "strategy",
    [
        {**STRATEGY, "reset_every": 4},  # grow, split, prune and reset opacities
        {"name": "mcmc", "refine_start": 1, "refine_every": 2, "refine_stop": 6, "grow_rate": 1.5},  # relocate, add
    ],
    ids=["default", "mcmc"],
)
def test_every_row_changing_path_keeps_parameters_moments_and_state_aligned(make_config, make_trainer, strategy):
    trainer = make_trainer(strategy=strategy, hooks={**make_config()["hooks"], "PruneFloatersHook": PRUNE})
    check = trainer.hooks["RowCheck"] = _RowCheck()
    trainer.train()
    assert len(check.counts) == 6 and len(set(check.counts)) > 1  # the set of Gaussians changed, and stayed aligned
    assert trainer.hooks["PruneFloatersHook"].pruned > 0


def test_the_editor_refuses_a_mask_of_another_length(make_trainer) -> None:
    editor = make_trainer().edit_gaussians()
    with pytest.raises(ValueError, match="bool mask of shape"):
        editor.remove(torch.zeros(editor.num_gaussians + 1, dtype=torch.bool))
