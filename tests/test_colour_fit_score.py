"""The colour-fitted test score (``metrics.colour_fit``): any run, with or without per-view modules."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from conftest import write_yaml

from gsrecon.cli import main
from gsrecon.metrics import MAX_PSNR, colour_fit_psnr, psnr


def test_the_colour_fit_on_the_left_half_scores_the_right_half_without_the_views_gain_and_bias() -> None:
    photo = torch.rand(6, 8, 3, generator=torch.Generator().manual_seed(0))
    render = (photo - torch.tensor([0.1, 0.0, -0.05])) / torch.tensor([1.2, 0.9, 1.0])  # in [0, 1]: no clipping
    assert psnr(render, photo) < 25 and colour_fit_psnr(render, photo) == MAX_PSNR
    spoiled = photo.clone()
    spoiled[:, 4:] = 0.5  # the right half differs: the fit on the left cannot hide it
    assert colour_fit_psnr(render, spoiled) < 20
    mask = torch.ones(6, 8, 1)
    mask[:, 4:] = 0.0  # the mask leaves nothing on the right half to score
    assert colour_fit_psnr(render, photo, mask) is None


def test_validation_and_eval_report_the_colour_fitted_psnr_beside_the_one_as_rendered(
    make_config, tmp_path: Path, capsys
) -> None:
    config = write_yaml(tmp_path / "run.yaml", make_config("run", metrics={"colour_fit": True, "lpips_net": "none"}))
    assert main(["train", "--config", str(config), "max_steps=3"]) == 0
    exp_dir = tmp_path / "run"
    validation = json.loads((exp_dir / "metrics.json").read_text())
    assert list(validation["mean"]) == ["psnr", "ssim", "lpips", "psnr_colour_fit"]
    assert all(view["psnr_colour_fit"] > 0 for view in validation["images"])
    assert "psnr_colour_fit" in (exp_dir / "train.log").read_text()
    assert main(["eval", "--exp-dir", str(exp_dir), "--device", "cpu", "metrics.colour_fit=false"]) == 0
    assert "psnr_colour_fit" not in json.loads((exp_dir / "eval" / "metrics.json").read_text())["mean"]
    assert main(["eval", "--exp-dir", str(exp_dir), "--device", "cpu", "--out", str(tmp_path / "ev")]) == 0
    evaluated = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert evaluated["mean"]["psnr_colour_fit"] == validation["mean"]["psnr_colour_fit"]
    assert "psnr_colour_fit" in capsys.readouterr().out
