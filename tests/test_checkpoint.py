"""Checkpoints: rotation, best, atomicity, exact resume, Ctrl-C, non-finite losses."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from conftest import read_scalars, write_yaml

from gsrecon.cli import main
from gsrecon.engine.checkpoints import load_checkpoint_file
from gsrecon.engine.trainer import HookError
from gsrecon.errors import InputError
from gsrecon.hooks import Hook
from gsrecon.model.optim import RowSparseAdam
from gsrecon.model.views.optim import VisitedRowsAdam
from gsrecon.optim import Adam


class SigintAtStepHook(Hook):
    """Sends this process a real SIGINT (as Ctrl-C does) after a given step (test helper)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def after_train_iter(self, trainer) -> None:
        if trainer.step == self.step:
            os.kill(os.getpid(), signal.SIGINT)


class PoisonAtStepHook(Hook):
    """Makes the model's colours NaN before a given step, so that step's loss is NaN (test helper)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def before_train_iter(self, trainer) -> None:
        if trainer.step + 1 == self.step:
            with torch.no_grad():
                trainer.model.params["sh0"].fill_(float("nan"))


class PoisonMeansAtStepHook(Hook):
    """Makes the model's means NaN after a given step, before other hooks look (test helper)."""

    priority = "HIGHEST"

    def __init__(self, step: int) -> None:
        self.step = step

    def after_train_iter(self, trainer) -> None:
        if trainer.step == self.step:
            with torch.no_grad():
                trainer.model.params["means"][:10] = float("nan")


@pytest.fixture(autouse=True)
def _register_test_hooks(hook_registry) -> None:
    for cls in (
        SigintAtStepHook,
        PoisonAtStepHook,
        PoisonMeansAtStepHook,
    ):
        hook_registry.register()(cls)


def _hooks(interval: int, **ckpt) -> list[dict]:
    return [
        {"name": "CheckInvalidLossHook"},
        {"name": "LogHook", "progress": False, "log_interval": 1},
        {"name": "CheckPointHook", "interval": interval, **ckpt},
    ]


def test_rotation_keeps_newest_and_last_points_at_newest(make_trainer) -> None:
    trainer = make_trainer(max_steps=7, hooks=_hooks(2, max_keep=2, save_best="psnr"))
    trainer.train()
    ckpt_dir = trainer.exp_dir / "checkpoints"
    assert sorted(p.name for p in ckpt_dir.glob("step_*.pt")) == ["step_000006.pt", "step_000007.pt"]
    last = load_checkpoint_file(ckpt_dir / "last.pt")
    assert last["step"] == 7
    assert not list(ckpt_dir.glob(".*tmp*")), "temporary files must not be left behind"
    best = load_checkpoint_file(ckpt_dir / "best.pt")
    hook = trainer.hooks["CheckPointHook"]
    assert best["step"] == hook.best_step and hook.best_value is not None
    psnr = {r: v for r, v in read_scalars(trainer.exp_dir, "val/psnr").items()}
    assert hook.best_value == pytest.approx(max(psnr.values()))


def test_best_with_rule_less(make_trainer) -> None:
    trainer = make_trainer(max_steps=6, hooks=_hooks(0, save_best="psnr", rule="less"))
    trainer.train()
    psnr = read_scalars(trainer.exp_dir, "val/psnr")
    hook = trainer.hooks["CheckPointHook"]
    assert hook.best_value == pytest.approx(min(psnr.values()))
    assert hook.best_step == min(psnr, key=psnr.get)


def test_best_lpips_keeps_the_lowest_without_a_rule(make_trainer, make_config) -> None:
    """Lower LPIPS is better: the rule follows the metric unless ``rule`` is given."""
    from gsrecon.lpips_weights import lpips_backbone_path

    if not lpips_backbone_path("alex").is_file():
        pytest.skip("LPIPS weights not in the gsrecon cache: run `gsrecon weights lpips` first")
    data = make_config()["data"]
    data["synthetic"] |= {"width": 48, "height": 32}  # AlexNet's LPIPS needs sides of 31 pixels or more
    trainer = make_trainer(
        max_steps=6, val_interval=2, data=data, metrics={"lpips_net": "alex"}, hooks=_hooks(0, save_best="lpips")
    )
    trainer.train()
    lpips = read_scalars(trainer.exp_dir, "val/lpips")
    assert len(set(lpips.values())) > 1
    hook = trainer.hooks["CheckPointHook"]
    assert hook.best_value == pytest.approx(min(lpips.values()))
    assert load_checkpoint_file(trainer.exp_dir / "checkpoints" / "best.pt")["step"] == min(lpips, key=lpips.get)


