"""scripts/bench_vs_gsplat.py on the CPU: run order, both trainers' command lines, reading gsplat's stats
files and a real gsrecon run, the summary table and CSVs."""

from __future__ import annotations

import ast
import csv
import dataclasses
import json
import sys
import types
from pathlib import Path

import pytest
import yaml
from conftest import script_module, tiny_config
from gsplat.strategy import DefaultStrategy, MCMCStrategy

REPO = Path(__file__).resolve().parents[1]
bench = script_module("bench_vs_gsplat")

# The fields of simple_trainer.py's Config at gsplat v1.5.3 that bench_vs_gsplat.py sets (read from the file
# at that tag; checked against the file itself where fetch_gsplat_examples.sh has extracted it).
SIMPLE_TRAINER_FIELDS = {
    "data_dir", "data_factor", "test_every", "result_dir", "max_steps", "eval_steps", "save_steps",
    "disable_viewer", "disable_video", "sh_degree_interval", "strategy",
}  # fmt: skip
BOOL_FLAGS = {"--disable_viewer", "--disable_video"}
EXAMPLES = REPO / ".gsplat_examples"


def setup_for(tmp_path: Path, **changes) -> bench.Setup:
    base = bench.Setup(
        data="/data/scene", out=tmp_path / "out", steps=7000, factor=2, cap_max=300_000,
        gsplat_examples=tmp_path / "examples", python="python3",
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


def flags(command: list[str]) -> dict[str, str | None]:
    """``--flag value`` pairs of a simple_trainer.py command line, after its subcommand (boolean flags map
    to None)."""
    out, words = {}, iter(command[5:])
    for word in words:
        if word.startswith("--"):
            out[word] = None if word in BOOL_FLAGS else next(words)
    return out


def write_gsplat_stats(result_dir: Path, last_step: int, psnr: float, mem: float, seconds: float, gaussians: int):
    """The two stats files simple_trainer.py (v1.5.3) writes at its last step, in its format."""
    stats = result_dir / "stats"
    stats.mkdir(parents=True)
    val = {"psnr": psnr, "ssim": 0.8, "lpips": 0.2, "ellipse_time": 0.004, "num_GS": gaussians}
    (stats / f"val_step{last_step:04d}.json").write_text(json.dumps(val))
    train = {"mem": mem, "ellipse_time": seconds, "num_GS": gaussians}
    (stats / f"train_step{last_step:04d}_rank0.json").write_text(json.dumps(train))


def test_runs_alternate_trainers_within_each_strategy_and_seed():
    runs = bench.plan(["default", "mcmc"], [0, 1])
    assert [(r.strategy, r.seed, r.trainer) for r in runs] == [
        ("default", 0, "gsplat"), ("default", 0, "gsrecon"), ("default", 1, "gsplat"), ("default", 1, "gsrecon"),
        ("mcmc", 0, "gsplat"), ("mcmc", 0, "gsrecon"), ("mcmc", 1, "gsplat"), ("mcmc", 1, "gsrecon"),
    ]  # fmt: skip
    assert len({run.name for run in runs}) == 8


def test_gsplat_command_uses_flags_simple_trainer_accepts(tmp_path):
    setup = setup_for(tmp_path)
    default = bench.gsplat_command(setup, bench.Run("gsplat", "default", 0))
    mcmc = bench.gsplat_command(setup, bench.Run("gsplat", "mcmc", 0))
    assert default[2:5] == [bench.GSPLAT_CHILD_FLAG, str(tmp_path / "examples" / "simple_trainer.py"), "default"]
    assert mcmc[4] == "mcmc"
    fields = {
        "default": {f.name for f in dataclasses.fields(DefaultStrategy)},
        "mcmc": {f.name for f in dataclasses.fields(MCMCStrategy)},
    }
    for strategy, command in (("default", default), ("mcmc", mcmc)):
        for flag in flags(command):
            name = flag[2:]
            if name.startswith("strategy."):
                assert name.removeprefix("strategy.").replace("-", "_") in fields[strategy], flag
            else:
                assert name in SIMPLE_TRAINER_FIELDS, flag
    d, m = flags(default), flags(mcmc)
    assert d["--data_factor"] == "2" and d["--test_every"] == "8" and d["--data_dir"] == "/data/scene"
    assert d["--max_steps"] == d["--eval_steps"] == d["--save_steps"] == "7000"
    assert d["--result_dir"] == str(tmp_path / "out" / "default_gsplat_seed0")
    # the 3DGS schedule scaled from 30k to 7k steps
    assert d["--sh_degree_interval"] == "233" and d["--strategy.refine-start-iter"] == "117"
    assert d["--strategy.refine-stop-iter"] == "3500" and d["--strategy.reset-every"] == "700"
    assert m["--strategy.cap-max"] == "300000" and m["--strategy.refine-stop-iter"] == "5833"
    assert "--strategy.cap-max" not in d and "--strategy.reset-every" not in m


@pytest.mark.skipif(not (EXAMPLES / "simple_trainer.py").is_file(), reason="fetch_gsplat_examples.sh not run")
def test_simple_trainer_config_has_the_fields_the_commands_set():
    tree = ast.parse((EXAMPLES / "simple_trainer.py").read_text())
    config = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Config")
    names = {node.target.id for node in config.body if isinstance(node, ast.AnnAssign)}
    assert names >= SIMPLE_TRAINER_FIELDS


def test_gsrecon_overrides_match_gsplat_settings(tmp_path):
    setup = setup_for(tmp_path, gsrecon_extra=("data.cache=cpu",))
    command = bench.gsrecon_command(setup, bench.Run("gsrecon", "mcmc", 3))
    assert command[2:4] == [bench.CHILD_FLAG, str(tmp_path / "out" / "mcmc_gsrecon_seed3")]
    assert command[4:7] == ["train", "--config", "configs/mipnerf360.yaml"]
    overrides = dict(item.split("=", 1) for item in command[7:])
    assert overrides["seed"] == "3" and overrides["max_steps"] == overrides["val_interval"] == "7000"
    assert overrides["data.factor"] == "2" and overrides["data.eval_split"] == "every_8"
    assert overrides["model.sh_degree_interval"] == "233" and overrides["data.cache"] == "cpu"
    assert overrides["model.init_opacity"] == "0.5" and overrides["model.init_scale"] == "0.1"  # gsplat's mcmc start
    strategy = yaml.safe_load(overrides["strategy"])
    assert strategy == {
        "name": "mcmc",
        "cap_max": 300000,
        "refine_start": 117,
        "refine_stop": 5833,
        "refine_every": 100,
    }
    default = dict(item.split("=", 1) for item in bench.gsrecon_overrides(setup, bench.Run("gsrecon", "default", 0)))
    assert "model.init_opacity" not in default
    assert yaml.safe_load(default["strategy"]) == {
        "name": "default", "refine_start": 117, "refine_stop": 3500, "reset_every": 700, "refine_every": 100,
        "grow_grad2d": 0.0002,
    }  # fmt: skip


def test_read_gsplat_stats(tmp_path):
    write_gsplat_stats(tmp_path, 6999, psnr=27.5, mem=3.25, seconds=350.0, gaussians=1_200_000)
    row = bench.read_gsplat(tmp_path, 7000)
    assert row == {
        "psnr": 27.5, "ssim": 0.8, "lpips": 0.2, "gaussians": 1_200_000, "peak_gpu_gib": 3.25, "train_s": 350.0,
        "steps_per_s": 20.0,
    }  # fmt: skip
    with pytest.raises(FileNotFoundError, match="val_step0099.json is missing"):
        bench.read_gsplat(tmp_path, 100)


@pytest.mark.slow  # 16 s on the 2 loaded cores: CI's slow run (the default run stays under 5 min)
def test_real_gsrecon_run_and_summary(tmp_path, synthetic_cache):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_config(tmp_path / "unused", synthetic_cache)))
    setup = setup_for(tmp_path, data="", steps=12, python=sys.executable, gsrecon_config=str(config))
    gsplat_runs = [bench.Run("gsplat", "default", seed) for seed in (0, 1)]
    rows = []
    for run, psnr, seconds in zip(gsplat_runs, (20.0, 22.0), (2.0, 6.0)):
        write_gsplat_stats(setup.out / run.name, 11, psnr=psnr, mem=1.0, seconds=seconds, gaussians=1000)
        rows.append({**bench.read_run(setup, run), "wall_s": seconds + 1})
    rows.append(bench.execute(setup, bench.Run("gsrecon", "default", 1)))  # one real run: a subprocess each
    gsrecon_row = rows[2]
    metrics = json.loads((setup.out / "default_gsrecon_seed1" / "metrics.json").read_text())
    assert gsrecon_row["psnr"] == metrics["mean"]["psnr"] and gsrecon_row["gaussians"] == metrics["num_gaussians"]
    assert gsrecon_row["lpips"] is None and gsrecon_row["peak_gpu_gib"] is None  # lpips_net none; no CUDA
    assert gsrecon_row["train_s"] > 0 and gsrecon_row["steps_per_s"] == pytest.approx(12 / gsrecon_row["train_s"])
    assert gsrecon_row["wall_s"] > gsrecon_row["train_s"]
    resolved = yaml.safe_load((setup.out / "default_gsrecon_seed1" / "config.yaml").read_text())
    assert resolved["seed"] == 1 and resolved["strategy"]["refine_stop"] == 6  # 15000 scaled to 12 steps
    assert (setup.out / "default_gsrecon_seed1.log").read_text().strip()  # its output, beside its folder

    summary = bench.summarize(rows)
    assert [(s["trainer"], s["runs"]) for s in summary] == [("gsplat", 2), ("gsrecon", 1)]
    assert summary[0]["psnr"] == 21.0 and summary[0]["train_s"] == 4.0 and summary[0]["steps_per_s"] == 4.0
    assert summary[1]["lpips"] is None and summary[1]["psnr"] == rows[2]["psnr"]

    bench.write_csv(tmp_path / "summary.csv", summary, tuple(key for key, _ in bench.SUMMARY_HEADINGS))
    with (tmp_path / "summary.csv").open() as file:
        table = list(csv.DictReader(file))
    assert table[0]["trainer"] == "gsplat" and float(table[0]["psnr"]) == 21.0 and table[1]["lpips"] == ""
    text = bench.markdown(summary, {"gsplat": "1.5.3"}, ["cmd one"])
    lines = text.splitlines()
    assert lines[0].startswith("| strategy | trainer | runs | PSNR |") and lines[2].startswith(
        "| default | gsplat | 2 | 21.0"
    )
    assert "| - |" in lines[3] and "- gsplat: 1.5.3" in lines and "cmd one" in lines


