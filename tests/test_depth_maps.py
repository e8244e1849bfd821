"""Depth maps from the capture: reading and preparing them (units, every factor, undistortion), finding them beside
the images, the ``depth_maps`` loss term, depth errors of test views, the synthetic scene's true depth, bad depth
files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_config, write_yaml
from PIL import Image
from test_colmap import _make_scene
from test_triangulate import _write_transforms

from gsrecon.cli import main
from gsrecon.config import ConfigError, parse_structured
from gsrecon.data.errors import DatasetError
from gsrecon.data.formats.depths import DepthFile, read_depth
from gsrecon.data.formats.images import camera_image_file
from gsrecon.data.formats.lens import Distortion, intrinsics_matrix
from gsrecon.data.pipeline import DataPipeline
from gsrecon.data.prefetch import BYTES_PER_PIXEL, decoded_bytes
from gsrecon.data.readers.colmap import load_colmap
from gsrecon.data.readers.synthetic import SyntheticConfig, load_synthetic, surface_distance
from gsrecon.data.readers.transforms import load_transforms
from gsrecon.engine.trainer import DefaultTrainer
from gsrecon.losses.depth_maps import depth_map_loss
from gsrecon.metrics import depth_errors, mean_metrics

torch.set_num_threads(1)

BOX_ROWS, BOX_COLS = slice(8, 16), slice(16, 24)  # a block with depth in a 64x48 image, aligned to every factor


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GSRECON_CACHE", str(tmp_path / "cache"))


def write_png_depth(path: Path, metres: np.ndarray, unit: float = 0.001) -> None:
    """A 16-bit PNG depth map of ``metres`` [H, W] in units of ``unit`` metres."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.rint(metres / unit).astype(np.uint16)).save(path)


def box_depth(width: int = 64, height: int = 48, metres: float = 2.0) -> np.ndarray:
    """[H, W] zero but for ``metres`` on :data:`BOX_ROWS` x :data:`BOX_COLS` (scaled to a map of another size)."""
    depth = np.zeros((height, width))
    sy, sx = height / 48, width / 64
    rows = slice(round(BOX_ROWS.start * sy), round(BOX_ROWS.stop * sy))
    cols = slice(round(BOX_COLS.start * sx), round(BOX_COLS.stop * sx))
    depth[rows, cols] = metres
    return depth


def capture(root: Path, scene_cfg: SyntheticConfig, depth_fields: dict | None = None) -> list:
    """The synthetic scene as a transforms.json capture (every_8 split: views 0 and 8 are test views); each
    frame gets ``depth_fields`` (e.g. a ``depth_file_path``). Returns its frames, in order."""
    frames = load_synthetic(scene_cfg, eval_split="none").train
    _write_transforms(root, frames)
    content = json.loads((root / "transforms.json").read_text())
    for frame in content["frames"]:
        frame.update(depth_fields or {})
    (root / "transforms.json").write_text(json.dumps(content))
    return frames


# ----------------------------------------------------------------------------------------- the format


def test_png_depth_is_millimetres_times_the_unit_and_npy_is_metres_invalid_pixels_are_0(tmp_path: Path) -> None:
    stored = np.array([[0, 1500, 65535], [1, 2, 3]], np.uint16)
    Image.fromarray(stored).save(tmp_path / "d.png")
    assert np.array_equal(read_depth(tmp_path / "d.png"), (stored * 0.001).astype(np.float32))
    assert np.array_equal(read_depth(tmp_path / "d.png", unit=0.0001), (stored * 0.0001).astype(np.float32))
    np.save(tmp_path / "d.npy", np.array([[1.25, np.nan], [-1.0, np.inf]], np.float32))
    assert np.array_equal(read_depth(tmp_path / "d.npy"), np.array([[1.25, 0.0], [0.0, 0.0]], np.float32))


