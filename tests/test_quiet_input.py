"""Issue 51's quiet acceptances: values gsrecon took without a word (a negative thread count, a focal length of a
millionth of a pixel, options of a module that is off, a learning rate of a million, a list given as a word, another
capture's --config for a --ply). Each is one line naming the key or file, exit 2, or a warning."""

from __future__ import annotations

import json
from pathlib import Path

import capture_layouts
import pytest
import torch
from conftest import write_yaml
from test_blender import _write_ngp
from test_mesh import _sphere_gaussians

from gsrecon.cli import main
from gsrecon.data.capture_files import leaves
from gsrecon.model.ply import save_ply


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GSRECON_CACHE", str(tmp_path / "cache"))


def _train(capsys, config: dict, *overrides: str) -> tuple[int, str]:
    """(exit code, stderr) of ``gsrecon train`` on ``config`` with ``overrides``."""
    path = write_yaml(Path(config["exp_dir"]).parent / "c.yaml", config)
    code = main(["train", "--config", str(path), *overrides])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("num_threads=-1", "key 'num_threads': must be 0 (auto) or a number of threads >= 1, got -1"),
        (
            "views.pose_opt.lr=1e6",
            "key 'views.pose_opt': lr must be at most 1 (Adam moves each parameter by about lr a step",
        ),
        ("views.appearance.shape=big", "key 'views.appearance.shape': must be a list, got 'big'"),
        ("views.appearance.shape={x: 4}", "key 'views.appearance.shape': must be a list, got {'x': 4}"),
        ("views.pose_opt=[se3]", "key 'views.pose_opt': an entry is a mapping of its arguments"),
    ],
)
def test_a_value_taken_quietly_is_one_line_naming_its_key_and_exit_2(capsys, make_config, tmp_path, override, message):
    config = make_config(max_steps=1, views={"appearance": {"name": "bilateral_grid"}, "pose_opt": {"name": "se3"}})
    code, err = _train(capsys, config, override)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("section", "override", "message"),
    [
        (
            "views.pose_opt",
            "views.pose_opt.trust_px=-1",
            "key 'views.pose_opt': trust_px must be a finite number >= 0, got -1",
        ),
        (
            "views.appearance",
            "views.appearance.shape=[0,1,8]",
            "key 'views.appearance': shape must be three whole numbers",
        ),
        ("views.appearance", "views.appearance.shapes=[1,1,8]", "'shapes'"),
    ],
)
def test_the_options_of_a_module_that_is_off_are_checked_all_the_same(
    capsys, make_config, tmp_path, section, override, message
):
    code, err = _train(capsys, make_config(max_steps=1), f"{section}.name=none", override)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_focal_length_too_short_for_its_image_is_one_line_naming_the_file_and_exit_2(capsys, make_config, tmp_path):
    root = tmp_path / "scene"
    content = _write_ngp(root)
    content["frames"][0] |= {"fl_x": 1e-6}
    (root / "transforms.json").write_text(json.dumps(content))
    config = make_config(max_steps=1, data={"dataset": "blender", "path": str(root)})
    code, err = _train(capsys, config, "model.init=random")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "transforms.json: frame 'images/frame_00000.jpg': 'fl_x' 1e-06 is no focal length for an image" in err


def test_a_ply_with_another_captures_config_warns_in_every_command_and_format(make_config, tmp_path, capsys):
    """The warning existed for a mesh export (a format that renders the capture's views); a plain PLY export or an
    eval said nothing."""
    config = write_yaml(tmp_path / "capture.yaml", make_config("capture"))
    elsewhere = _sphere_gaussians(1000)
    elsewhere["means"] += torch.tensor([0.0, 0.0, 500.0])
    save_ply(tmp_path / "other.ply", elsewhere)
    args = ["export", "--ply", str(tmp_path / "other.ply"), "--config", str(config), "--out", str(tmp_path / "o.ply")]
    assert main(args) == 0
    warning = " ".join(capsys.readouterr().err.split())
    assert f"see only 0% of the 1000 Gaussians of {tmp_path / 'other.ply'}: is the --config that of" in warning
    assert main(["eval", *args[1:5], "--out", str(tmp_path / "eval")]) == 0  # and eval, render, view alike
    assert "see only 0% of the 1000 Gaussians" in " ".join(capsys.readouterr().err.split())


def test_a_dot_dot_after_a_symbolic_link_is_taken_where_the_system_takes_it(tmp_path, synthetic_cache, capsys):
    """``link/../photo.jpg`` passed the text check of ``..`` (it reads as ``photo.jpg``) and read the folder above
    the link's target, outside the capture. Links themselves are still followed."""
    root = capture_layouts.instant_ngp(tmp_path / "ngp", synthetic_cache)
    (tmp_path / "outside" / "sub").mkdir(parents=True)
    (root / "link").symlink_to(tmp_path / "outside" / "sub")
    assert not leaves(root, "link/photo.jpg") and not leaves(root, "images/../link/photo.jpg")
    assert leaves(root, "link/../photo.jpg") and leaves(root, "images/../link/../../photo.jpg")
    content = json.loads((root / "transforms.json").read_text())
    first = content["frames"][0]
    (root / first["file_path"]).rename(tmp_path / "outside" / "elsewhere.jpg")
    first["file_path"] = "link/../elsewhere.jpg"
    (root / "transforms.json").write_text(json.dumps(content))
    code = main(["train", "--data", str(root), "max_steps=1", "device=cpu", "num_threads=1", "renderer.name=torch"])
    err = capsys.readouterr().err
    assert code == 2 and "the image 'link/../elsewhere.jpg' lies outside the capture folder" in err, err
