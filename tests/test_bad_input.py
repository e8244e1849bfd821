"""`gsrecon train` on bad scene data or learning rates: one line naming the file / key / value, and exit code 2."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from colmap_writer import write_model
from conftest import write_yaml
from test_blender import _write_ngp
from test_colmap import _make_scene
from test_images import png_header_only

from gsrecon.cli import main
from gsrecon.data.formats.colmap_model import ColmapPoints


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GSRECON_CACHE", str(tmp_path / "cache"))


def _train(capsys, config: dict, *overrides: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``gsrecon train`` on ``config`` with ``overrides``."""
    path = write_yaml(Path(config["exp_dir"]).parent / "c.yaml", config)
    code = main(["train", "--config", str(path), *overrides])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _colmap(root: Path, change: Callable | None = None, **scene_kwargs) -> dict:
    """A COLMAP scene folder, its model changed by ``change(model)`` when given; the data config for it."""
    _, model, _ = _make_scene(root, **scene_kwargs)
    if change is not None:
        change(model)
        write_model(model, root / "sparse" / "0")
    return {"dataset": "colmap", "path": str(root)}


def _rename_image(model) -> None:
    model.images[1].name = "../outside.png"


def _nan_point(model) -> None:
    model.points.xyz[2, 0] = np.nan


def _no_points(model) -> None:
    model.points = ColmapPoints.empty()


def _blender(root: Path, frame_fields: dict) -> dict:
    content = _write_ngp(root)
    content["frames"][0] |= frame_fields
    (root / "transforms.json").write_text(json.dumps(content))
    return {"dataset": "blender", "path": str(root)}


def _bomb(root: Path) -> dict:
    data = _colmap(root)
    png_header_only(root / "images" / "img_03.png", 100_000, 100_000)
    return data


@pytest.mark.parametrize(
    ("scene", "message"),
    [
        (
            lambda root: _colmap(root, params=[0.0, 61.0, 31.3, 24.7]),
            "cameras.bin: camera 1 (PINHOLE): 'fx' must be a finite number > 0, got 0.0",
        ),
        (lambda root: _colmap(root, _rename_image), "images.bin: image 1 has the name '../outside.png'"),
        (lambda root: _colmap(root, _nan_point), "points3D.bin: point 2 has a non-finite position [nan,"),
        (lambda root: _colmap(root, _no_points), "the dataset has no points; use model.init=random"),
        (_bomb, "img_03.png: the image has more pixels than PIL opens safely (a possible decompression bomb)"),
        (
            lambda root: _blender(root, {"fl_x": -5.0}),
            "transforms.json: frame 'images/frame_00000.jpg': 'fl_x' must be a finite number > 0, got -5.0",
        ),
        (
            lambda root: _blender(root, {"transform_matrix": [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]]}),
            "transforms.json: frame 'images/frame_00000.jpg': 'transform_matrix' must be a finite, invertible",
        ),
    ],
)
def test_bad_scene_data_is_one_line_and_exit_2(capsys, make_config, tmp_path: Path, scene, message: str) -> None:
    data = scene(tmp_path / "scene")
    init = "sfm" if data["dataset"] == "colmap" else "random"  # blender scenes have no points
    code, _, err = _train(capsys, make_config(max_steps=1, data=data), f"model.init={init}")
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_random_init_trains_a_colmap_scene_without_points(capsys, make_config, tmp_path: Path) -> None:
    config = make_config(max_steps=1, data=_colmap(tmp_path / "scene", _no_points))
    code, out, err = _train(capsys, config, "model.init=random", "model.init_num_points=200")
    assert code == 0, err
    assert "finished 1 steps" in out


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optimizer.means=-1", "optimizer.means must be a finite number >= 0, got -1.0"),
        ("optimizer.opacities=nan", "optimizer.opacities must be a finite number >= 0, got nan"),
        ("optimizer.eps=0", "optimizer.eps must be a finite number > 0, got 0.0"),
        ("scheduler.final_factor.means=inf", "scheduler.final_factor.means must be in (0, 1], got inf"),
        ("model.sh_degree=-1", "model.sh_degree must be between 0 and 3, got -1"),  # issue 60: an exit 1 in init
        ("model.sh_degree=4", "model.sh_degree must be between 0 and 3, got 4"),
        ("model.sh_degree_interval=0", "model.sh_degree_interval must be >= 1, got 0"),
        ("views.pose_opt=[se3]", "key 'views.pose_opt': an entry is a mapping of its arguments"),  # named no file
    ],
)
def test_values_out_of_range_are_one_line_and_exit_2(
    capsys, make_config, tmp_path: Path, override: str, message: str
) -> None:
    code, _, err = _train(capsys, make_config(max_steps=1), override)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert "c.yaml + command line" in err  # the source of the value
    assert not (tmp_path / "run").exists()