@pytest.mark.parametrize("factor", [1, 2, 4, 8])
@pytest.mark.parametrize("map_size", [(64, 48), (32, 24), (128, 96)])
def test_a_depth_maps_pixels_reach_the_loss_at_the_right_place_at_every_factor(
    tmp_path: Path, factor: int, map_size: tuple[int, int]
) -> None:
    """A map of the image's size or of another resolution of its shape (LiDAR), read at every data.factor: its
    valid block lands on the same part of the image, and the loss's gradient reaches exactly those pixels."""
    scene_cfg = SyntheticConfig(width=64, height=48, num_views=3, num_points=100, supersample=1, val_every=0)
    frames = capture(tmp_path, scene_cfg, {"depth_file_path": "depths/d.png"})
    write_png_depth(tmp_path / "depths" / "d.png", box_depth(*map_size))
    pipeline = DataPipeline(
        DataPipeline.Config(dataset="transforms", path=str(tmp_path), factor=factor, eval_split="none"),
        torch.device("cpu"),
    )
    batch = pipeline.next_train(0)
    expected = torch.zeros(48 // factor, 64 // factor)
    expected[BOX_ROWS.start // factor : BOX_ROWS.stop // factor, BOX_COLS.start // factor : BOX_COLS.stop // factor] = 2
    assert len(frames) == 3 and batch.depths.shape == (1, 48 // factor, 64 // factor, 1)
    assert torch.equal(batch.depths[0, ..., 0], expected)

    rendered = torch.full_like(batch.depths, 1.0, requires_grad=True)
    depth_map_loss(rendered, batch.depths, batch.masks).backward()
    assert torch.equal(rendered.grad[0, ..., 0] != 0, expected > 0)


@pytest.mark.parametrize("dist", [Distortion(k1=-0.2, p1=0.01), Distortion(k1=0.3, fisheye=True)])
def test_an_undistorted_depth_map_takes_its_values_from_the_map_never_blending_across_an_edge(
    tmp_path: Path, dist: Distortion
) -> None:
    depth = np.full((64, 96), 1.0)
    depth[:, 45:] = 3.0  # a depth edge
    write_png_depth(tmp_path / "d.png", depth)
    K = intrinsics_matrix(80.0, 80.0, 48.0, 32.0)
    Image.fromarray(np.zeros((64, 96, 3), np.uint8)).save(tmp_path / "image.png")
    prepared = camera_image_file(tmp_path / "image.png", (96, 64), K, dist, 2, camera="test")
    assert prepared.file.transform.K  # the image is undistorted
    values = DepthFile(tmp_path / "d.png", prepared.file.transform).load()
    assert values.shape == (32, 48)
    assert set(np.unique(values).tolist()) <= {0.0, 1.0, 3.0} and (values == 1.0).any() and (values == 3.0).any()
    assert (values > 0).mean() > 0.5


def test_depth_maps_are_found_beside_colmap_images_lazily_alike_and_frames_without_one_have_none(
    tmp_path: Path,
) -> None:
    root, _, _ = _make_scene(tmp_path / "colmap")
    write_png_depth(root / "depths" / "img_03.png", np.full((48, 64), 1.5))
    np.save(root / "depths" / "img_05.png.npy", np.full((24, 32), 2.5, np.float32))  # COLMAP's <name>.npy, metres
    eager = {f.name: f for f in load_colmap(str(root), factor=2, eval_split="none").train}
    lazy = {f.name: f for f in load_colmap(str(root), factor=2, eval_split="none", lazy=True).train}
    assert torch.equal(eager["img_03"].depth, torch.full((24, 32), 1.5))
    assert torch.equal(eager["img_05"].depth, torch.full((24, 32), 2.5))
    assert sum(f.depth is not None for f in eager.values()) == 2
    assert isinstance(lazy["img_03"].depth, DepthFile) and torch.equal(
        lazy["img_03"].decoded().depth, eager["img_03"].depth
    )
    pipeline = DataPipeline(
        DataPipeline.Config(dataset="colmap", path=str(root), eval_split="none", cache="disk", factor=2),
        torch.device("cpu"),
    )
    pixels = 32 * 24
    assert decoded_bytes([lazy["img_03"]]) == pixels * BYTES_PER_PIXEL + pixels * 4  # data.cache auto counts depth
    assert decoded_bytes([eager["img_03"]]) == pixels * eager["img_03"].pixels.shape[-1] + pixels * 4
    batches = [pipeline.next_train(step) for step in range(10)]
    with_depth = next(b for b in batches if b.names == ["img_05"])
    assert torch.equal(with_depth.depths[0, ..., 0], torch.full((24, 32), 2.5))
    assert next(b for b in batches if b.names == ["img_04"]).depths is None


def test_a_transforms_capture_reads_depths_beside_its_images_and_its_per_frame_unit(tmp_path: Path) -> None:
    scene_cfg = SyntheticConfig(width=32, height=24, num_views=3, num_points=100, supersample=1, val_every=0)
    frames = capture(tmp_path, scene_cfg)
    (tmp_path / "depths").mkdir()
    np.save(tmp_path / "depths" / f"{frames[0].name}.npy", np.full((24, 32), 0.75))
    write_png_depth(tmp_path / "depths" / f"{frames[1].name}.png", np.full((24, 32), 1.5), unit=0.0001)
    content = json.loads((tmp_path / "transforms.json").read_text())
    content["frames"][1]["depth_unit_scale_factor"] = 0.0001
    (tmp_path / "transforms.json").write_text(json.dumps(content))
    loaded = load_transforms(str(tmp_path), eval_split="none").train
    assert torch.equal(loaded[0].depth, torch.full((24, 32), 0.75))
    assert torch.allclose(loaded[1].depth, torch.full((24, 32), 1.5)) and loaded[2].depth is None


# ----------------------------------------------------------------------------------------- bad depth files


def _bad_capture(tmp_path: Path) -> Path:
    scene_cfg = SyntheticConfig(width=32, height=24, num_views=3, num_points=100, supersample=1, val_every=0)
    capture(tmp_path / "capture", scene_cfg, {"depth_file_path": "depths/d.png"})
    return tmp_path / "capture" / "depths" / "d.png"


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (lambda p: write_png_depth(p, np.full((20, 32), 1.0)), "the depth map is 32x20, which is not the shape"),
        (lambda p: p.write_bytes(b"not a png"), "cannot read the"),
        (lambda p: write_png_depth(p, np.zeros((24, 32))), "the depth map has no valid pixel"),
        (lambda p: Image.fromarray(np.ones((24, 32), np.uint8)).save(p), "a PNG depth map must be 16-bit greyscale"),
    ],
    ids=["wrong_shape", "unreadable", "all_invalid", "8_bit"],
)
def test_a_bad_depth_file_is_one_line_naming_it_and_exit_2(
    tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str], write, message: str
) -> None:
    bad = _bad_capture(tmp_path)
    bad.parent.mkdir(exist_ok=True)
    write(bad)
    with pytest.raises(DatasetError, match=f"{bad}: {message}"):
        load_transforms(str(bad.parents[1]))
    data = {"dataset": "transforms", "path": str(bad.parents[1])}
    config = write_yaml(tmp_path / "run.yaml", tiny_config(tmp_path / "run", synthetic_cache, data=data))
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err and message in err


