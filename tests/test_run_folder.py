"""The run folder is the user's: overwrite, locking, leftovers, signals, corrupt and full-disk checkpoints,
and resumes that do what they say."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import read_scalars, write_yaml

from gsrecon.cli import EXIT_INTERRUPTED, EXIT_TERMINATED, main
from gsrecon.config import ConfigError
from gsrecon.engine.checkpoints import load_checkpoint_file
from gsrecon.hooks import Hook


class SignalAtStepHook(Hook):
    """Sends this process a real signal after a given step (test helper)."""

    def __init__(self, step: int, signum: int = int(signal.SIGTERM)) -> None:
        self.step, self.signum = step, signum

    def after_train_iter(self, trainer) -> None:
        if trainer.step == self.step:
            os.kill(os.getpid(), self.signum)


@pytest.fixture(autouse=True)
def _register_test_hooks(hook_registry) -> None:
    hook_registry.register()(SignalAtStepHook)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_overwrite_replaces_only_what_the_run_wrote(make_trainer) -> None:
    first = make_trainer("run", max_steps=6)
    first.train()
    exp = first.exp_dir
    (exp / "notes.txt").write_text("mine")
    (exp / "eval").mkdir()
    (exp / "eval" / "view.png").write_bytes(b"png")
    (exp / "scene_export.ply").write_bytes(b"ply")
    second = make_trainer("run", max_steps=3, overwrite=True)
    second.train()
    assert (exp / "notes.txt").read_text() == "mine"
    assert (exp / "eval" / "view.png").read_bytes() == b"png"
    assert (exp / "scene_export.ply").read_bytes() == b"ply"
    assert not (exp / "checkpoints" / "step_000006.pt").exists(), "the old run's checkpoints are replaced"
    assert json.loads((exp / "metrics.json").read_text())["step"] == 3
    assert "kept what it did not write: ['eval', 'notes.txt', 'scene_export.ply']" in (exp / "train.log").read_text()


def test_a_second_process_cannot_train_or_overwrite_a_locked_run(make_trainer) -> None:
    running = make_trainer("run", max_steps=3)  # built: it holds the run folder
    for overwrite in (True, False):  # not "already holds a run; continue it with --resume": that one is in use too
        with pytest.raises(ConfigError, match=rf"in use by gsrecon pid {os.getpid()} on "):
            make_trainer("run", max_steps=3, overwrite=overwrite)
    assert (running.exp_dir / "config.yaml").is_file(), "the refused run deleted nothing"
    running.train()  # releases the folder when it ends
    make_trainer("run", max_steps=3, overwrite=True).train()


def test_a_stale_lock_does_not_block(make_trainer) -> None:
    first = make_trainer("run", max_steps=3)
    first.train()
    lock = first.exp_dir / ".gsrecon-lock"
    lock.write_text("gsrecon pid 999999 on elsewhere\n")  # no process holds it
    second = make_trainer("run", max_steps=5, resume=True)  # built: it holds the folder now
    assert lock.read_text() == f"gsrecon pid {os.getpid()} on {socket.gethostname()}\n"
    second.train()
    assert load_checkpoint_file(first.exp_dir / "checkpoints" / "last.pt")["step"] == 5
    assert json.loads((first.exp_dir / "metrics.json").read_text())["step"] == 5


def test_leftover_temporary_files_are_removed_on_the_next_start(make_trainer) -> None:
    first = make_trainer("run", max_steps=3)
    first.train()
    exp = first.exp_dir
    leftovers = [exp / ".metrics.json.tmp4242", exp / "checkpoints" / ".step_000006.pt.tmp17"]
    for leftover in leftovers:
        leftover.write_bytes(b"half a file")
    (exp / ".my.tmpnotes").write_text("a user's file that only looks similar")
    make_trainer("run", max_steps=4, resume=True)
    assert not any(p.exists() for p in leftovers)
    assert (exp / ".my.tmpnotes").exists()


def test_sigterm_stops_at_a_step_boundary_with_a_checkpoint(make_config, tmp_path: Path, capsys) -> None:
    config = write_yaml(tmp_path / "c.yaml", make_config(max_steps=6))
    code = main(["train", "--config", str(config), "hooks.SignalAtStepHook.step=2"])
    assert code == EXIT_TERMINATED == 143
    checkpoints = tmp_path / "run" / "checkpoints"
    assert load_checkpoint_file(checkpoints / "last.pt")["step"] == 2
    assert "--resume" in capsys.readouterr().err


def test_interrupt_without_a_checkpoint_hook_does_not_promise_a_resume(make_config, tmp_path: Path, capsys) -> None:
    config = write_yaml(tmp_path / "c.yaml", make_config(max_steps=6))
    overrides = ["hooks.CheckPointHook=null", "hooks.SignalAtStepHook={step: 2, signum: 2}"]
    assert main(["train", "--config", str(config), *overrides]) == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert "cannot be resumed" in err and "--resume" not in err


def test_a_corrupt_last_checkpoint_falls_back_to_the_newest_intact_one(make_trainer) -> None:
    first = make_trainer("run", max_steps=6)
    first.train()
    last = first.exp_dir / "checkpoints" / "last.pt"
    last.unlink()  # a hard link to step_000006.pt: replace it rather than damage both
    last.write_bytes(b"not a checkpoint")
    resumed = make_trainer("run", max_steps=7, resume=True)
    resumed.train()
    log = (first.exp_dir / "train.log").read_text()
    assert "resumed from" in log and "step_000006.pt at step 6" in log
    assert resumed.step == 7


@pytest.mark.slow  # 5 s on a quiet 2-core machine: CI's slow run (the default run stays under 5 min)
def test_a_full_disk_while_saving_is_one_line_and_keeps_the_previous_checkpoint(make_trainer) -> None:
    first = make_trainer("run", max_steps=3)
    first.train()
    exp = first.exp_dir
    size = (exp / "checkpoints" / "step_000003.pt").stat().st_size
    limit = size // 2  # checkpoints no longer fit; logs and config still do
    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
        "from gsrecon.cli import main\n"
        f"sys.exit(main(['train', '--config', {str(exp / 'config.yaml')!r}, '--resume', 'max_steps=6']))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr and "enforce fail" not in result.stderr
    assert "cannot write" in errors[0] and "step_000006.pt" in errors[0] and "MiB" in errors[0]
    intact = load_checkpoint_file(exp / "checkpoints" / "step_000003.pt")
    assert intact["step"] == 3 and load_checkpoint_file(exp / "checkpoints" / "last.pt")["step"] == 3


def test_best_checkpoint_is_never_replaced_by_a_worse_model_after_a_resume(make_trainer) -> None:
    hooks = {
        "LogHook": {"progress": False},
        "CheckPointHook": {"interval": 3, "save_best": "psnr"},
    }
    first = make_trainer("run", max_steps=3, hooks=hooks)
    first.train()
    best_before = load_checkpoint_file(first.exp_dir / "checkpoints" / "best.pt")["best"]
    # A resume with a learning rate that wrecks the colours: the next validation is worse.
    resumed = make_trainer("run", max_steps=6, hooks=hooks, resume=True, optimizer={"sh0": 5.0})
    resumed.train()
    assert resumed.val_metrics["psnr"] < best_before["value"]
    best_after = load_checkpoint_file(first.exp_dir / "checkpoints" / "best.pt")["best"]
    assert best_after == best_before
    assert "new best psnr" not in (first.exp_dir / "train.log").read_text().split("resumed from")[1]


def test_resume_applies_changed_learning_rates_and_schedules(make_trainer) -> None:
    reference = make_trainer("reference", max_steps=6, optimizer={"opacities": 0.5})
    reference.train()
    short = make_trainer("resumed", max_steps=3)
    short.train()
    resumed = make_trainer(
        "resumed",
        max_steps=6,
        resume=True,
        optimizer={"opacities": 0.5},
        model={"sh_degree": 1, "sh_degree_interval": 3, "init_opacity": 0.3},
    )
    resumed.train()
    for group in ("means", "opacities"):
        expected = read_scalars(reference.exp_dir, f"train/lr/{group}")
        got = read_scalars(resumed.exp_dir, f"train/lr/{group}")
        assert [got[s] for s in (4, 5, 6)] == [expected[s] for s in (4, 5, 6)], group
    log = (resumed.exp_dir / "train.log").read_text()
    assert "optimizer.opacities: 0.05 -> 0.5" in log and "max_steps: 3 -> 6" in log
    assert "not applied on a resume (they only shape a new model): model.init_opacity: 0.1 -> 0.3" in log


def test_resume_refuses_a_checkpoint_with_non_finite_parameters(make_trainer, tmp_path: Path) -> None:
    first = make_trainer("run", max_steps=3)
    first.train()
    checkpoint = torch.load(first.exp_dir / "checkpoints" / "last.pt", weights_only=True)
    checkpoint["params"]["scales"][0, 0] = float("nan")
    torch.save(checkpoint, tmp_path / "broken.pt")
    with pytest.raises(ConfigError, match=r"cannot resume .*broken\.pt: Gaussian parameters scales are not finite"):
        make_trainer("other", max_steps=6, resume=str(tmp_path / "broken.pt"))


def test_an_unknown_save_best_metric_is_refused_when_the_config_is_read(make_config, tmp_path: Path, capsys) -> None:
    config = write_yaml(tmp_path / "c.yaml", make_config())
    assert main(["train", "--config", str(config), "hooks.CheckPointHook.save_best=psnrr"]) == 2
    err = _one_line(capsys)
    assert "hooks.CheckPointHook" in err and "save_best" in err and "'psnrr'" in err
    assert not (tmp_path / "run").exists(), "refused before anything was written"