@pytest.mark.parametrize("save_last", [True, False])
def test_save_last_decides_the_final_checkpoint(make_trainer, save_last: bool) -> None:
    trainer = make_trainer(max_steps=5, hooks=_hooks(2, save_last=save_last))
    trainer.train()
    saved = sorted(p.name for p in (trainer.exp_dir / "checkpoints").glob("step_*.pt"))
    assert saved == ["step_000002.pt", "step_000004.pt", *(["step_000005.pt"] if save_last else [])]


def _final_params(exp_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint_file(exp_dir / "checkpoints" / "last.pt")["params"]


def test_ctrl_c_then_resume_matches_the_uninterrupted_run(make_trainer) -> None:
    steps = 8
    reference = make_trainer("full", max_steps=steps, hooks=_hooks(4))
    reference.train()
    assert reference.stop_reason is None

    interrupted = make_trainer("split", max_steps=steps, hooks=[*_hooks(100), {"name": "SigintAtStepHook", "step": 3}])
    interrupted.train()
    assert interrupted.stop_reason == "interrupted at step 3"
    assert load_checkpoint_file(interrupted.exp_dir / "checkpoints" / "last.pt")["step"] == 3

    resumed = make_trainer("split", max_steps=steps, hooks=_hooks(100), resume=True)
    resumed.train()
    assert resumed.step == steps

    ref_loss = read_scalars(reference.exp_dir, "train/loss")
    res_loss = read_scalars(resumed.exp_dir, "train/loss")
    assert set(res_loss) == set(range(1, steps + 1))
    for step in range(1, steps + 1):
        assert res_loss[step] == pytest.approx(ref_loss[step], rel=1e-5, abs=1e-7), step
    # The EMA in LogHook survived the resume too.
    assert read_scalars(resumed.exp_dir, "train/ema_loss")[steps] == pytest.approx(
        read_scalars(reference.exp_dir, "train/ema_loss")[steps], rel=1e-5
    )
    for name, value in _final_params(reference.exp_dir).items():
        torch.testing.assert_close(_final_params(resumed.exp_dir)[name], value, rtol=1e-5, atol=1e-6)


def test_resume_from_an_explicit_checkpoint_path(make_trainer) -> None:
    first = make_trainer("a", max_steps=6, hooks=_hooks(3))
    first.train()
    path = first.exp_dir / "checkpoints" / "step_000003.pt"
    again = make_trainer("b", max_steps=6, hooks=_hooks(3), resume=str(path))
    again.train()
    assert read_scalars(again.exp_dir, "train/loss").keys() == {4, 5, 6}
    torch.testing.assert_close(_final_params(again.exp_dir)["means"], _final_params(first.exp_dir)["means"])


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(make_trainer) -> None:
    trainer = make_trainer(max_steps=8, hooks=[*_hooks(2), {"name": "PoisonAtStepHook", "step": 5}])
    with pytest.raises(HookError, match=r"CheckInvalidLossHook.*loss is nan at step 5"):
        trainer.train()
    ckpt_dir = trainer.exp_dir / "checkpoints"
    assert sorted(p.name for p in ckpt_dir.glob("step_*.pt")) == ["step_000002.pt", "step_000004.pt"]
    last = load_checkpoint_file(ckpt_dir / "last.pt")
    assert last["step"] == 4 and torch.isfinite(last["params"]["sh0"]).all()


def test_a_non_finite_loss_between_checks_is_named_by_its_step(make_trainer) -> None:
    """The loss is read back every ``interval`` steps (a read waits for the GPU), yet names the first bad step."""
    hooks = [
        {"name": "CheckInvalidLossHook", "interval": 4, "params_interval": 1000},
        {"name": "PoisonAtStepHook", "step": 5},
    ]
    trainer = make_trainer(max_steps=12, hooks=hooks)
    with pytest.raises(HookError, match=r"CheckInvalidLossHook.after_train_iter: the loss is nan at step 5"):
        trainer.train()
    assert trainer.step == 8


def test_broken_checkpoint_files_give_clear_errors(tmp_path: Path, make_trainer) -> None:
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="bad.pt is truncated or not a PyTorch checkpoint"):
        load_checkpoint_file(bad)
    trainer = make_trainer(max_steps=3, hooks=_hooks(3))
    trainer.train()
    data = (trainer.exp_dir / "checkpoints" / "last.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cut.pt is truncated or not a PyTorch checkpoint"):
        load_checkpoint_file(tmp_path / "cut.pt")
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        make_trainer("other", resume=str(tmp_path / "missing.pt"))