def test_a_missing_depth_file_and_a_bad_unit_name_the_file(tmp_path: Path) -> None:
    bad = _bad_capture(tmp_path)
    with pytest.raises(DatasetError, match=f"{bad}: depth map file is missing"):
        load_transforms(str(bad.parents[1]))
    write_png_depth(bad, np.full((24, 32), 1.0))
    content = json.loads((bad.parents[1] / "transforms.json").read_text())
    (bad.parents[1] / "transforms.json").write_text(json.dumps({**content, "depth_unit_scale_factor": 0}))
    with pytest.raises(DatasetError, match="'depth_unit_scale_factor' must be a finite number > 0, got 0"):
        load_transforms(str(bad.parents[1]))


def test_a_depth_map_of_1e30_metres_is_refused_naming_it(tmp_path: Path) -> None:
    bad = _bad_capture(tmp_path).with_suffix(".npy")
    bad.parent.mkdir()
    np.save(bad, np.full((24, 32), 1e30, np.float32))
    content = json.loads((bad.parents[1] / "transforms.json").read_text())
    for frame in content["frames"]:
        frame["depth_file_path"] = "depths/d.npy"
    (bad.parents[1] / "transforms.json").write_text(json.dumps(content))
    with pytest.raises(DatasetError, match=f"{bad}: the depth map holds depths up to 1e.30 m, beyond 1e.05 m"):
        load_transforms(str(bad.parents[1]))


