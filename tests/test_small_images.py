"""Images smaller than the SSIM window's reach (6 px: the 11 px window reaches 5 px to either side of a pixel): SSIM
has a value at any size, and the halving of `gsrecon lod` stops before a level's photos get under it (issue 60
item 7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import write_yaml

from gsrecon.cli import main
from gsrecon.lod.levels import level_factor
from gsrecon.losses.ssim import WINDOW, blur, mirror_indices, ssim


@pytest.mark.parametrize("size", range(WINDOW // 2 + 1, 3 * WINDOW))
def test_the_mirror_extension_is_the_reflection_where_the_reflection_exists(size: int) -> None:
    row = torch.arange(size, dtype=torch.float32).view(1, 1, 1, size)
    reflected = F.pad(row, (WINDOW // 2, WINDOW // 2, 0, 0), mode="reflect").flatten()
    assert torch.equal(row.flatten()[mirror_indices(size, WINDOW // 2, row.device)], reflected)


def test_the_mirror_extension_of_rows_shorter_than_the_pad_reflects_again_at_its_ends() -> None:
    assert mirror_indices(3, 5, torch.device("cpu")).tolist() == [1, 0, 1, 2, 1, 0, 1, 2, 1, 0, 1, 2, 1]
    assert mirror_indices(2, 2, torch.device("cpu")).tolist() == [0, 1, 0, 1, 0, 1]
    assert mirror_indices(1, 5, torch.device("cpu")).tolist() == [0] * 11


@pytest.mark.parametrize(("height", "width"), [(1, 1), (3, 4), (5, 5), (6, 2), (2, 40)])
def test_ssim_of_images_under_the_window_has_a_value_and_a_gradient(height: int, width: int) -> None:
    """Issue 60: F.pad's reflection needs a side longer than 5 px: smaller images exited 1 in SSIM's padding."""
    generator = torch.Generator().manual_seed(0)
    photo = torch.rand(2, height, width, 3, generator=generator)
    render = torch.rand(2, height, width, 3, generator=generator).requires_grad_()
    assert ssim(photo, photo).item() == pytest.approx(1.0)
    value = ssim(render, photo)
    value.backward()
    assert torch.isfinite(value) and -1.0 <= value.item() < 1.0 and torch.isfinite(render.grad).all()
    mask = torch.ones(2, height, width, 1)
    assert ssim(render, photo, mask).item() == pytest.approx(value.item(), abs=1e-6)


def test_a_constant_image_blurs_to_itself_at_any_size() -> None:
    for height, width in [(1, 1), (2, 3), (5, 7)]:
        maps = torch.full((1, 2, height, width), 0.25)
        torch.testing.assert_close(blur(maps), maps)


@pytest.mark.parametrize(
    ("base", "scale", "level", "shortest", "factor"),
    [
        (2, 2, 1, 100, 4),  # photos far above the window: halved
        (1, 2, 3, 48, 8),  # 48 px: 24, 12, 6: the window's reach
        (1, 2, 3, 40, 4),  # 40 px: 20, 10, then 5 would be under it: the third level stays at 10 px
        (8, 2, 1, 6, 8),  # photos under the window already: not halved further
        (1, 1, 3, 5, 1),  # --scale 1: every level at the run's factor
        (16, 2, 2, 4000, 32),  # at most the largest factor
    ],
)
def test_the_halving_of_levels_stops_at_the_ssim_windows_reach(base, scale, level, shortest, factor) -> None:
    assert level_factor(base, scale, level, shortest) == factor


def _tiny_run(make_config, tmp_path: Path, **top) -> Path:
    """A run trained on 8x6 photos (32x24 at data.factor 4)."""
    config = make_config("run", max_steps=3, **top)
    config["data"]["factor"] = 4
    assert main(["train", "--config", str(write_yaml(tmp_path / "c.yaml", config))]) == 0
    return tmp_path / "run"


def test_levels_of_a_run_on_photos_at_the_windows_reach_train_at_the_runs_factor(make_config, tmp_path: Path) -> None:
    """Issue 60: `gsrecon lod` halved 8x6 photos to 4x3 and exited 1 in SSIM's padding."""
    exp_dir = _tiny_run(make_config, tmp_path)
    assert main(["lod", "--exp-dir", str(exp_dir), "--levels", "2", "--steps", "2"]) == 0
    levels = json.loads((exp_dir / "lod" / "levels.json").read_text())["levels"]
    assert [record["factor"] for record in levels] == [4, 4]


def test_eval_fitting_appearance_on_the_left_half_of_small_photos(make_config, tmp_path: Path) -> None:
    """Issue 60: `eval` with views.appearance.eval=fit_left scored the right half of 8x6 photos, 4x6 (and fitted on
    the left one): SSIM's padding exited 1."""
    appearance = {"name": "affine", "eval": "fit_left", "eval_steps": 2}
    exp_dir = _tiny_run(make_config, tmp_path, views={"appearance": appearance})
    assert main(["eval", "--exp-dir", str(exp_dir), "--device", "cpu"]) == 0
    mean = json.loads((exp_dir / "eval" / "metrics.json").read_text())["mean"]
    assert 0.0 < mean["ssim"] < 1.0, mean
