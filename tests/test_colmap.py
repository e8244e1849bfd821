"""COLMAP reader: .bin/.txt equivalence, poses and intrinsics, splits, factors, cache, image files, bad input,
a real scene."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from colmap_writer import write_model
from PIL import Image

from gsrecon.cameras.lens import project_points
from gsrecon.data.errors import DatasetError
from gsrecon.data.formats.colmap_model import (
    ColmapCamera,
    ColmapImage,
    ColmapPoints,
    SparseModel,
    read_model,
)
from gsrecon.data.formats.images import read_image, to_uint8, write_png
from gsrecon.data.formats.lens import camera_intrinsics, distort
from gsrecon.data.readers.colmap import load_colmap
from gsrecon.geometry import rotmat_to_quat
from gsrecon.model.gaussians import GaussianModel

torch.set_num_threads(1)

W, H = 64, 48
NUM_IMAGES = 10


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("GSRECON_CACHE", str(cache))
    return cache


def _look_at(eye: np.ndarray, target: np.ndarray) -> np.ndarray:
    """World-to-camera [4, 4] (OpenCV: z towards the target, y down) of a camera at ``eye``."""
    z = (target - eye) / np.linalg.norm(target - eye)
    x = np.cross(z, [0.0, 0.0, 1.0])
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    R = np.stack([x, y, z])  # rows: camera axes in world coordinates
    viewmat = np.eye(4)
    viewmat[:3, :3], viewmat[:3, 3] = R, -R @ eye
    return viewmat


def _synthetic_model(camera_model: str = "PINHOLE", params: list[float] | None = None) -> tuple[SparseModel, dict]:
    """Cameras on an arc around a cloud of coloured points; 2D observations are the true projections."""
    rng = np.random.default_rng(3)
    params = params or [58.0, 61.0, 31.3, 24.7]
    cameras = {1: ColmapCamera(1, camera_model, W, H, np.array(params, float))}
    xyz = rng.uniform(-1.0, 1.0, (40, 3)) * [1.0, 1.0, 0.3]
    rgb = rng.integers(0, 256, (40, 3)).astype(np.uint8)
    images, viewmats = {}, {}
    names = [f"img_{i:02d}.png" for i in range(NUM_IMAGES)]
    for i, name in enumerate(reversed(names)):  # ids in the opposite order of names: sorting must be by name
        angle = 0.5 * i
        eye = np.array([4.0 * np.cos(angle), 4.0 * np.sin(angle), 1.5])
        viewmat = _look_at(eye, np.zeros(3))
        cam_points = xyz @ viewmat[:3, :3].T + viewmat[:3, 3]  # [P, 3]
        xys = cam_points[:, :2] / cam_points[:, 2:] * params[:2] + params[2:4]
        qvec = rotmat_to_quat(torch.from_numpy(viewmat[None, :3, :3]))[0].numpy()
        images[i + 1] = ColmapImage(i + 1, qvec, viewmat[:3, 3], 1, name, xys, np.arange(40, dtype=np.int64))
        viewmats[name] = viewmat
    tracks = [np.array([[image_id, p] for image_id in images], np.int64) for p in range(40)]
    points = ColmapPoints(np.arange(40, dtype=np.int64), xyz, rgb, rng.uniform(0, 1, 40), tracks)
    return SparseModel(cameras, images, points), viewmats


def _write_images(
    folder: Path, names: list[str], size: tuple[int, int] = (W, H), seed: int = 0
) -> dict[str, np.ndarray]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pixels = {}
    for name in names:
        pixels[name] = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
        Image.fromarray(pixels[name]).save(folder / name)
    return pixels


def _make_scene(
    root: Path, ext: str = ".bin", sparse: str = "sparse/0", **model_kwargs
) -> tuple[Path, SparseModel, dict]:
    model, viewmats = _synthetic_model(**model_kwargs)
    write_model(model, root / sparse, ext)
    pixels = _write_images(root / "images", sorted(viewmats))
    return root, model, {"viewmats": viewmats, "pixels": pixels}


@pytest.fixture
def scene_dir(tmp_path: Path) -> Path:
    return _make_scene(tmp_path / "scene")[0]


def _frames(scene) -> list:
    return sorted(scene.train + scene.test, key=lambda f: f.name)


# ------------------------------------------------------------------------------------------ happy path


def test_bin_and_txt_give_equal_scenes(tmp_path: Path) -> None:
    root_bin, _, _ = _make_scene(tmp_path / "bin", ".bin")
    root_txt, _, _ = _make_scene(tmp_path / "txt", ".txt", sparse="sparse")
    a, b = load_colmap(str(root_bin)), load_colmap(str(root_txt))
    assert [f.name for f in a.train] == [f.name for f in b.train]
    assert [f.name for f in a.test] == [f.name for f in b.test]
    for fa, fb in zip(_frames(a), _frames(b)):
        assert torch.equal(fa.viewmat, fb.viewmat) and torch.equal(fa.K, fb.K) and torch.equal(fa.image, fb.image)
    assert torch.equal(a.points, b.points) and torch.equal(a.colors, b.colors)


def test_model_roundtrip_through_both_formats(tmp_path: Path) -> None:
    model, _ = _synthetic_model()
    for ext in (".bin", ".txt"):
        write_model(model, tmp_path / ext, ext)
        back = read_model(tmp_path / ext)
        assert back.cameras.keys() == model.cameras.keys()
        np.testing.assert_array_equal(back.cameras[1].params, model.cameras[1].params)
        for image_id, image in model.images.items():
            other = back.images[image_id]
            assert (other.name, other.camera_id) == (image.name, image.camera_id)
            np.testing.assert_array_equal(other.qvec, image.qvec)
            np.testing.assert_array_equal(other.xys, image.xys)
            np.testing.assert_array_equal(other.point3D_ids, image.point3D_ids)
        np.testing.assert_array_equal(back.points.xyz, model.points.xyz)
        np.testing.assert_array_equal(back.points.rgb, model.points.rgb)
        np.testing.assert_array_equal(back.points.errors, model.points.errors)
        for t_back, t_model in zip(back.points.tracks, model.points.tracks):
            np.testing.assert_array_equal(t_back, t_model)


def test_poses_intrinsics_points_and_images(tmp_path: Path) -> None:
    root, model, truth = _make_scene(tmp_path / "scene")
    scene = load_colmap(str(root), eval_split="none")
    assert len(scene.train) == NUM_IMAGES and scene.test == []
    for frame in scene.train:
        name = frame.name + ".png"
        np.testing.assert_allclose(frame.viewmat.numpy(), truth["viewmats"][name], atol=1e-6)
        np.testing.assert_array_equal(frame.image.numpy(), truth["pixels"][name])
        assert frame.viewmat.dtype == torch.float32 and frame.image.dtype == torch.uint8
        np.testing.assert_allclose(frame.K.numpy(), [[58.0, 0, 31.3], [0, 61.0, 24.7], [0, 0, 1]], rtol=1e-6)
        # The stored 2D observations are reproduced by K @ viewmat.
        image = next(img for img in model.images.values() if img.name == name)
        cam = model.points.xyz @ frame.viewmat[:3, :3].double().numpy().T + frame.viewmat[:3, 3].double().numpy()
        uv = cam @ frame.K.double().numpy().T
        np.testing.assert_allclose(uv[:, :2] / uv[:, 2:], image.xys, atol=1e-3)
    np.testing.assert_allclose(scene.points.numpy(), model.points.xyz, atol=1e-6)
    np.testing.assert_allclose(scene.colors.numpy(), model.points.rgb / 255.0, atol=1e-7)
    assert scene.points.dtype == torch.float32 and scene.colors.dtype == torch.float32
    assert scene.extent > 0


def test_every_8_split_is_by_sorted_name(scene_dir: Path) -> None:
    scene = load_colmap(str(scene_dir))
    assert [f.name for f in scene.test] == ["img_00", "img_08"]
    assert [f.name for f in scene.train] == [f"img_{i:02d}" for i in range(NUM_IMAGES) if i % 8]


def test_max_images_is_evenly_spaced_and_applied_before_split(scene_dir: Path) -> None:
    scene = load_colmap(str(scene_dir), max_images=4)
    assert [f.name for f in _frames(scene)] == ["img_00", "img_03", "img_06", "img_09"]
    assert [f.name for f in scene.test] == ["img_00"]


def test_dataset_split_reads_test_or_train_lists(scene_dir: Path) -> None:
    with pytest.raises(DatasetError, match=r"test\.txt or train\.txt"):
        load_colmap(str(scene_dir), eval_split="dataset")
    (scene_dir / "train.txt").write_text("img_01.png\nimg_02\n")
    scene = load_colmap(str(scene_dir), eval_split="dataset")
    assert [f.name for f in scene.train] == ["img_01", "img_02"] and len(scene.test) == NUM_IMAGES - 2
    (scene_dir / "test.txt").write_text("img_05.png\n\nimg_07.png\n")
    scene = load_colmap(str(scene_dir), eval_split="dataset")
    assert [f.name for f in scene.test] == ["img_05", "img_07"] and len(scene.train) == NUM_IMAGES - 2
    (scene_dir / "test.txt").write_text("./img_03\nimg_04.png\nnope.png\n")
    with pytest.raises(DatasetError, match=r"test\.txt: 1 of 3 entries name no image of the scene: 'nope\.png'"):
        load_colmap(str(scene_dir), eval_split="dataset")
    (scene_dir / "test.txt").write_text("./img_03\nimg_04.png\n")  # './' and the extension are optional
    assert [f.name for f in load_colmap(str(scene_dir), eval_split="dataset").test] == ["img_03", "img_04"]


def test_dataset_split_with_max_images_ignores_listed_images_left_out(scene_dir: Path) -> None:
    (scene_dir / "test.txt").write_text("img_01.png\nimg_03.png\n")
    scene = load_colmap(str(scene_dir), eval_split="dataset", max_images=4)  # img_00, 03, 06, 09
    assert [f.name for f in scene.test] == ["img_03"]
    assert [f.name for f in scene.train] == ["img_00", "img_06", "img_09"]


def test_invalid_arguments_are_rejected(scene_dir: Path) -> None:
    with pytest.raises(ValueError, match="factor"):
        load_colmap(str(scene_dir), factor=3)
    with pytest.raises(ValueError, match="eval_split"):
        load_colmap(str(scene_dir), eval_split="every_7")


# ----------------------------------------------------------------------------------- factor and cache


def test_factor_without_prescaled_folder_resizes_and_scales_intrinsics(scene_dir: Path, _cache: Path) -> None:
    full = {f.name: f for f in _frames(load_colmap(str(scene_dir)))}
    for factor in (2, 4, 8):
        scene = load_colmap(str(scene_dir), factor=factor)
        for frame in _frames(scene):
            w, h = round(W / factor), round(H / factor)
            assert frame.image.shape == (h, w, 3)
            expected = full[frame.name].K.clone()
            expected[0, :] *= w / W
            expected[1, :] *= h / H
            expected[2, 2] = 1.0
            torch.testing.assert_close(frame.K, expected)
            torch.testing.assert_close(frame.viewmat, full[frame.name].viewmat)
            assert frame.source == f"resized 1/{factor}"  # what the first log line reports
        # Resizing really averages the source (not nearest-neighbour picking).
        frame = scene.train[0]
        mean_full = full[frame.name].image.float().mean((0, 1))
        torch.testing.assert_close(frame.image.float().mean((0, 1)), mean_full, atol=4.0, rtol=0)
    assert len(list((_cache / "images").glob("images_*.png"))) == 3 * NUM_IMAGES
    assert sorted(p.suffix for p in (_cache / "images").iterdir()) == [".png"] * 3 * NUM_IMAGES  # no temp files


def test_factor_uses_prescaled_folder(scene_dir: Path, _cache: Path) -> None:
    names = [f"img_{i:02d}.png" for i in range(NUM_IMAGES)]
    prescaled = _write_images(scene_dir / "images_2", names, (32, 24), seed=9)
    scene = load_colmap(str(scene_dir), factor=2)
    for frame in _frames(scene):
        np.testing.assert_array_equal(frame.image.numpy(), prescaled[frame.name + ".png"])
        np.testing.assert_allclose(frame.K.numpy(), [[29.0, 0, 15.65], [0, 30.5, 12.35], [0, 0, 1]], rtol=1e-6)
        assert frame.source == "images_2/"
    assert not (_cache / "images").exists()  # nothing to cache


def test_prescaled_folder_with_odd_sizes_scales_intrinsics_by_actual_ratio(tmp_path: Path) -> None:
    root, _, _ = _make_scene(tmp_path / "s", camera_model="PINHOLE", params=[58.0, 61.0, 31.3, 24.7])
    model = read_model(root / "sparse" / "0")
    model.cameras[1].width, model.cameras[1].height = 63, 47  # 63/2 = 31.5 -> 32 or 31, 47/2 -> 24 or 23
    write_model(model, root / "sparse" / "0")
    _write_images(root / "images", sorted(img.name for img in model.images.values()), (63, 47))
    _write_images(root / "images_2", sorted(img.name for img in model.images.values()), (31, 24))
    frame = load_colmap(str(root), factor=2).train[0]
    assert frame.image.shape == (24, 31, 3)
    np.testing.assert_allclose(frame.K[0].numpy(), [58.0 * 31 / 63, 0, 31.3 * 31 / 63], rtol=1e-6)
    np.testing.assert_allclose(frame.K[1].numpy(), [0, 61.0 * 24 / 47, 24.7 * 24 / 47], rtol=1e-6)


def test_prescaled_folder_with_wrong_sizes_is_an_error(scene_dir: Path) -> None:
    _write_images(scene_dir / "images_4", [f"img_{i:02d}.png" for i in range(NUM_IMAGES)], (20, 12))
    with pytest.raises(DatasetError, match=r"images_4/img_00\.png: image is 20x12, but its camera is 64x48"):
        load_colmap(str(scene_dir), factor=4)


def test_cache_is_invalidated_when_the_source_changes(scene_dir: Path, _cache: Path) -> None:
    before = load_colmap(str(scene_dir), factor=2, eval_split="none").train[0]
    Image.fromarray(np.zeros((H, W, 3), np.uint8)).save(scene_dir / "images" / "img_00.png")
    after = load_colmap(str(scene_dir), factor=2, eval_split="none").train[0]
    assert before.image.float().mean() > 50 and after.image.float().max() == 0
    assert len(list((_cache / "images").glob("*.png"))) == NUM_IMAGES + 1


def test_distorted_camera_is_undistorted_to_pinhole(tmp_path: Path) -> None:
    params = [58.0, 61.0, 31.3, 24.7, 0.08, 0.01, 0.002, -0.001]
    root, _, truth = _make_scene(tmp_path / "s", camera_model="OPENCV", params=params)
    scene = load_colmap(str(root), eval_split="none", factor=2)
    for frame in scene.train:
        assert frame.image.shape == (24, 32, 3)
        K = frame.K.numpy()
        assert K[0, 2] == pytest.approx(31.3 / 2) and K[1, 2] == pytest.approx(24.7 / 2)
        assert K[0, 0] > 58.0 / 2 and K[0, 0] / K[1, 1] == pytest.approx(58.0 / 61.0)  # zoomed in for k1 > 0
        assert frame.source == "resized 1/2, undistorted"
        np.testing.assert_allclose(frame.viewmat.numpy(), truth["viewmats"][frame.name + ".png"], atol=1e-6)


def test_keypoints_land_where_the_undistorted_frames_see_their_points(tmp_path: Path) -> None:
    params = [58.0, 61.0, 31.3, 24.7, 0.08, 0.01, 0.002, -0.001]
    model, _ = _synthetic_model(camera_model="OPENCV", params=params)
    K, dist = camera_intrinsics(model.cameras[1], "cameras.bin")
    for image in model.images.values():  # keypoints where the distorted camera saw the points
        camera = model.points.xyz @ image.viewmat()[:3, :3].T + image.viewmat()[:3, 3]  # [P, 3]
        x, y = distort(camera[:, 0] / camera[:, 2], camera[:, 1] / camera[:, 2], dist)
        image.xys[:] = np.stack([K[0, 0] * x + K[0, 2], K[1, 1] * y + K[1, 2]], axis=-1)
    root = tmp_path / "s"
    write_model(model, root / "sparse" / "0")
    _write_images(root / "images", sorted(image.name for image in model.images.values()))
    scene = load_colmap(str(root), eval_split="none", factor=2)
    for frame in scene.train:
        seen_at, seen = project_points(
            scene.points[scene.observed[frame.name]], frame.viewmat, frame.K, frame.camera_model
        )
        assert seen.all() and scene.keypoints[frame.name].shape == (40, 2)
        torch.testing.assert_close(scene.keypoints[frame.name], seen_at[:, :2], atol=2e-3, rtol=0)


def test_unusable_cache_root_only_costs_time(scene_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cached = load_colmap(str(scene_dir), factor=2)
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("the cache root cannot be created under a file")
    monkeypatch.setenv("GSRECON_CACHE", str(blocker / "cache"))
    uncached = load_colmap(str(scene_dir), factor=2)
    for a, b in zip(_frames(cached), _frames(uncached)):
        assert torch.equal(a.image, b.image) and torch.equal(a.K, b.K)
    assert blocker.read_text() == "the cache root cannot be created under a file"


def test_too_strong_distortion_names_the_image_and_camera(tmp_path: Path) -> None:
    root, _, _ = _make_scene(tmp_path / "s", camera_model="OPENCV", params=[58.0, 61.0, 31.3, 24.7, -1.0, 0, 0, 0])
    with pytest.raises(
        DatasetError, match=r"images/img_00\.png: cannot undistort the image of camera 1 of .*cameras\.bin: .*strong"
    ):
        load_colmap(str(root))


# ----------------------------------------------------------------------------------------- image files


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (np.array([[0, 255, 256], [4660, 65280, 65535]], np.uint16), [[0, 0, 1], [18, 255, 255]]),  # mode I;16
        (np.array([[0, 255, 256], [4660, 65280, 65535]], np.int32), [[0, 0, 1], [18, 255, 255]]),  # mode I
        (np.array([[0.0, 0.5, 1.0], [0.001, 0.999, 0.2]], np.float32), [[0, 128, 255], [0, 255, 51]]),  # mode F
    ],
)
def test_deep_greyscale_images_are_scaled_to_8_bits(tmp_path: Path, values: np.ndarray, expected: list) -> None:
    path = tmp_path / ("grey.png" if values.dtype == np.uint16 else "grey.tiff")
    Image.fromarray(values).save(path)
    pixels = read_image(path)
    assert pixels.dtype == np.uint8 and pixels.shape == (2, 3, 3)
    np.testing.assert_array_equal(pixels, np.repeat(np.array(expected, np.uint8)[..., None], 3, axis=-1))


def test_16_bit_png_with_a_transparent_value_gets_alpha(tmp_path: Path) -> None:
    Image.fromarray(np.array([[1000, 5000], [5000, 60000]], np.uint16)).save(tmp_path / "g.png", transparency=5000)
    pixels = read_image(tmp_path / "g.png")
    np.testing.assert_array_equal(pixels[..., 3], [[255, 0], [0, 255]])
    np.testing.assert_array_equal(pixels[..., 0], [[3, 19], [19, 234]])


def test_16_bit_scene_images_load_as_their_8_bit_version(scene_dir: Path) -> None:
    rng = np.random.default_rng(5)
    deep = rng.integers(0, 65536, (H, W), dtype=np.uint16)
    Image.fromarray(deep).save(scene_dir / "images" / "img_00.png")
    frame = next(f for f in load_colmap(str(scene_dir)).test if f.name == "img_00")
    np.testing.assert_array_equal(frame.image.numpy(), np.repeat((deep >> 8).astype(np.uint8)[..., None], 3, -1))


@pytest.mark.parametrize("values", [np.array([[-1, 7]], np.int32), np.array([[0.0, 1.5]], np.float32)])
def test_greyscale_images_out_of_range_name_the_file_and_mode(tmp_path: Path, values: np.ndarray) -> None:
    Image.fromarray(values).save(tmp_path / "odd.tiff")
    mode = "I" if values.dtype == np.int32 else "F"
    with pytest.raises(DatasetError, match=rf"odd\.tiff: cannot convert a mode {mode} greyscale image"):
        read_image(tmp_path / "odd.tiff")


def test_to_uint8_rounds_and_clips_floats_and_keeps_uint8() -> None:
    image = np.array([[[0.0, 0.5, 1.0], [-0.2, 1.3, 0.1]]], np.float32)  # [1, 2, 3]
    expected = [[[0, 128, 255], [0, 255, 26]]]
    np.testing.assert_array_equal(to_uint8(image), expected)
    np.testing.assert_array_equal(to_uint8(torch.from_numpy(image).requires_grad_()), expected)
    np.testing.assert_array_equal(to_uint8(torch.from_numpy(image).to(torch.bfloat16)), expected)
    as_bytes = np.array([[[1, 2, 3]]], np.uint8)
    assert to_uint8(as_bytes) is as_bytes
    with pytest.raises(ValueError, match="int64"):
        to_uint8(np.zeros((2, 2, 3), np.int64))


def test_write_png_creates_the_folder_and_round_trips(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, (5, 7, 4), dtype=np.uint8)
    write_png(tmp_path / "a" / "b" / "rgba.png", rgba)
    np.testing.assert_array_equal(read_image(tmp_path / "a" / "b" / "rgba.png"), rgba)
    write_png(tmp_path / "float.png", torch.full((3, 4, 3), 0.2))
    np.testing.assert_array_equal(read_image(tmp_path / "float.png"), np.full((3, 4, 3), 51))
    write_png(tmp_path / "float.png", torch.ones(3, 4, 1))  # replaces the file; [H, W, 1] is greyscale
    np.testing.assert_array_equal(read_image(tmp_path / "float.png"), np.full((3, 4, 3), 255))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "float.png"]  # no temporary files left


# ------------------------------------------------------------------------------------------- bad input


def test_missing_image_names_the_file(scene_dir: Path) -> None:
    (scene_dir / "images" / "img_03.png").unlink()
    with pytest.raises(
        DatasetError, match=r"images/img_03\.png: image file is missing \(referenced by .*images\.bin\)"
    ):
        load_colmap(str(scene_dir))


def test_corrupt_image_names_the_file(scene_dir: Path) -> None:
    (scene_dir / "images" / "img_03.png").write_bytes(b"not a png")
    with pytest.raises(DatasetError, match=r"img_03\.png: cannot read the image"):
        load_colmap(str(scene_dir))


def test_missing_model_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        load_colmap(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="no COLMAP model found"):
        load_colmap(str(tmp_path / "empty"))


def test_missing_model_file_is_an_error(scene_dir: Path) -> None:
    (scene_dir / "sparse" / "0" / "points3D.bin").unlink()
    with pytest.raises(DatasetError, match=r"points3D\.bin: missing"):
        load_colmap(str(scene_dir))


@pytest.mark.parametrize("stem", ["cameras", "images", "points3D"])
def test_truncated_bin_files_name_the_file(scene_dir: Path, stem: str) -> None:
    path = scene_dir / "sparse" / "0" / f"{stem}.bin"
    data = path.read_bytes()
    for cut in (3, 8, 20, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:cut])
        with pytest.raises(DatasetError, match=rf"{stem}\.bin: truncated or corrupt"):
            load_colmap(str(scene_dir))


@pytest.mark.parametrize("stem", ["cameras", "images", "points3D"])
def test_trailing_garbage_in_bin_files_is_an_error(scene_dir: Path, stem: str) -> None:
    path = scene_dir / "sparse" / "0" / f"{stem}.bin"
    path.write_bytes(path.read_bytes() + b"\x01\x02\x03")
    with pytest.raises(DatasetError, match=rf"{stem}\.bin: corrupt: 3 unexpected trailing bytes"):
        load_colmap(str(scene_dir))


def test_huge_point_count_is_an_error_not_a_memory_error(scene_dir: Path) -> None:
    path = scene_dir / "sparse" / "0" / "points3D.bin"
    path.write_bytes((2**60).to_bytes(8, "little") + path.read_bytes()[8:])
    with pytest.raises(DatasetError, match=r"points3D\.bin: truncated or corrupt"):
        load_colmap(str(scene_dir))


def test_unknown_camera_model_id_in_bin(scene_dir: Path) -> None:
    path = scene_dir / "sparse" / "0" / "cameras.bin"
    data = bytearray(path.read_bytes())
    data[12:16] = (99).to_bytes(4, "little")  # after num_cameras (8) and camera_id (4)
    path.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"cameras\.bin: camera 1 has unknown camera model id 99"):
        load_colmap(str(scene_dir))


def test_unknown_camera_model_name_in_txt(tmp_path: Path) -> None:
    root, _, _ = _make_scene(tmp_path / "s", ".txt")
    path = root / "sparse" / "0" / "cameras.txt"
    path.write_text(path.read_text().replace("PINHOLE", "WEIRD"))
    with pytest.raises(DatasetError, match=r"cameras\.txt:3: camera 1 has unknown camera model 'WEIRD'"):
        load_colmap(str(root))


def test_malformed_txt_line_names_file_and_line(tmp_path: Path) -> None:
    root, _, _ = _make_scene(tmp_path / "s", ".txt")
    path = root / "sparse" / "0" / "points3D.txt"
    lines = path.read_text().splitlines()
    lines[4] = lines[4].replace(lines[4].split()[1], "x1.5", 1)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=r"points3D\.txt:5: cannot parse a point"):
        load_colmap(str(root))


@pytest.mark.parametrize("cut", [1, 2, 9])
def test_images_txt_line_without_name_or_fields_names_file_and_line(tmp_path: Path, cut: int) -> None:
    root, _, _ = _make_scene(tmp_path / "s", ".txt")
    path = root / "sparse" / "0" / "images.txt"
    lines = path.read_text().splitlines()
    lines[3] = " ".join(lines[3].split()[:-cut])  # the first image's line, without its name (and more)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=r"images\.txt:4: cannot parse an image \(IMAGE_ID QW"):
        load_colmap(str(root))


def test_unsupported_camera_model_names_model_and_camera(tmp_path: Path) -> None:
    root, _, _ = _make_scene(tmp_path / "s", camera_model="THIN_PRISM_FISHEYE", params=[58, 61, 31, 24] + [0.0] * 8)
    with pytest.raises(DatasetError, match=r"cameras\.bin: camera 1 uses the THIN_PRISM_FISHEYE camera model"):
        load_colmap(str(root))


def test_image_size_disagreeing_with_camera(scene_dir: Path) -> None:
    Image.fromarray(np.zeros((H, W + 2, 3), np.uint8)).save(scene_dir / "images" / "img_04.png")
    with pytest.raises(DatasetError, match=r"img_04\.png: image is 66x48, but its camera says 64x48"):
        load_colmap(str(scene_dir))


@pytest.mark.parametrize("ext", [".bin", ".txt"])
@pytest.mark.parametrize(
    ("camera_model", "params", "message"),
    [
        ("PINHOLE", [0.0, 61.0, 31.3, 24.7], "'fx' must be a finite number > 0, got 0.0"),
        ("PINHOLE", [58.0, -61.0, 31.3, 24.7], "'fy' must be a finite number > 0, got -61.0"),
        ("PINHOLE", [58.0, 61.0, float("nan"), 24.7], "'cx' must be a finite number > 0, got nan"),
        ("PINHOLE", [58.0, 61.0, 31.3, float("inf")], "'cy' must be a finite number > 0, got inf"),
        ("SIMPLE_PINHOLE", [-58.0, 31.3, 24.7], "'f' must be a finite number > 0, got -58.0"),
        ("SIMPLE_RADIAL", [58.0, 0.0, 24.7, 0.1], "'cx' must be a finite number > 0, got 0.0"),
        ("OPENCV", [58.0, 61.0, 31.3, 24.7, float("nan"), 0, 0, 0], "'k1' must be a finite number, got nan"),
        ("OPENCV_FISHEYE", [58.0, float("-inf"), 31.3, 24.7, 0, 0, 0, 0], "'fy' must be a finite number > 0"),
    ],
)
def test_bad_intrinsics_name_the_file_camera_and_value(
    tmp_path: Path, ext: str, camera_model: str, params: list[float], message: str
) -> None:
    root, _, _ = _make_scene(tmp_path / "s", ext, camera_model=camera_model, params=params)
    with pytest.raises(DatasetError, match=rf"cameras\{ext}: camera 1 \({camera_model}\): {message}"):
        load_colmap(str(root))


@pytest.mark.parametrize(
    ("ext", "name"),
    [(ext, name) for ext in (".bin", ".txt") for name in ("../x.png", "sub/../../x.png", "/etc/passwd")]
    + [(".bin", "")],  # images.txt cannot hold an empty name
)
def test_image_names_leaving_the_images_folder_are_refused(tmp_path: Path, ext: str, name: str) -> None:
    root, model, _ = _make_scene(tmp_path / "s", ext)
    model.images[3].name = name
    write_model(model, root / "sparse" / "0", ext)
    with pytest.raises(DatasetError, match=rf"images\{ext}: image 3 has the name {re.escape(repr(name))}"):
        load_colmap(str(root))


@pytest.mark.parametrize("ext", [".bin", ".txt"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_points_are_refused(tmp_path: Path, ext: str, value: float) -> None:
    root, model, _ = _make_scene(tmp_path / "s", ext)
    model.points.xyz[5, 1] = value
    write_model(model, root / "sparse" / "0", ext)
    with pytest.raises(DatasetError, match=rf"points3D\{ext}: point 5 has a non-finite position \[.*{value}.*\]"):
        load_colmap(str(root))


def test_empty_point_cloud_loads_for_random_init(tmp_path: Path) -> None:
    root, model, _ = _make_scene(tmp_path / "s")
    model.points = ColmapPoints.empty()
    write_model(model, root / "sparse" / "0")
    scene = load_colmap(str(root))
    assert scene.points.shape == (0, 3) and scene.colors.shape == (0, 3) and len(scene.train) == 8
    gaussians = GaussianModel.from_scene(GaussianModel.Config(init="random", init_num_points=50), scene)
    assert gaussians.num_gaussians == 50
    with pytest.raises(ValueError, match=r"model.init is 'sfm' but the dataset has no points; use model.init=random"):
        GaussianModel.from_scene(GaussianModel.Config(init="sfm"), scene)


def test_image_with_undefined_camera(tmp_path: Path) -> None:
    root, model, _ = _make_scene(tmp_path / "s", ".txt")
    model.images[2].camera_id = 5
    write_model(model, root / "sparse" / "0", ".txt")
    with pytest.raises(DatasetError, match=r"images\.txt: image 2 \(img_08\.png\) uses camera 5"):
        load_colmap(str(root))


# ------------------------------------------------------------------------------------------ real scene


def test_statuette_scene(shared_data: Path) -> None:
    statuette = shared_data / "statuette_colmap"
    model = read_model(statuette / "sparse" / "0")
    scene = load_colmap(str(statuette), factor=4)
    assert len(scene.train) == 20 and len(scene.test) == 3
    assert {c.model for c in model.cameras.values()} == {"PINHOLE"}
    assert scene.points.shape == (len(model.points), 3) and len(model.points) > 0
    assert scene.colors.min() >= 0 and scene.colors.max() <= 1
    by_name = {img.name.rsplit(".", 1)[0]: img for img in model.images.values()}
    for frame in _frames(scene):
        camera = model.cameras[by_name[frame.name].camera_id]
        assert frame.image.shape == (round(camera.height / 4), round(camera.width / 4), 3)
        assert frame.K[0, 2].item() == pytest.approx(camera.params[2] * frame.width / camera.width)
    # Most SfM points lie in front of every camera that sees the scene.
    frame = scene.train[0]
    depth = scene.points @ frame.viewmat[:3, :3].T + frame.viewmat[:3, 3]
    assert (depth[:, 2] > 0).float().mean() > 0.9
