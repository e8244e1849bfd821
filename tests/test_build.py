"""Building a run: one build_run for every purpose, and the rules between two components refused before anything is
built (one line, exit 2, naming both keys)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import write_yaml

from gsrecon.cli import main
from gsrecon.config import parse_structured
from gsrecon.engine.build import PURPOSES, build_run
from gsrecon.engine.resolve import RunConfig


@pytest.mark.parametrize(
    "overrides, keys",
    [
        (["renderer.packed=true", "strategy.name=mcmc"], ("renderer.packed", "data.fisheye")),
        (["renderer.median_depth=true", "strategy.name=mcmc"], ("renderer.median_depth", "data.fisheye")),
        ([], ("strategy.name", "data.fisheye", "renderer.name")),
        (["strategy.name=mcmc", "hooks.ExportHook.format=mesh"], ("hooks.ExportHook.format", "data.fisheye")),
        (["strategy.name=mcmc", "pose_opt.name=se3"], ("pose_opt", "data.fisheye")),
    ],
)
def test_gsplat_through_a_fisheye_lens_is_refused_before_the_run_is_built(
    capsys, make_config, tmp_path: Path, overrides: list[str], keys: tuple[str, ...]
) -> None:
    config = write_yaml(tmp_path / "c.yaml", make_config(strategy={"name": "default"}))
    code = main(["train", "--config", str(config), "renderer.name=gsplat", "data.fisheye=lens", *overrides])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert all(key in err for key in keys) and "c.yaml" in err
    assert not (tmp_path / "run").exists()  # refused before the run folder is taken


def test_the_rules_let_a_pinhole_or_mcmc_run_through(make_config, tmp_path: Path) -> None:
    from gsrecon.engine.resolve import resolve_run_config

    for extra in ({"strategy": {"name": "mcmc"}}, {"data": {"dataset": "synthetic", "fisheye": "undistort"}}):
        raw = {**make_config(), "renderer": {"name": "gsplat", "packed": True}, **extra}
        resolved = resolve_run_config(parse_structured(RunConfig, raw), torch.device("cpu"), "c.yaml")
        assert resolved["renderer"]["packed"] is True


def test_a_scene_purpose_builds_data_renderer_and_views_only(make_config) -> None:
    cfg = parse_structured(RunConfig, make_config())
    for purpose in ("eval", "view"):
        run = build_run(cfg, purpose, "c.yaml", device="cpu")
        assert run.datapipeline is not None and run.renderer is not None and run.views is not None
        assert run.model is None and run.strategy is None and run.hooks == {}
        assert run.resolved["renderer"]["name"] == "torch" and run.device == torch.device("cpu")
    block = build_run(cfg, "block", "c.yaml")
    assert block.datapipeline is None and block.resolved["hooks"]["ExportHook"] is not None
    with pytest.raises(ValueError, match="unknown purpose 'paint'"):
        build_run(cfg, "paint")
    assert {"train", "eval", "export", "render", "view", "lod", "block"} == set(PURPOSES)