def test_an_absolute_path_inside_the_capture_is_inside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    depth = _bad_capture(tmp_path)
    write_png_depth(depth, np.full((24, 32), 1.5))
    root = depth.parents[1]
    content = json.loads((root / "transforms.json").read_text())
    for frame in content["frames"]:
        frame["depth_file_path"] = str(depth)
    (root / "transforms.json").write_text(json.dumps(content))
    monkeypatch.chdir(tmp_path)
    frames = load_transforms(root.name, eval_split="none").train  # data.path relative, the file's path absolute
    assert len(frames) == 3 and all(torch.equal(f.depth, torch.full((24, 32), 1.5)) for f in frames)


@pytest.mark.parametrize(
    ("key", "value", "what"),
    [
        ("depth_file_path", "../x.npy", "depth map"),
        ("depth_file_path", "/etc/passwd", "depth map"),
        ("mask_path", "./../m.png", "mask"),
        ("file_path", "../image.png", "image"),
    ],
)
def test_a_file_outside_the_capture_is_refused_unless_the_user_opts_in(
    tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str], key: str, value: str, what: str
) -> None:
    root = _bad_capture(tmp_path).parents[1]
    content = json.loads((root / "transforms.json").read_text())
    outside = tmp_path / Path(value).name  # where "../<name>" leads
    if key == "file_path":
        (root / content["frames"][0]["file_path"]).rename(outside)
    elif key == "depth_file_path":
        np.save(outside, np.full((24, 32), 2.0, np.float32))
    else:
        Image.fromarray(np.full((24, 32), 255, np.uint8)).save(outside)
    for frame in content["frames"]:
        frame.pop("depth_file_path")
    content["frames"][0][key] = value
    (root / "transforms.json").write_text(json.dumps(content))
    data = {"dataset": "transforms", "path": str(root), "eval_split": "none"}
    config = write_yaml(tmp_path / "run.yaml", tiny_config(tmp_path / "run", synthetic_cache, data=data))
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"the {what} {value!r} lies outside the capture folder {root}" in err and "data.outside_capture=true" in err
    if value.startswith("/"):
        return
    loaded = DataPipeline(DataPipeline.Config(**data, outside_capture=True), torch.device("cpu")).scene.train[0]
    assert loaded.name is not None  # read from where the user keeps it, as asked


def test_the_term_on_a_capture_without_depth_is_one_line_naming_the_key_and_exit_2(
    tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_yaml(
        tmp_path / "run.yaml", tiny_config(tmp_path / "run", synthetic_cache, loss={"depth_maps": {"weight": 0.1}})
    )
    with pytest.raises(ConfigError, match="key 'loss.depth_maps': the depth maps term needs depth maps"):
        DefaultTrainer(
            parse_structured(
                DefaultTrainer.Config, tiny_config(tmp_path / "r", synthetic_cache, loss={"depth_maps": {}})
            )
        )
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "loss.depth_maps=null" in err


# ----------------------------------------------------------------------------------------- loss and metrics


def test_the_loss_leaves_out_masked_invalid_and_unrendered_pixels() -> None:
    target = torch.tensor([2.0, 0.0, 2.0, 4.0, 2.0]).reshape(1, 1, 5, 1)
    rendered = torch.tensor([3.0, 9.0, 9.0, 3.0, 0.0]).reshape(1, 1, 5, 1)
    mask = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0]).reshape(1, 1, 5, 1)
    # kept: pixel 0 (|3 - 2| / 2) and pixel 3 (|3 - 4| / 4); 1 has no depth, 2 is masked, 4 is rendered empty
    assert depth_map_loss(rendered, target, mask).item() == pytest.approx((0.5 + 0.25) / 2)
    assert depth_map_loss(rendered, torch.zeros_like(target), None) is None