def test_nothing_to_resume_is_an_error(make_trainer) -> None:
    with pytest.raises(ValueError, match="nothing to resume"):
        make_trainer(resume=True)


def test_resume_refuses_a_config_whose_model_does_not_fit_the_checkpoint(make_trainer) -> None:
    trainer = make_trainer(max_steps=3, hooks=_hooks(3))
    trainer.train()
    config_before = (trainer.exp_dir / "config.yaml").read_text()
    with pytest.raises(ValueError, match=r"model\.sh_degree=1 but this config has model\.sh_degree=3"):
        make_trainer(max_steps=6, hooks=_hooks(3), resume=True, model={"sh_degree": 3})
    assert (trainer.exp_dir / "config.yaml").read_text() == config_before  # nothing rewritten
    resumed = make_trainer(max_steps=6, hooks=_hooks(3), resume=True)  # max_steps may change
    resumed.train()
    assert resumed.step == 6
    assert "resuming with changed settings: max_steps: 3 -> 6" in (trainer.exp_dir / "train.log").read_text()


def test_non_finite_parameters_stop_training_even_with_a_finite_loss(make_trainer) -> None:
    """NaN means make a renderer drop those Gaussians, so the loss stays finite: the parameters are checked."""

    hooks = [
        {"name": "CheckInvalidLossHook", "params_interval": 1},
        {"name": "CheckPointHook", "interval": 2},
        {"name": "PoisonMeansAtStepHook", "step": 3},
    ]
    trainer = make_trainer(max_steps=6, hooks=hooks)
    with pytest.raises(HookError, match=r"Gaussian parameters means are not finite at step 3.*step_000002.pt is kept"):
        trainer.train()
    assert load_checkpoint_file(trainer.exp_dir / "checkpoints" / "last.pt")["step"] == 2
    assert not (trainer.exp_dir / "point_cloud.ply").exists()


def _damaged_checkpoint(make_trainer, tmp_path: Path, damage) -> Path:
    """A 3-step run's last checkpoint, its dict changed by ``damage(checkpoint)``, saved as ``tmp_path/damaged.pt``."""
    trainer = make_trainer("source", max_steps=3, hooks=_hooks(3))
    trainer.train()
    checkpoint = torch.load(trainer.exp_dir / "checkpoints" / "last.pt", weights_only=True)
    damage(checkpoint)
    torch.save(checkpoint, tmp_path / "damaged.pt")
    return tmp_path / "damaged.pt"


def _means_state(checkpoint: dict) -> dict:
    return checkpoint["optimizers"]["means"]["state"][0]


def _short_exp_avg(checkpoint: dict) -> None:
    _means_state(checkpoint)["exp_avg"] = _means_state(checkpoint)["exp_avg"][:-1].clone()


def _integer_exp_avg_sq(checkpoint: dict) -> None:
    _means_state(checkpoint)["exp_avg_sq"] = torch.zeros(
        _means_state(checkpoint)["exp_avg_sq"].shape, dtype=torch.int32
    )


def _no_exp_avg(checkpoint: dict) -> None:
    del _means_state(checkpoint)["exp_avg"]


def _matrix_step(checkpoint: dict) -> None:
    _means_state(checkpoint)["step"] = torch.zeros(4)


