"""``scripts/make_distractors.py``: textured boxes standing in a capture, drawn through each camera of a contiguous
run of training photos; the test photos and the sparse model untouched."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from capture_layouts import colmap
from colmap_writer import write_model
from conftest import script_module
from PIL import Image

from gsrecon.cli import main
from gsrecon.data.formats.colmap_model import ColmapCamera, read_model
from gsrecon.data.formats.lens import Distortion, camera_intrinsics, distort
from gsrecon.data.readers.colmap import load_colmap


@pytest.fixture
def capture(tmp_path: Path) -> Path:
    return colmap(tmp_path / "scene", tmp_path / "cache")


def corners_in(box: dict, viewmat: torch.Tensor, K: torch.Tensor, lens: Distortion | None = None) -> np.ndarray:
    """[8, 2] the pixels (x, y) of the eight corners of a box of ``distractors.json`` through a camera (a pinhole,
    or ``lens``)."""
    signs = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], float)
    rotation, half = np.array(box["rotation"]), np.array(box["half"])
    world = np.array(box["centre"]) + (signs * half) @ rotation.T  # [8, 3]
    camera = world @ viewmat[:3, :3].double().numpy().T + viewmat[:3, 3].double().numpy()
    x, y = camera[:, 0] / camera[:, 2], camera[:, 1] / camera[:, 2]
    if lens is not None:
        x, y = distort(x, y, lens)
    K = K.double().numpy()
    return np.stack([x * K[0, 0] + K[0, 2], y * K[1, 1] + K[1, 2]], -1)


def test_boxes_are_drawn_where_their_projection_says_into_a_contiguous_run_and_no_test_photo(
    capture: Path, tmp_path: Path
) -> None:
    maker = script_module("make_distractors")
    out = tmp_path / "boxes"
    assert maker.main([str(capture), str(out), "--seed", "3", "--fraction", "0.4"]) == 0
    record = json.loads((out / "distractors.json").read_text())
    scene = load_colmap(str(capture), eval_split="every_8")
    train = sorted(frame.name for frame in scene.train)
    run = record["run"]
    start = train.index(run[0])
    assert run == train[start : start + len(run)] and len(run) == round(0.4 * len(train)) == 3  # contiguous
    assert (out / "sparse" / "0" / "images.bin").read_bytes() == (capture / "sparse" / "0" / "images.bin").read_bytes()
    frames = {frame.name: frame for frame in scene.train + scene.test}
    for name, frame in frames.items():
        before, after = (capture / "images" / f"{name}.png").read_bytes(), (out / "images" / f"{name}.png").read_bytes()
        if name not in run:
            assert before == after, name  # test photos and the rest of the training photos: byte for byte
            continue
        changed = np.any(np.array(Image.open(out / "images" / f"{name}.png")) != frame.image.numpy(), axis=-1)
        assert 0.01 < changed.mean() == pytest.approx(record["covered"][name], abs=0.01)
        # every changed pixel lies inside the projected outline of a box, and the same boxes are in every photo of the
        # run: each box's centre lands on a changed pixel
        rows, cols = np.nonzero(changed)
        inside = np.zeros(len(rows), bool)
        for box in record["boxes"]:
            corners = corners_in(box, frame.viewmat, frame.K)
            low, high = corners.min(0) - 1, corners.max(0) + 1
            inside |= (
                (cols + 0.5 >= low[0]) & (cols + 0.5 <= high[0]) & (rows + 0.5 >= low[1]) & (rows + 0.5 <= high[1])
            )
            x, y = corners.mean(0)
            if 0 <= x < frame.width and 0 <= y < frame.height:
                assert changed[int(y), int(x)], (name, box["centre"])
        assert inside.all()
    again = tmp_path / "again"
    assert maker.main([str(capture), str(again), "--seed", "3", "--fraction", "0.4"]) == 0
    assert all((again / "images" / path.name).read_bytes() == path.read_bytes() for path in (out / "images").iterdir())


def test_boxes_are_drawn_through_a_lens_into_the_photo_as_it_was_taken(capture: Path, tmp_path: Path) -> None:
    """A capture with radial distortion (as LLFF's horns has): the boxes land where the lens puts them in the photo's
    file (which the loader then undistorts), not where a pinhole would."""
    model = read_model(capture / "sparse" / "0")
    (camera,) = model.cameras.values()
    f, cx, cy = (float(value) for value in camera.params[:3])
    lens_camera = ColmapCamera(camera.id, "SIMPLE_RADIAL", camera.width, camera.height, np.array([f, cx, cy, 0.3]))
    model.cameras[camera.id] = lens_camera
    write_model(model, capture / "sparse" / "0")
    K, lens = camera_intrinsics(lens_camera, "test")
    K = torch.from_numpy(K)
    maker = script_module("make_distractors")
    out = tmp_path / "boxes"
    assert maker.main([str(capture), str(out), "--seed", "3", "--fraction", "0.4"]) == 0
    record = json.loads((out / "distractors.json").read_text())
    frames = {frame.name: frame for frame in load_colmap(str(capture), eval_split="every_8").train}
    beyond_pinhole = 0
    for name in record["run"]:
        before = np.array(Image.open(capture / "images" / f"{name}.png"))
        changed = np.any(np.array(Image.open(out / "images" / f"{name}.png")) != before, axis=-1)
        assert changed.mean() == pytest.approx(record["covered"][name], abs=0.01) and changed.mean() > 0.01
        rows, cols = np.nonzero(changed)
        inside = {"lens": np.zeros(len(rows), bool), "pinhole": np.zeros(len(rows), bool)}
        for box in record["boxes"]:
            for kind, distortion in (("lens", lens), ("pinhole", None)):
                corners = corners_in(box, frames[name].viewmat, K, distortion)
                low, high = corners.min(0) - 1, corners.max(0) + 1
                inside[kind] |= (
                    (cols + 0.5 >= low[0]) & (cols + 0.5 <= high[0]) & (rows + 0.5 >= low[1]) & (rows + 0.5 <= high[1])
                )
        assert inside["lens"].all(), name
        beyond_pinhole += int((~inside["pinhole"]).sum())
    assert beyond_pinhole > 0  # pixels the lens covers and a pinhole would not: the rays went through the lens


def test_the_capture_trains_and_bad_options_are_refused(capture: Path, tmp_path: Path, capsys) -> None:
    maker = script_module("make_distractors")
    out = tmp_path / "boxes"
    assert maker.main([str(capture), str(out), "--kind", "billboard", "--seed", "1"]) == 0
    code = main(["train", "--data", str(out), "max_steps=2", "val_interval=2", f"exp_dir={tmp_path / 'run'}"])
    assert code == 0 and (tmp_path / "run" / "metrics.json").is_file()
    with pytest.raises(SystemExit, match="exists"):
        maker.main([str(capture), str(out)])
    with pytest.raises(SystemExit, match="--fraction in"):
        maker.main([str(capture), str(tmp_path / "new"), "--fraction", "1.5"])
    capsys.readouterr()