def test_scale_and_shift_fit_a_relative_depth_map_to_the_render_per_view() -> None:
    generator = torch.Generator().manual_seed(0)
    rendered = 1.0 + torch.rand(2, 6, 8, 1, generator=generator)
    relative = torch.stack([(rendered[0] - 0.5) / 3.0, rendered[1] * 0.2 + 0.1])  # another scale and shift per view
    assert depth_map_loss(rendered, relative, None).item() > 0.3
    assert depth_map_loss(rendered, relative, None, scale_shift=True).item() < 1e-5


def test_depth_errors_over_valid_kept_pixels_and_means_over_the_views_that_have_them() -> None:
    target = torch.tensor([2.0, 0.0, 4.0, 1.0]).reshape(1, 4, 1)
    rendered = torch.tensor([3.0, 5.0, 4.0, 0.0]).reshape(1, 4, 1)
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0]).reshape(1, 4, 1)
    errors = depth_errors(rendered, target, mask)
    assert errors["depth_abs_rel"] == pytest.approx(0.25) and errors["depth_rmse"] == pytest.approx(0.5**0.5)
    assert depth_errors(rendered, target * 0) == {}
    means = mean_metrics([{"name": "a", "psnr": 20.0, "depth_rmse": 1.0}, {"name": "b", "psnr": 30.0}])
    assert means == {"psnr": 25.0, "depth_rmse": 1.0}


# ----------------------------------------------------------------------------------------- the synthetic scene


def test_the_synthetic_depth_lies_on_the_scene_and_noise_reaches_training_views_only() -> None:
    cfg = SyntheticConfig(width=32, height=24, num_views=9, num_points=100, supersample=1, depth=True)
    scene = load_synthetic(cfg)
    for frame in scene.train[:2] + scene.test:
        depth = frame.depth  # [H, W]
        v, u = torch.nonzero(depth > 0, as_tuple=True)
        z = depth[v, u].double()
        K, c2w = frame.K.double(), torch.linalg.inv(frame.viewmat.double())
        camera = torch.stack([(u + 0.5 - K[0, 2]) / K[0, 0] * z, (v + 0.5 - K[1, 2]) / K[1, 1] * z, z], -1)
        world = camera @ c2w[:3, :3].T + c2w[:3, 3]
        assert (depth > 0).float().mean() > 0.5 and surface_distance(world).max() < 1e-6
    noisy = load_synthetic(SyntheticConfig(**{**cfg.__dict__, "depth_noise": 0.05}))
    assert all(torch.equal(a.depth, b.depth) for a, b in zip(scene.test, noisy.test))
    ratio = noisy.train[0].depth[scene.train[0].depth > 0] / scene.train[0].depth[scene.train[0].depth > 0]
    assert 0.03 < float(ratio.std()) < 0.07 and torch.equal(noisy.train[0].depth > 0, scene.train[0].depth > 0)


def test_training_with_depth_maps_logs_the_term_and_eval_reports_depth_errors(
    tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tiny_config(tmp_path / "run", synthetic_cache, loss={"depth_maps": {"weight": 0.1}})
    cfg["data"]["synthetic"]["depth"] = True
    trainer = DefaultTrainer(parse_structured(DefaultTrainer.Config, cfg))
    trainer.train()
    assert trainer.outputs["losses"]["depth_maps"] > 0
    assert trainer.val_metrics["depth_abs_rel"] > 0 and trainer.val_metrics["depth_rmse"] > 0
    assert main(["eval", "--exp-dir", str(tmp_path / "run"), "--out", str(tmp_path / "eval")]) == 0
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["mean"]["depth_abs_rel"] == pytest.approx(trainer.val_metrics["depth_abs_rel"])
    assert all("depth_rmse" in view for view in metrics["images"])
    assert "depth_abs_rel" in capsys.readouterr().out
