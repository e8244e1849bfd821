"""A merge takes only blocks that belong to its run and keeps what a finished merge wrote: blocks of another split,
config or cell, non-finite blocks and a corrupt plan are refused before anything is written; SIGTERM leaves state
the next ``gsrecon merge`` goes on from."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import tiny_config, write_yaml

from gsrecon.cli import main
from gsrecon.engine.checkpoints import load_checkpoint_file
from gsrecon.registry import RENDERER_REGISTRY

OUTPUTS = ("checkpoints/last.pt", "point_cloud.ply", "metrics.json")
TERM_IN_FINE_TUNE = (
    "import os, signal\nfrom dataclasses import dataclass\n"
    "from gsrecon.hooks import Hook\nfrom gsrecon.registry import HOOK_REGISTRY\n\n"
    "@HOOK_REGISTRY.register()\nclass TermInFineTuneHook(Hook):\n"
    "    @dataclass\n    class Config:\n        step: int = 2\n\n"
    "    def __init__(self, cfg):\n        self.cfg = cfg\n\n"
    "    def after_train_iter(self, trainer):\n"
    "        if trainer.exp_dir.name == 'finetune' and trainer.step == self.cfg.step:\n"
    "            os.kill(os.getpid(), signal.SIGTERM)\n"
)
TERM_ON_BUILD = (
    "import os, signal\nfrom gsrecon.hooks import Hook\nfrom gsrecon.registry import HOOK_REGISTRY\n\n"
    "@HOOK_REGISTRY.register()\nclass TermOnBuildHook(Hook):\n"
    "    def __init__(self, cfg=None):\n        os.kill(os.getpid(), signal.SIGTERM)\n"
)
TERM_WHILE_SCORING = (
    "import os, signal\nfrom gsrecon.registry import RENDERER_REGISTRY\n"
    "from gsrecon.render.torch_renderer import TorchRenderer\n\n"
    "@RENDERER_REGISTRY.register('term_torch')\nclass TermRenderer(TorchRenderer):\n"
    "    def render(self, *args, **kwargs):\n"
    "        os.kill(os.getpid(), signal.SIGTERM)\n"
    "        return super().render(*args, **kwargs)\n"
)


def _job_array(root: Path, cache: Path, name: str, *overrides: str) -> Path:
    """A block run of two blocks, each trained alone (``partition.only``), not merged yet."""
    cfg = tiny_config(root / name, cache, max_steps=6, val_interval=6, partition={"blocks": 2})
    cfg["data"]["synthetic"].update({"num_views": 16, "num_points": 600})
    config = write_yaml(root / f"{name}.yaml", cfg)
    for index in range(2):
        assert main(["train", "--config", str(config), f"partition.only={index}", *overrides]) == 0
    return root / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, synthetic_cache: Path) -> dict[str, Path]:
    """Finished blocks of one run, of the same run with another model, and of another split of the capture."""
    root = tmp_path_factory.mktemp("runs")
    return {
        "run": _job_array(root, synthetic_cache, "run"),
        "sh0": _job_array(root, synthetic_cache, "sh0", "model.sh_degree=0"),
        "split": _job_array(root, synthetic_cache, "split", "partition.overlap=0.5"),
    }


def _copy(runs: dict[str, Path], tmp_path: Path) -> Path:
    exp_dir = tmp_path / "run"
    shutil.copytree(runs["run"], exp_dir)
    return exp_dir


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def _poison(exp_dir: Path, runs: dict[str, Path]) -> None:
    path = exp_dir / "blocks" / "1" / "block.pt"
    result = torch.load(path, weights_only=True)
    result["params"]["means"][3] = float("nan")
    torch.save(result, path)


def _swap(exp_dir: Path, runs: dict[str, Path]) -> None:
    first, second = (exp_dir / "blocks" / str(i) / "block.pt" for i in range(2))
    first.rename(exp_dir / "held.pt")
    second.rename(first)
    (exp_dir / "held.pt").rename(second)


def _from(run: str) -> Callable[[Path, dict[str, Path]], None]:
    def take(exp_dir: Path, runs: dict[str, Path]) -> None:
        shutil.copy(runs[run] / "blocks" / "1" / "block.pt", exp_dir / "blocks" / "1" / "block.pt")

    return take


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (_poison, "blocks/1/block.pt: block 1's Gaussian parameters means are not finite"),
        (_swap, "blocks/0/block.pt holds block 1's Gaussians, not block 0's"),
        (_from("split"), "blocks/1/block.pt: block 1 was trained on another split of the capture"),
        (_from("sh0"), "blocks/1/block.pt: block 1 was trained with model.sh_degree=0 but this run has 1"),
    ],
    ids=["non-finite", "swapped", "another-split", "another-config"],
)
def test_a_merge_refuses_a_block_that_is_not_this_runs_before_writing(runs, tmp_path, capsys, tamper, message) -> None:
    exp_dir = _copy(runs, tmp_path)
    tamper(exp_dir, runs)
    capsys.readouterr()
    assert main(["merge", "--exp-dir", str(exp_dir)]) == 2
    assert message in _one_line(capsys)
    assert not any((exp_dir / name).exists() for name in OUTPUTS)
    assert not (exp_dir / "blocks" / "merged.ply").exists()


def test_a_corrupt_plan_is_one_line_naming_it(runs, tmp_path, capsys) -> None:
    exp_dir = _copy(runs, tmp_path)
    (exp_dir / "partition.json").write_text('{"grid": [1, 2], "blo')
    capsys.readouterr()
    assert main(["merge", "--exp-dir", str(exp_dir)]) == 2
    err = _one_line(capsys)
    assert f"{exp_dir / 'partition.json'} is not valid JSON" in err
    assert main(["train", "--config", str(exp_dir / "config.yaml"), f"exp_dir={exp_dir}", "partition.only=0"]) == 2
    assert "partition.json is not valid JSON" in _one_line(capsys)


def test_sigterm_in_the_fine_tune_keeps_a_checkpoint_the_next_merge_resumes(runs, tmp_path, capsys) -> None:
    plugin = tmp_path / "term_in_fine_tune.py"
    plugin.write_text(TERM_IN_FINE_TUNE)
    reference = tmp_path / "reference"
    shutil.copytree(runs["run"], reference)
    steps = ["partition.merge_steps=4", "hooks.CheckPointHook.interval=1"]
    assert main(["merge", "--exp-dir", str(reference), *steps]) == 0
    exp_dir = _copy(runs, tmp_path)
    term = [f"imports=[{plugin}]", "hooks.TermInFineTuneHook={step: 2}"]
    capsys.readouterr()
    assert main(["merge", "--exp-dir", str(exp_dir), *steps, *term]) == 143
    assert f"continue with: gsrecon merge --exp-dir {exp_dir}" in capsys.readouterr().err
    assert not any((exp_dir / name).exists() for name in OUTPUTS)
    assert load_checkpoint_file(exp_dir / "blocks" / "finetune" / "checkpoints" / "last.pt")["step"] == 2
    assert main(["merge", "--exp-dir", str(exp_dir), *steps]) == 0
    assert "resumed from" in (exp_dir / "blocks" / "finetune" / "train.log").read_text()
    merged, expected = (load_checkpoint_file(d / "checkpoints" / "last.pt") for d in (exp_dir, reference))
    assert merged["step"] == expected["step"] == 6 + 4
    for name, value in merged["params"].items():  # as if the fine-tune had never stopped
        torch.testing.assert_close(value, expected["params"][name], rtol=0, atol=0)


def test_sigterm_while_the_fine_tune_is_being_built_stops_it_before_its_first_step(runs, tmp_path, capsys) -> None:
    plugin = tmp_path / "term_on_build.py"
    plugin.write_text(TERM_ON_BUILD)
    exp_dir = _copy(runs, tmp_path)
    term = [f"imports=[{plugin}]", "hooks.TermOnBuildHook={}"]  # built by the fine-tune's trainer only
    assert main(["merge", "--exp-dir", str(exp_dir), "partition.merge_steps=4", *term]) == 143
    assert "the merge's fine-tune stopped: interrupted at step 0" in capsys.readouterr().err
    assert not any((exp_dir / name).exists() for name in OUTPUTS)


def test_sigterm_while_scoring_keeps_the_previous_merge_whole(runs, tmp_path, capsys) -> None:
    plugin = tmp_path / "term_while_scoring.py"
    plugin.write_text(TERM_WHILE_SCORING)
    exp_dir = _copy(runs, tmp_path)
    assert main(["merge", "--exp-dir", str(exp_dir)]) == 0
    before = {name: (exp_dir / name).read_bytes() for name in OUTPUTS}
    capsys.readouterr()
    with RENDERER_REGISTRY.scoped():
        assert main(["merge", "--exp-dir", str(exp_dir), f"imports=[{plugin}]", "renderer.name=term_torch"]) == 143
    assert f"continue with: gsrecon merge --exp-dir {exp_dir}" in capsys.readouterr().err
    assert {name: (exp_dir / name).read_bytes() for name in OUTPUTS} == before
    assert not [p.name for p in exp_dir.rglob(".*.tmp*")]


def test_resuming_a_block_run_without_partition_blocks_is_refused_naming_the_key(runs, tmp_path, capsys) -> None:
    exp_dir = _copy(runs, tmp_path)
    assert main(["merge", "--exp-dir", str(exp_dir)]) == 0
    config = (exp_dir / "config.yaml").read_text()
    plain = write_yaml(tmp_path / "plain.yaml", tiny_config(exp_dir, tmp_path / "cache"))
    capsys.readouterr()
    assert main(["train", "--config", str(plain), "--resume"]) == 2
    err = _one_line(capsys)
    assert f"exp_dir '{exp_dir}' holds a block-training run (partition.json) but this config has no partition" in err
    assert (exp_dir / "config.yaml").read_text() == config


def test_a_block_run_moved_to_another_folder_goes_on_there(runs, tmp_path) -> None:
    moved = tmp_path / "moved"
    shutil.copytree(runs["run"], moved)
    retrain = ["train", "--config", str(moved / "config.yaml"), f"exp_dir={moved}", "partition.only=1", "--overwrite"]
    assert main(retrain) == 0
    assert main(["merge", "--exp-dir", str(moved)]) == 0