def test_decompression_bomb_photo_for_structure_from_motion_is_one_line_and_exit_2(capsys, tmp_path: Path) -> None:
    (tmp_path / "photos").mkdir()
    png_header_only(tmp_path / "photos" / "bomb.png", 100_000, 100_000)
    code = main(["data", "colmap", "--images", str(tmp_path / "photos"), "--out", str(tmp_path / "out"), "--cpu"])
    err = capsys.readouterr().err
    assert code == 2
    assert "bomb.png: cannot read the photo (Image size (10000000000 pixels) exceeds limit" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_training_says_what_it_starts_from_and_why_a_capture_without_points_starts_at_random(
    capsys, make_config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ngp = _blender(tmp_path / "ngp", {})  # six 64x40 renders of a sphere: too small for SIFT to match
    code, _, err = _train(capsys, make_config(max_steps=1, data=ngp), "model.init_num_points=200")
    assert code == 0, err
    assert "training 200 Gaussians from random points on " in err  # log lines go to stderr
    assert "the data has no SfM points to start from; triangulating them from the known poses failed: " in err
    assert "triangulated 0 points from 6 images (at least 100 needed)" in err
    monkeypatch.setitem(sys.modules, "pycolmap", None)
    code, _, err = _train(capsys, make_config(max_steps=1, data=ngp), "model.init_num_points=200", "--overwrite")
    assert code == 0, err
    assert "no SfM points to start from; with pycolmap installed (`pip install pycolmap`) training triangulates" in err
    config = make_config(max_steps=1, data=_colmap(tmp_path / "colmap"))
    code, _, err = _train(capsys, config, "--overwrite")
    assert code == 0, err
    assert " Gaussians from SfM points on " in err and "triangulate" not in err


def _degree_params(n: int, degree: int) -> dict:
    """``n`` Gaussians with the SH coefficients of ``degree`` (any degree: not checked here)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    return {
        "means": torch.randn(n, 3, generator=gen),
        "scales": torch.full((n, 3), -3.0),
        "quats": torch.randn(n, 4, generator=gen),
        "opacities": torch.zeros(n),
        "sh0": torch.zeros(n, 1, 3),
        "shN": torch.zeros(n, (degree + 1) ** 2 - 1, 3),
    }


def _write_degree_ply(path: Path, degree: int) -> Path:
    """A reference-layout 3DGS PLY of SH degree ``degree``, written without gsrecon (which refuses degree 4+)."""
    from plyfile import PlyData, PlyElement

    rest = 3 * ((degree + 1) ** 2 - 1)
    names = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", *(f"f_rest_{i}" for i in range(rest)), "opacity"]
    names += [f"scale_{i}" for i in range(3)] + [f"rot_{i}" for i in range(4)]
    data = np.zeros(4, dtype=[(name, "<f4") for name in names])
    data["rot_0"] = 1.0
    PlyData([PlyElement.describe(data, "vertex")]).write(str(path))
    return path


@pytest.mark.parametrize("degree", [4, 9])
def test_a_ply_or_checkpoint_of_sh_degree_above_3_is_one_line_and_exit_2(capsys, make_config, tmp_path, degree):
    import torch

    config = write_yaml(tmp_path / "c.yaml", make_config())
    ply = _write_degree_ply(tmp_path / "deep.ply", degree)
    code = main(["eval", "--ply", str(ply), "--config", str(config), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"deep.ply: {3 * ((degree + 1) ** 2 - 1)} f_rest_* properties hold SH degree {degree}" in err
    checkpoint = tmp_path / "deep.pt"
    torch.save({"params": _degree_params(4, degree), "step": 1, "config": {}}, checkpoint)
    code = main(["eval", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "deep.pt: Gaussian parameter 'shN'" in err and f"SH degree {degree}, above the highest" in err
    assert not (tmp_path / "out").exists()


def test_an_old_per_view_key_beside_a_new_one_is_one_line_naming_both_and_exit_2(capsys, make_config, tmp_path):
    """Issue 60: the old shape's `appearance.lr` silently won over `views.appearance.lr`."""
    config = make_config(max_steps=1, views={"appearance": {"name": "affine", "lr": 0.01}}, appearance={"lr": 0.5})
    code, _, err = _train(capsys, config)
    assert code == 2
    assert "key 'appearance.lr' (0.5) and key 'views.appearance.lr' (0.01) set the same option" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