def test_cli_dry_run_prints_commands_in_run_order(tmp_path, capsys):
    argv = ["--data", "/d", "--gsplat-examples", str(tmp_path), "--out", str(tmp_path / "o"), "--seeds", "5"]
    assert bench.main([*argv, "--strategies", "mcmc", "--cap-max", "1000", "--dry-run", "data.cache=cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "simple_trainer.py mcmc" in lines[0] and "--strategy.cap-max 1000" in lines[0]
    assert (
        "train --config configs/mipnerf360.yaml" in lines[1] and "seed=5" in lines[1] and "data.cache=cpu" in lines[1]
    )
    assert not (tmp_path / "o").exists()
    with pytest.raises(SystemExit) as error:
        bench.main([*argv, "--strategies", "mcmc,absgrad", "--dry-run"])
    assert error.value.code == 2 and "unknown absgrad" in capsys.readouterr().err


def test_offline_alexnet_gives_torchmetrics_lpips_the_lpips_package_value(tmp_path, monkeypatch):
    import torch
    from torchvision.models import _api

    from gsrecon.lpips_weights import lpips_backbone_path

    if not lpips_backbone_path("alex").is_file():
        pytest.skip("no LPIPS backbone in the gsrecon cache (`gsrecon weights` fetches it)")
    lpips = pytest.importorskip("lpips")
    from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # no AlexNet cached: the patch must supply it
    monkeypatch.setattr(_api, "load_state_dict_from_url", _api.load_state_dict_from_url)  # undone after the test
    bench.offline_alexnet()
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(1, 3, 64, 64, generator=generator)
    y = (x + 0.1 * torch.randn(1, 3, 64, 64, generator=generator)).clamp(0, 1)
    ours = LearnedPerceptualImagePatchSimilarity(net_type="alex", normalize=True)(x, y)
    reference = lpips.LPIPS(net="alex", pnet_rand=True, verbose=False)
    reference.net.load_state_dict(torch.load(lpips_backbone_path("alex"), weights_only=True))
    assert ours.item() == pytest.approx(reference(x * 2 - 1, y * 2 - 1).item(), rel=1e-5)
    assert ours.item() > 0.001


@pytest.mark.skipif(not (EXAMPLES / "simple_trainer.py").is_file(), reason="fetch_gsplat_examples.sh not run")
def test_tyro_parses_the_gsplat_commands_into_simple_trainers_config(tmp_path, monkeypatch):
    tyro = pytest.importorskip("tyro")  # not a gsrecon dependency: `pip install tyro` to run this check
    module = types.ModuleType("simple_trainer_config")  # type hints resolve in the class's module
    module.__dict__.update(vars(__import__("typing")), dataclass=dataclasses.dataclass, field=dataclasses.field)
    module.__dict__.update(DefaultStrategy=DefaultStrategy, MCMCStrategy=MCMCStrategy)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    tree = ast.parse((EXAMPLES / "simple_trainer.py").read_text())
    config = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Config")
    exec(compile(ast.Module([config], []), "simple_trainer.py", "exec"), module.__dict__)  # the Config class alone
    Config = module.Config
    choices = {  # simple_trainer.py's two subcommands, as its __main__ builds them
        "default": ("", Config(strategy=DefaultStrategy())),
        "mcmc": ("", Config(init_opa=0.5, init_scale=0.1, opacity_reg=0.01, scale_reg=0.01, strategy=MCMCStrategy())),
    }
    setup = setup_for(tmp_path)
    for strategy, kind in (("default", DefaultStrategy), ("mcmc", MCMCStrategy)):
        monkeypatch.setattr(
            sys, "argv", ["simple_trainer.py", *bench.gsplat_command(setup, bench.Run("gsplat", strategy, 0))[4:]]
        )
        cfg = tyro.extras.overridable_config_cli(choices)
        assert isinstance(cfg.strategy, kind) and cfg.data_factor == 2 and cfg.test_every == 8
        assert cfg.max_steps == 7000 and cfg.eval_steps == cfg.save_steps == [7000] and cfg.disable_viewer
        assert cfg.sh_degree_interval == 233 and cfg.strategy.refine_start_iter == 117
    assert cfg.strategy.cap_max == 300_000 and cfg.strategy.refine_stop_iter == 5833 and cfg.init_opa == 0.5


def test_stand_in_viewer_modules_let_viewer_code_import(monkeypatch):
    monkeypatch.setattr(bench, "VIEWER_MODULES", ("gsrecon_test_absent_viewer",))
    try:
        bench.stand_in_viewer_modules()
        from gsrecon_test_absent_viewer import RenderTabState, Viewer  # as gsplat_viewer.py imports nerfview

        class TabState(RenderTabState):  # gsplat_viewer.py subclasses both at import time
            total_gs_count: int = 0

        assert issubclass(TabState, RenderTabState) and Viewer.__name__ == "Viewer"
        with pytest.raises(AttributeError):
            sys.modules["gsrecon_test_absent_viewer"].__file__  # noqa: B018  (importlib and tyro probe dunders)
    finally:
        sys.modules.pop("gsrecon_test_absent_viewer", None)


def test_cli_merges_the_runs_of_several_calls(tmp_path, capsys):
    calls = []
    for strategy, psnr in (("default", 25.0), ("mcmc", 26.0)):
        rows = [
            {"strategy": strategy, "trainer": trainer, "seed": seed, "psnr": psnr + seed, "lpips": None}
            for seed in (0, 1)
            for trainer in bench.TRAINERS
        ]
        calls.append(tmp_path / f"{strategy}.csv")
        bench.write_csv(calls[-1], rows, bench.RUN_COLUMNS)
    assert bench.main(["--merge", *map(str, calls), "--out", str(tmp_path / "all")]) == 0
    with (tmp_path / "all" / "summary.csv").open() as file:
        summary = list(csv.DictReader(file))
    assert [(row["strategy"], row["trainer"], row["runs"], row["psnr"]) for row in summary] == [
        ("default", "gsplat", "2", "25.5"), ("default", "gsrecon", "2", "25.5"),
        ("mcmc", "gsplat", "2", "26.5"), ("mcmc", "gsrecon", "2", "26.5"),
    ]  # fmt: skip
    assert summary[0]["lpips"] == "" and bench.read_runs_csv(tmp_path / "all" / "runs.csv")[7]["seed"] == 1
    assert "| mcmc | gsrecon | 2 | 26.5" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path / "x")])  # neither --merge nor --data / --gsplat-examples
