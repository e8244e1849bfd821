"""Extending gsrecon with a loss term and a per-view module of one's own: the examples in configs/examples/
train end to end from the CLI, and the loss is the sum of its named, logged terms."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import read_scalars

from gsrecon.cli import main
from gsrecon.engine.checkpoints import load_checkpoint_file
from gsrecon.engine.resolve import load_run_config, resolve_entry_map
from gsrecon.losses.base import DEFAULT_LOSS
from gsrecon.registry import LOSS_REGISTRY

REPO = Path(__file__).resolve().parents[1]


def _tiny(exp_dir: Path, synthetic_cache: Path) -> list[str]:
    return [
        f"exp_dir={exp_dir}",
        "device=cpu",
        "num_threads=1",
        "max_steps=6",
        "val_interval=6",
        "model.sh_degree=1",
        "renderer.name=torch",
        "metrics.lpips_net=none",
        "writers=[{name: JsonlWriter}]",
        "strategy.refine_start=2",
        "strategy.refine_every=2",
        "data.synthetic={width: 32, height: 24, num_views: 9, num_points: 300, supersample: 2}",
        f"data.synthetic.cache_dir={synthetic_cache}",
        "hooks.LogHook={progress: false, log_interval: 1}",
    ]


@pytest.fixture
def examples(tmp_path: Path) -> Path:
    """A copy of configs/ (a plugin file is imported once per path and process)."""
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    return tmp_path / "configs" / "examples"


def test_the_loss_is_the_sum_of_its_logged_terms_and_a_plugin_term_joins_it(
    examples: Path, tmp_path: Path, synthetic_cache: Path, capsys
) -> None:
    exp_dir = tmp_path / "run"
    assert main(["train", "--config", str(examples / "custom_loss.yaml"), *_tiny(exp_dir, synthetic_cache)]) == 0, (
        capsys.readouterr().err
    )
    total = read_scalars(exp_dir, "train/loss")
    terms = {key: read_scalars(exp_dir, f"train/loss/{key}") for key in ("l1", "ssim", "mse")}
    assert sorted(total) == list(range(1, 7)) and all(sorted(t) == sorted(total) for t in terms.values())
    for step, value in total.items():
        assert value == pytest.approx(sum(t[step] for t in terms.values()), rel=1e-5)
    assert all(v > 0 for t in terms.values() for v in t.values())
    written = (exp_dir / "config.yaml").read_text()
    assert "mse:\n    weight: 0.5" in written and "ssim:\n    weight: 0.1" in written


def test_a_term_removed_by_null_is_not_computed_and_stays_removed_in_the_written_config(
    tmp_path: Path, synthetic_cache: Path, capsys
) -> None:
    exp_dir = tmp_path / "run"
    config = REPO / "configs" / "synthetic.yaml"
    assert main(["train", "--config", str(config), *_tiny(exp_dir, synthetic_cache), "loss.ssim=null"]) == 0, (
        capsys.readouterr().err
    )
    assert read_scalars(exp_dir, "train/loss/ssim") == {}
    assert read_scalars(exp_dir, "train/loss") == read_scalars(exp_dir, "train/loss/l1")
    cfg, source = load_run_config(str(exp_dir / "config.yaml"))
    assert resolve_entry_map(LOSS_REGISTRY, cfg.loss, DEFAULT_LOSS, source, "loss") == {
        "l1": {"weight": 0.8},
        "ssim": None,
    }


def test_an_unknown_term_or_option_is_one_line_naming_the_key(tmp_path: Path, synthetic_cache: Path, capsys) -> None:
    config = str(REPO / "configs" / "synthetic.yaml")
    for override, message in (
        ("loss.l2={}", "key 'loss.l2.name': unknown loss term 'l2'"),
        ("loss.l1.scale=2", "key 'loss.l1.scale'"),
        ("loss.ssim.weight=-0.5", "key 'loss.ssim': weight must be a finite number >= 0, got -0.5"),
    ):
        assert main(["train", "--config", config, *_tiny(tmp_path / "run", synthetic_cache), override]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (override, err)
    assert not (tmp_path / "run").exists()


def test_a_plugin_per_view_module_trains_checkpoints_and_resumes_exactly(
    examples: Path, tmp_path: Path, synthetic_cache: Path, capsys
) -> None:
    config = str(examples / "custom_view.yaml")
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    tiny = _tiny(full, synthetic_cache)
    assert main(["train", "--config", config, *tiny, "hooks.CheckPointHook.interval=3"]) == 0, capsys.readouterr().err
    reference = load_checkpoint_file(full / "checkpoints" / "last.pt")
    gains = reference["views"]["exposure"]["module"]["log_gains"]
    assert gains.shape == (7,) and gains.abs().amax() > 0  # 7 training views, each moved off gain 1
    assert read_scalars(full, "train/loss/exposure")[6] > 0  # its regularisation joined the loss

    step_3 = full / "checkpoints" / "step_000003.pt"
    assert main(["train", "--config", config, *_tiny(resumed, synthetic_cache), f"resume={step_3}"]) == 0
    again = load_checkpoint_file(resumed / "checkpoints" / "last.pt")
    assert torch.equal(again["views"]["exposure"]["module"]["log_gains"], gains)
    for name, value in reference["params"].items():
        assert torch.equal(again["params"][name], value), name


def _write_csv_capture(root: Path, synthetic_cache: Path) -> list[str]:
    """The tiny synthetic scene in the CSV example reader's layout; returns the frame names."""
    from PIL import Image

    from gsrecon.data.readers.synthetic import SyntheticConfig, load_synthetic

    config = SyntheticConfig(
        width=32, height=24, num_views=9, num_points=300, supersample=2, cache_dir=str(synthetic_cache)
    )
    frames = load_synthetic(config, eval_split="none").train
    (root / "images").mkdir(parents=True)
    rows = []
    for frame in frames:
        Image.fromarray(frame.image.numpy()).save(root / "images" / f"{frame.name}.png")
        K = frame.K
        rows.append(
            ",".join(map(str, [frame.name, *K[[0, 1, 0, 1], [0, 1, 2, 2]].tolist(), *frame.viewmat.flatten().tolist()]))
        )
    (root / "cameras.csv").write_text("\n".join(rows) + "\n")
    return [frame.name for frame in frames]