def _unknown_optimizer(checkpoint: dict) -> None:
    checkpoint["optimizers"]["colours"] = checkpoint["optimizers"]["sh0"]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_short_exp_avg, r"optimizers\.means\.state\.0\.exp_avg has shape \(299, 3\), not \(300, 3\)"),
        (_integer_exp_avg_sq, r"optimizers\.means\.state\.0\.exp_avg_sq is a tensor of torch\.int32"),
        (_no_exp_avg, r"optimizers\.means\.state\.0 has no 'exp_avg'"),
        (_matrix_step, r"optimizers\.means\.state\.0\.step has shape \(4,\), not \(\)"),
        (_unknown_optimizer, r"optimizers\.colours: this run has no optimiser 'colours'"),
    ],
)
def test_optimiser_state_that_does_not_fit_its_parameter_is_refused(make_trainer, tmp_path: Path, damage, message):
    """Adam's state is written in place over its parameter's buffer: a file's state of another shape or dtype must
    never reach a step (the fused Adam wrote past the buffer). Resumed at the checkpoint's step, so that a
    checkpoint accepted without a check runs no step."""
    path = _damaged_checkpoint(make_trainer, tmp_path, damage)
    resumed = make_trainer("resumed", max_steps=3, hooks=_hooks(3), resume=str(path))
    with pytest.raises(InputError, match=rf"cannot resume {path}: {message}"):
        resumed.train()


def test_a_bad_optimiser_state_exits_2_naming_the_checkpoint_and_key(capsys, make_config, make_trainer, tmp_path):
    path = _damaged_checkpoint(make_trainer, tmp_path, _short_exp_avg)
    config = write_yaml(tmp_path / "c.yaml", make_config("cli", max_steps=3, hooks=_hooks(3)))
    assert main(["train", "--config", str(config), f"resume={path}"]) == 2
    err = capsys.readouterr().err
    assert f"cannot resume {path}: optimizers.means.state.0.exp_avg has shape (299, 3), not (300, 3)" in err


def _no_means_optimizer(checkpoint: dict) -> None:
    del checkpoint["optimizers"]["means"]


def _empty_scales_state(checkpoint: dict) -> None:
    checkpoint["optimizers"]["scales"]["state"] = {}


@pytest.mark.parametrize(("damage", "name"), [(_no_means_optimizer, "means"), (_empty_scales_state, "scales")])
def test_a_checkpoint_without_a_parameters_optimiser_state_says_it_is_no_exact_resume(
    make_trainer, tmp_path: Path, damage, name: str
) -> None:
    path = _damaged_checkpoint(make_trainer, tmp_path, damage)
    resumed = make_trainer("resumed", max_steps=4, hooks=_hooks(3), resume=str(path))
    resumed.train()
    assert resumed.step == 4
    log = (resumed.exp_dir / "train.log").read_text()
    assert f"{path} holds no optimiser state of {name}: its Adam moments start at zero (not an exact resume)" in log


def test_a_whole_checkpoint_says_nothing_about_optimiser_state(make_trainer, tmp_path: Path) -> None:
    path = _damaged_checkpoint(make_trainer, tmp_path, lambda checkpoint: None)
    resumed = make_trainer("resumed", max_steps=4, hooks=_hooks(3), resume=str(path))
    resumed.train()
    assert "optimiser state" not in (resumed.exp_dir / "train.log").read_text()


def _stepped(kind: str):
    """A fresh optimiser of ``kind`` over a [5, 3] parameter, and the state dict of another one stepped once."""

    def build():
        param = torch.nn.Parameter(torch.ones(5, 3))
        make = {"adam": Adam, "fused": lambda p, lr: Adam(p, lr=lr, fused=True), "sparse": RowSparseAdam}
        return param, make.get(kind, VisitedRowsAdam)([{"params": [param]}], lr=0.1)

    param, optimizer = build()
    param.grad = torch.ones(5, 3)
    optimizer.step()
    return build()[1], optimizer.state_dict()


@pytest.mark.parametrize("kind", ["adam", "fused", "sparse", "visited_rows"])
def test_every_optimiser_checks_each_state_entry_against_its_parameter(kind: str) -> None:
    fresh, saved = _stepped(kind)
    fresh.load_state_dict(saved)  # its own state fits
    for name, value in saved["state"][0].items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            continue
        fresh, damaged = _stepped(kind)
        damaged["state"][0][name] = value[:-1]
        with pytest.raises(InputError, match=rf"^state\.0\.{name} has shape \({value.shape[0] - 1},"):
            fresh.load_state_dict(damaged)
