"""SkipLearntViewsHook: steps of learnt views leave out their update, within the budget, resumed exactly."""

from __future__ import annotations

import pytest
import torch
from conftest import read_scalars, write_yaml

from gsrecon.cli import main
from gsrecon.hooks import Hook

SKIPPING = {"name": "SkipLearntViewsHook", "start": 5, "warmup": 5, "tolerance": 10.0, "min_updates": 0.3}
HOOKS = [{"name": "LogHook", "progress": False}, {"name": "UpdateWatchHook"}]
CHANGED: list[tuple[bool, bool]] = []  # (the trainer said it updated, the means changed), a step each


class UpdateWatchHook(Hook):
    """Records, every step, whether the trainer updated and whether the Gaussians' centres moved (test helper)."""

    def before_train_iter(self, trainer) -> None:
        self.means = trainer.model.params["means"].detach().clone()

    def after_train_iter(self, trainer) -> None:
        moved = not torch.equal(self.means, trainer.model.params["means"])
        CHANGED.append((trainer.outputs["updated"], moved))


@pytest.fixture(autouse=True)
def _register_test_hooks(hook_registry) -> None:
    hook_registry.register()(UpdateWatchHook)
    CHANGED.clear()


def test_learnt_views_leave_out_their_update_within_the_budget(make_trainer) -> None:
    trainer = make_trainer(max_steps=40, val_interval=40, strategy={"name": "none"}, hooks=[*HOOKS, SKIPPING])
    trainer.train()
    assert all(updated == moved for updated, moved in CHANGED), "a skipped step changed nothing, an update did"
    assert all(updated for updated, _ in CHANGED[:10]), "nothing is skipped before start + warmup"
    after_start = [updated for updated, _ in CHANGED[5:]]
    skipped = after_start.count(False)
    assert skipped > 0 and after_start.count(True) >= 0.3 * len(after_start)
    hook = trainer.hooks["SkipLearntViewsHook"]
    assert (hook.counted, hook.counted - hook.updated) == (35, skipped)
    assert "left out their update" in (trainer.exp_dir / "train.log").read_text()


def test_nothing_is_skipped_where_no_loss_is_close_to_its_average(make_trainer) -> None:
    hooks = [*HOOKS, {**SKIPPING, "tolerance": 0.0, "log_interval": 10}]
    trainer = make_trainer(max_steps=30, val_interval=30, strategy={"name": "none"}, hooks=hooks)
    trainer.train()
    assert all(updated for updated, _ in CHANGED)
    assert set(read_scalars(trainer.exp_dir, "train/skipped_share").values()) == {0.0}


def test_a_resumed_run_is_bit_identical(make_trainer) -> None:
    hooks = [*HOOKS, SKIPPING, {"name": "CheckPointHook", "interval": 15}]
    full = make_trainer("full", max_steps=30, val_interval=30, strategy={"name": "none"}, hooks=hooks)
    full.train()
    resumed = make_trainer(
        "resumed", max_steps=30, val_interval=30, strategy={"name": "none"}, hooks=hooks,
        resume=str(full.exp_dir / "checkpoints" / "step_000015.pt"),
    )  # fmt: skip
    resumed.train()
    assert full.hooks["SkipLearntViewsHook"].state_dict() == resumed.hooks["SkipLearntViewsHook"].state_dict()
    for name, param in full.model.params.items():
        assert torch.equal(param, resumed.model.params[name]), name


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (
            ["strategy.name=default", "strategy.refine_stop=20", "hooks.SkipLearntViewsHook.start=10"],
            "start=10 is before strategy.refine_stop=20: strategy 'default' reads every step's screen-space gradients",
        ),
        (["data.batch_size=2"], "data.batch_size must be 1"),
        (["hooks.SkipLearntViewsHook.decay=1.5"], "SkipLearntViewsHook decay must be in [0, 1], got 1.5"),
        (["hooks.SkipLearntViewsHook.tolerance=nan"], "tolerance must be a finite number >= 0, got nan"),
        (["hooks.SkipLearntViewsHook.start=-1"], "SkipLearntViewsHook start must be >= 0, got -1"),
    ],
)
def test_bad_settings_exit_2_in_one_line(make_config, tmp_path, capsys, overrides, words) -> None:
    config = make_config(strategy={"name": "none"}, hooks={"SkipLearntViewsHook": {"start": 30}})
    path = write_yaml(tmp_path / "c.yaml", config)
    assert main(["train", "--config", str(path), *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "SkipLearntViewsHook" in err, err