def test_a_plugin_reader_reads_its_own_options_and_trains(
    examples: Path, tmp_path: Path, synthetic_cache: Path, capsys
) -> None:
    names = _write_csv_capture(tmp_path / "capture", synthetic_cache)
    config = str(examples / "custom_reader.yaml")
    run = _tiny(tmp_path / "run", synthetic_cache)  # its data.synthetic options: another reader's, left out
    data = [f"data.path={tmp_path / 'capture'}", "data.csv_poses.poses=cameras.csv"]
    assert main(["train", "--config", config, *run, *data]) == 0, capsys.readouterr().err
    log = (tmp_path / "run" / "train.log").read_text()
    assert f"from random points on {len(names) - 2} views at 32x24" in log  # every 8th of 9 is a test view
    written = (tmp_path / "run" / "config.yaml").read_text()
    assert "csv_poses:\n    poses: cameras.csv" in written

    assert main(["train", "--config", config, *run, *data[:1], "data.csv_poses.file=x.csv"]) == 2
    assert "key 'data.csv_poses.file'" in capsys.readouterr().err  # the reader's options are checked by name
    assert main(["train", "--config", config, *run, *data[:1], "--overwrite"]) == 2  # poses.csv is not there
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "poses.csv: no such file" in err[0]


def _without_strategy(overrides: list[str]) -> list[str]:
    return [o for o in overrides if not o.startswith("strategy.")]


def test_a_plugin_strategy_changes_the_gaussians_through_the_model_ops_and_resumes_exactly(
    examples: Path, tmp_path: Path, synthetic_cache: Path, capsys
) -> None:
    config = str(examples / "custom_strategy.yaml")
    strategy = ["strategy={name: prune_transparent, every: 2, min_opacity: 0.3}"]  # prunes the 0.1-opacity start
    full = [*_without_strategy(_tiny(tmp_path / "full", synthetic_cache)), *strategy, "hooks.CheckPointHook.interval=3"]
    assert main(["train", "--config", config, *full]) == 0, capsys.readouterr().err
    reference = load_checkpoint_file(tmp_path / "full" / "checkpoints" / "last.pt")
    n = len(reference["params"]["means"])
    assert reference["strategy"]["pruned"] == 300 - n > 0
    assert all(len(value) == n for value in reference["params"].values())
    assert all(
        len(moment) == n
        for state in reference["optimizers"].values()
        for moment in state["state"][0].values()
        if moment.dim()
    )

    resumed = [*_without_strategy(_tiny(tmp_path / "resumed", synthetic_cache)), *strategy]
    step_3 = tmp_path / "full" / "checkpoints" / "step_000003.pt"
    assert main(["train", "--config", config, *resumed, f"resume={step_3}"]) == 0
    again = load_checkpoint_file(tmp_path / "resumed" / "checkpoints" / "last.pt")
    assert again["strategy"] == reference["strategy"]
    for name, value in reference["params"].items():
        assert torch.equal(again["params"][name], value), name


def test_a_plugin_renderer_is_chosen_by_name_and_trains(
    examples: Path, tmp_path: Path, synthetic_cache: Path, capsys
) -> None:
    from gsrecon.engine.resolve import load_run_config
    from gsrecon.engine.trainer import DefaultTrainer

    tiny = [o for o in _tiny(tmp_path / "run", synthetic_cache) if not o.startswith("renderer.")]
    cfg, source = load_run_config(str(examples / "custom_renderer.yaml"), tiny)
    trainer = DefaultTrainer(cfg, source)
    trainer.train()
    assert type(trainer.renderer).__name__ == "CountingTorchRenderer"
    assert trainer.renderer.drawn_total > 0
    assert trainer.resolved_config["renderer"]["name"] == "torch_counting"
    assert trainer.val_metrics["psnr"] is not None


def test_the_extending_table_names_examples_that_exist_for_every_registry() -> None:
    import re

    from gsrecon import registry

    section = (REPO / "docs" / "extending" / "index.md").read_text().split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| kind")]
    named = {re.search(r"`@(\w+_REGISTRY)", row).group(1) for row in rows if "@" in row}
    registries = {name for name in dir(registry) if name.endswith("_REGISTRY")}
    assert named == registries - {"WRITER_REGISTRY", "MODEL_REGISTRY"}  # those two: the paragraph after the table
    for row in rows:
        for example in re.findall(r"`(\w+\.(?:py|yaml))`", row):
            assert (REPO / "configs" / "examples" / example).is_file(), example
