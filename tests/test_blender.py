"""transforms.json reader: nerf_synthetic and instant-ngp/nerfstudio flavours, OpenGL -> OpenCV, bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gsrecon.data.errors import DatasetError
from gsrecon.data.readers.transforms import load_transforms

torch.set_num_threads(1)

SIZE = 40  # nerf_synthetic-style images are SIZE x SIZE
ANGLE_X = 0.69111  # nerf_synthetic's camera_angle_x


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GSRECON_CACHE", str(tmp_path / "cache"))


def _c2w_gl(eye: list[float], target: list[float] = (0.0, 0.0, 0.0)) -> np.ndarray:
    """OpenGL camera-to-world [4, 4] (camera looks along its -z, y up) at ``eye`` looking at ``target``."""
    eye, target = np.asarray(eye, float), np.asarray(target, float)
    back = (eye - target) / np.linalg.norm(eye - target)
    right = np.cross([0.0, 0.0, 1.0], back)
    if np.linalg.norm(right) < 1e-9:
        right = np.array([1.0, 0.0, 0.0])
    right /= np.linalg.norm(right)
    up = np.cross(back, right)
    c2w = np.eye(4)
    c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3] = right, up, back, eye
    return c2w


def _save_rgba(path: Path, seed: int, size: tuple[int, int] = (SIZE, SIZE)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1], size[0], 4), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
    return pixels


def _write_synthetic(root: Path) -> dict[str, np.ndarray]:
    """nerf_synthetic layout: 5 train, 3 test, 1 val frame; file paths without extension."""
    pixels = {}
    for split, count in (("train", 5), ("test", 3), ("val", 1)):
        frames = []
        for i in range(count):
            angle = 2 * math.pi * i / count + {"train": 0.0, "test": 0.3, "val": 0.6}[split]
            eye = [3.0 * math.cos(angle), 3.0 * math.sin(angle), 1.0]
            frames.append({"file_path": f"./{split}/r_{i}", "rotation": 0.0, "transform_matrix": _c2w_gl(eye).tolist()})
            pixels[f"{split}_r_{i}"] = _save_rgba(root / split / f"r_{i}.png", seed=len(pixels))
        (root / f"transforms_{split}.json").write_text(json.dumps({"camera_angle_x": ANGLE_X, "frames": frames}))
    return pixels


def _write_ngp(root: Path, **global_fields) -> dict:
    """instant-ngp/nerfstudio layout: global intrinsics, one frame overriding them, one path without extension."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    fields = {"fl_x": 50.0, "fl_y": 52.0, "cx": 30.5, "cy": 19.25, "w": 64, "h": 40} | global_fields
    frames = []
    for i in range(6):
        name = f"frame_{i:05d}"
        Image.fromarray(np.full((40, 64, 3), 20 * i, np.uint8)).save(root / "images" / f"{name}.jpg")
        c2w = _c2w_gl([0.0, -4.0 + i * 0.1, 0.5])
        frame = {"file_path": f"images/{name}" + ("" if i == 1 else ".jpg"), "transform_matrix": c2w.tolist()}
        if i == 2:
            frame |= {"fl_x": 70.0, "cx": 33.0}
        frames.append(frame)
    content = fields | {"frames": frames}
    (root / "transforms.json").write_text(json.dumps(content))
    return content


def _project(frame, point: list[float]) -> np.ndarray:
    cam = frame.viewmat[:3, :3].double() @ torch.tensor(point, dtype=torch.float64) + frame.viewmat[:3, 3].double()
    uv = frame.K.double() @ cam
    assert cam[2] > 0, "point must be in front of the camera (OpenCV: +z forward)"
    return (uv[:2] / uv[2]).numpy()


def _frames(scene) -> dict:
    return {f.name: f for f in scene.train + scene.test}


# ------------------------------------------------------------------------------------- nerf_synthetic


def test_synthetic_dataset_split_keeps_alpha_and_ignores_val(tmp_path: Path) -> None:
    pixels = _write_synthetic(tmp_path)
    scene = load_transforms(str(tmp_path), eval_split="dataset")
    assert [f.name for f in scene.train] == [f"train_r_{i}" for i in range(5)]
    assert [f.name for f in scene.test] == [f"test_r_{i}" for i in range(3)]
    for name, frame in _frames(scene).items():
        assert frame.image.shape == (SIZE, SIZE, 4) and frame.image.dtype == torch.uint8
        np.testing.assert_array_equal(frame.image.numpy(), pixels[name])
        focal = 0.5 * SIZE / math.tan(0.5 * ANGLE_X)
        torch.testing.assert_close(frame.K, torch.tensor([[focal, 0, 20.0], [0, focal, 20.0], [0, 0, 1]]))
    assert scene.points.shape == (0, 3) and scene.colors.shape == (0, 3)
    assert scene.extent == pytest.approx(3.0 * 1.1, rel=0.1)


def test_synthetic_every_8_and_none_never_train_on_official_test_images(tmp_path: Path) -> None:
    pixels = _write_synthetic(tmp_path)
    train_pixels = [pixels[f"train_r_{i}"] for i in range(5)]
    scene = load_transforms(str(tmp_path))
    assert [f.name for f in scene.test] == ["r_0"] and [f.name for f in scene.train] == ["r_1", "r_2", "r_3", "r_4"]
    for frame in scene.train + scene.test:
        np.testing.assert_array_equal(frame.image.numpy(), train_pixels[int(frame.name[2:])])
    scene = load_transforms(str(tmp_path), eval_split="none")
    assert [f.name for f in scene.train] == [f"r_{i}" for i in range(5)] and scene.test == []
    assert sorted(_frames(load_transforms(str(tmp_path), max_images=3))) == ["r_0", "r_2", "r_4"]
    (tmp_path / "transforms_test.json").unlink()  # not needed
    assert len(load_transforms(str(tmp_path)).train) == 4


def test_opengl_camera_to_world_becomes_opencv_world_to_camera(tmp_path: Path) -> None:
    """A camera at (0, -4, 0) looking at the origin with z up: known points land on known pixels."""
    (tmp_path / "train").mkdir()
    _save_rgba(tmp_path / "train" / "r_0.png", 0)
    c2w = np.array([[1, 0, 0, 0], [0, 0, -1, -4], [0, 1, 0, 0], [0, 0, 0, 1]], float)  # OpenGL: looks along +y
    content = {
        "camera_angle_x": 2 * math.atan(0.5),
        "frames": [{"file_path": "train/r_0", "transform_matrix": c2w.tolist()}],
    }
    (tmp_path / "transforms_train.json").write_text(json.dumps(content))
    frame = load_transforms(str(tmp_path), eval_split="none").train[0]  # focal = SIZE, principal point (20, 20)
    np.testing.assert_allclose(_project(frame, [0, 0, 0]), [20, 20], atol=1e-5)
    np.testing.assert_allclose(_project(frame, [1, 0, 0]), [20 + SIZE / 4, 20], atol=1e-5)  # world +x: right
    np.testing.assert_allclose(_project(frame, [0, 0, 1]), [20, 20 - SIZE / 4], atol=1e-5)  # world up: image up
    np.testing.assert_allclose(frame.camera_center.numpy(), [0, -4, 0], atol=1e-6)


def test_synthetic_factor_resizes_rgba_and_scales_intrinsics(tmp_path: Path) -> None:
    pixels = _write_synthetic(tmp_path)
    full = _frames(load_transforms(str(tmp_path), eval_split="dataset"))
    half = _frames(load_transforms(str(tmp_path), factor=2, eval_split="dataset"))
    for name, frame in half.items():
        assert frame.image.shape == (SIZE // 2, SIZE // 2, 4)
        torch.testing.assert_close(frame.K[:2], full[name].K[:2] / 2)
        assert frame.image[..., 3].float().mean().item() == pytest.approx(pixels[name][..., 3].mean(), abs=4)


# ------------------------------------------------------------------------------- instant-ngp / nerfstudio


def test_ngp_intrinsics_per_frame_override_and_paths_without_extension(tmp_path: Path) -> None:
    _write_ngp(tmp_path)
    scene = load_transforms(str(tmp_path), eval_split="none")
    frames = _frames(scene)
    assert sorted(frames) == [f"frame_{i:05d}" for i in range(6)]  # the shared images/ folder is dropped
    torch.testing.assert_close(frames["frame_00000"].K, torch.tensor([[50.0, 0, 30.5], [0, 52.0, 19.25], [0, 0, 1]]))
    torch.testing.assert_close(frames["frame_00002"].K, torch.tensor([[70.0, 0, 33.0], [0, 52.0, 19.25], [0, 0, 1]]))
    assert frames["frame_00001"].image.shape == (40, 64, 3)
    assert frames["frame_00003"].image.float().mean().item() == pytest.approx(60, abs=2)
    # The origin is straight ahead of every camera: it lands on the principal point.
    for frame in frames.values():
        np.testing.assert_allclose(_project(frame, [0, 0, 0]), frame.K[:2, 2].numpy(), atol=1e-4)


def test_ngp_camera_angle_x_and_default_principal_point(tmp_path: Path) -> None:
    content = _write_ngp(tmp_path)
    for key in ("fl_x", "fl_y", "cx", "cy", "w", "h"):
        content.pop(key)
    content["camera_angle_x"] = 2 * math.atan(0.5)
    content["frames"][2] = {k: v for k, v in content["frames"][2].items() if k not in ("fl_x", "cx")}
    (tmp_path / "transforms.json").write_text(json.dumps(content))
    frame = load_transforms(str(tmp_path), eval_split="none").train[0]
    torch.testing.assert_close(frame.K, torch.tensor([[64.0, 0, 32.0], [0, 64.0, 20.0], [0, 0, 1]]))


def test_ngp_distortion_is_undistorted(tmp_path: Path) -> None:
    _write_ngp(tmp_path, k1=0.1, k2=0.01, p1=0.001, p2=-0.002)
    for frame in load_transforms(str(tmp_path), eval_split="none").train:
        assert frame.image.shape == (40, 64, 3)
        assert frame.K[0, 2].item() == pytest.approx(33.0 if frame.name == "frame_00002" else 30.5)
        assert frame.K[1, 2].item() == pytest.approx(19.25)
        assert frame.K[0, 0].item() > (70.0 if frame.name == "frame_00002" else 50.0)  # k1 > 0: zoom in


def test_ngp_factor_uses_images_f_folder(tmp_path: Path) -> None:
    _write_ngp(tmp_path)
    (tmp_path / "images_2").mkdir()
    for i in range(6):
        Image.fromarray(np.full((20, 32, 3), 200, np.uint8)).save(tmp_path / "images_2" / f"frame_{i:05d}.jpg")
    frames = _frames(load_transforms(str(tmp_path), factor=2, eval_split="none"))
    assert all(f.image.shape == (20, 32, 3) and f.image.float().mean() > 190 for f in frames.values())
    torch.testing.assert_close(frames["frame_00000"].K, torch.tensor([[25.0, 0, 15.25], [0, 26.0, 9.625], [0, 0, 1]]))


def test_ngp_dataset_split_needs_filenames(tmp_path: Path) -> None:
    content = _write_ngp(tmp_path)
    with pytest.raises(DatasetError, match=r"transforms\.json: eval_split 'dataset' needs 'test_filenames'"):
        load_transforms(str(tmp_path), eval_split="dataset")
    # Frame 1's file_path has no extension; the list may add one, and './'.
    content["test_filenames"] = ["images/frame_00004.jpg", "./images/frame_00001.jpg", "images/frame_00005"]
    (tmp_path / "transforms.json").write_text(json.dumps(content))
    scene = load_transforms(str(tmp_path), eval_split="dataset")
    assert [f.name for f in scene.test] == ["frame_00001", "frame_00004", "frame_00005"] and len(scene.train) == 3


def test_ngp_train_filenames_make_the_rest_test(tmp_path: Path) -> None:
    content = _write_ngp(tmp_path)
    content["train_filenames"] = [f"images/frame_{i:05d}.jpg" for i in range(5)]
    (tmp_path / "transforms.json").write_text(json.dumps(content))
    scene = load_transforms(str(tmp_path), eval_split="dataset", max_images=3)  # frames 0, 2 (or 3), 5
    assert [f.name for f in scene.test] == ["frame_00005"] and len(scene.train) == 2


@pytest.mark.parametrize("key", ["test_filenames", "train_filenames"])
def test_ngp_filenames_that_match_no_frame_are_an_error(tmp_path: Path, key: str) -> None:
    content = _write_ngp(tmp_path)
    content[key] = ["images/frame_00004.jpg", "frame_00002.jpg", "images/frame_00003.png", "rgb/frame_00001.jpg"]
    (tmp_path / "transforms.json").write_text(json.dumps(content))
    with pytest.raises(
        DatasetError,
        match=rf"transforms\.json '{key}': 2 of 4 entries name no image of the scene: 'frame_00002\.jpg', "
        r"'rgb/frame_00001\.jpg' \(its images are named like 'images/frame_00000\.jpg'\)",
    ):
        load_transforms(str(tmp_path), eval_split="dataset")
    content[key] = "images/frame_00004.jpg"
    (tmp_path / "transforms.json").write_text(json.dumps(content))
    with pytest.raises(DatasetError, match=rf"transforms\.json: '{key}' must be a list of image file paths"):
        load_transforms(str(tmp_path), eval_split="dataset")


def test_ngp_too_strong_distortion_names_the_image_and_frame(tmp_path: Path) -> None:
    _write_ngp(tmp_path, k1=-1.0)
    with pytest.raises(
        DatasetError,
        match=r"frame_00000\.jpg: cannot undistort the image of frame 'images/frame_00000\.jpg' of .*transforms\.json",
    ):
        load_transforms(str(tmp_path), eval_split="none")


# ------------------------------------------------------------------------------------------- bad input


def test_no_intrinsics(tmp_path: Path) -> None:
    content = _write_ngp(tmp_path)
    content.pop("fl_x")
    (tmp_path / "transforms.json").write_text(json.dumps(content))
    with pytest.raises(DatasetError, match=r"transforms\.json: frame 'images/frame_00000\.jpg' has no intrinsics"):
        load_transforms(str(tmp_path))


def test_missing_image(tmp_path: Path) -> None:
    _write_synthetic(tmp_path)
    (tmp_path / "test" / "r_1.png").unlink()
    with pytest.raises(DatasetError, match=r"test/r_1: image file is missing \(referenced by .*transforms_test\.json"):
        load_transforms(str(tmp_path), eval_split="dataset")


def test_invalid_json_and_missing_keys(tmp_path: Path) -> None:
    _write_synthetic(tmp_path)
    (tmp_path / "transforms_test.json").write_text('{"frames": [}')
    with pytest.raises(DatasetError, match=r"transforms_test\.json: invalid JSON at line 1"):
        load_transforms(str(tmp_path), eval_split="dataset")
    (tmp_path / "transforms_test.json").write_text('{"frames": [{"file_path": "./test/r_0"}]}')
    with pytest.raises(DatasetError, match=r"transforms_test\.json: frame 0 needs 'file_path' and 'transform_matrix'"):
        load_transforms(str(tmp_path), eval_split="dataset")
    (tmp_path / "transforms_test.json").write_text(
        '{"camera_angle_x": 0.7, "frames": [{"file_path": "./test/r_0", "transform_matrix": [[1, 2], [3, 4]]}]}'
    )
    with pytest.raises(DatasetError, match=r"transforms_test\.json: frame './test/r_0': 'transform_matrix' must be"):
        load_transforms(str(tmp_path), eval_split="dataset")
    (tmp_path / "transforms_test.json").unlink()
    with pytest.raises(DatasetError, match=r"transforms_test\.json: missing, and eval_split 'dataset' needs it"):
        load_transforms(str(tmp_path), eval_split="dataset")


def test_no_transforms_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"no transforms_train\.json or transforms\.json"):
        load_transforms(str(tmp_path))


def test_equirectangular_is_rejected(tmp_path: Path) -> None:
    _write_ngp(tmp_path, camera_model="EQUIRECTANGULAR")
    with pytest.raises(DatasetError, match=r"transforms\.json: frame .* uses the EQUIRECTANGULAR camera model"):
        load_transforms(str(tmp_path))


def test_no_frames(tmp_path: Path) -> None:
    (tmp_path / "transforms.json").write_text(json.dumps({"fl_x": 50.0, "frames": []}))
    with pytest.raises(DatasetError, match="list no frames"):
        load_transforms(str(tmp_path))


def test_image_size_disagreeing_with_w_h(tmp_path: Path) -> None:
    _write_ngp(tmp_path, w=80)
    with pytest.raises(DatasetError, match=r"frame_00000\.jpg: image is 64x40, but its camera says 80x40"):
        load_transforms(str(tmp_path))


def test_non_numeric_intrinsic(tmp_path: Path) -> None:
    _write_ngp(tmp_path, fl_y="52")
    with pytest.raises(DatasetError, match=r"transforms\.json: frame .*: 'fl_y' must be a finite number > 0, got '52'"):
        load_transforms(str(tmp_path))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"fl_x": 0.0}, "'fl_x' must be a finite number > 0, got 0.0"),
        ({"fl_y": -52.0}, "'fl_y' must be a finite number > 0, got -52.0"),
        ({"cx": -1.0}, "'cx' must be a finite number > 0, got -1.0"),
        ({"w": 0}, "'w' must be a finite number > 0, got 0"),
        ({"fl_x": None, "camera_angle_x": 0.0}, "'camera_angle_x' must be a finite number > 0, got 0.0"),
        (
            {"fl_x": None, "camera_angle_x": 50.0},
            r"'camera_angle_x' must be below pi \(180 degrees, in radians\), got 50.0",
        ),
        ({"fl_y": None, "camera_angle_y": -0.5}, "'camera_angle_y' must be a finite number > 0, got -0.5"),
    ],
)
def test_bad_intrinsics_name_the_file_frame_and_key(tmp_path: Path, fields: dict, message: str) -> None:
    _write_ngp(tmp_path, **fields)
    with pytest.raises(DatasetError, match=rf"transforms\.json: frame 'images/frame_00000\.jpg': {message}"):
        load_transforms(str(tmp_path))


def test_bad_per_frame_focal_names_that_frame(tmp_path: Path) -> None:
    content = _write_ngp(tmp_path)
    content["frames"][3]["fl_x"] = -70.0
    (tmp_path / "transforms.json").write_text(json.dumps(content))
    with pytest.raises(
        DatasetError, match=r"transforms\.json: frame 'images/frame_00003\.jpg': 'fl_x' must be a finite number > 0"
    ):
        load_transforms(str(tmp_path))


@pytest.mark.parametrize(
    ("row", "col", "value", "shown"),
    [
        (0, 3, float("nan"), "nan"),
        (1, 1, float("inf"), "inf"),
        (slice(0, 3), 0, 0.0, r"\[\[0\.0, "),  # a singular rotation
        (3, slice(None), 0.0, r"\[0\.0, 0\.0, 0\.0, 0\.0\]\]"),  # a singular 4x4 with an invertible rotation
    ],
)
def test_non_finite_or_singular_transform_matrix_names_the_file_frame_and_value(
    tmp_path: Path, row, col, value: float, shown: str
) -> None:
    content = _write_ngp(tmp_path)
    matrix = np.array(content["frames"][4]["transform_matrix"])
    matrix[row, col] = value
    content["frames"][4]["transform_matrix"] = matrix.tolist()
    (tmp_path / "transforms.json").write_text(json.dumps(content))
    with pytest.raises(
        DatasetError,
        match=rf"transforms\.json: frame 'images/frame_00004\.jpg': 'transform_matrix' must be a finite, invertible "
        rf"4x4 \(or 3x4\) matrix with last row \[0, 0, 0, 1\], got .*{shown}",
    ):
        load_transforms(str(tmp_path))


def test_ngp_ply_file_path_gives_the_starting_points(tmp_path: Path) -> None:
    """nerfstudio's exports name their SfM cloud in ``ply_file_path``: it becomes the scene's points."""
    from plyfile import PlyData, PlyElement

    vertex = np.array(
        [(0.1, 0.2, 0.3, 255, 0, 0), (-1.0, 0.5, 2.0, 0, 128, 255)],
        dtype=[("x", "f4"), ("y", "f4"), ("z", "f4"), ("red", "u1"), ("green", "u1"), ("blue", "u1")],
    )
    PlyData([PlyElement.describe(vertex, "vertex")]).write(str(tmp_path / "sparse_pc.ply"))
    _write_ngp(tmp_path, ply_file_path="sparse_pc.ply")
    scene = load_transforms(str(tmp_path), eval_split="none")
    torch.testing.assert_close(scene.points, torch.tensor([[0.1, 0.2, 0.3], [-1.0, 0.5, 2.0]]))
    torch.testing.assert_close(scene.colors, torch.tensor([[1.0, 0.0, 0.0], [0.0, 128 / 255, 1.0]]))
    _write_ngp(tmp_path / "plain")
    assert load_transforms(str(tmp_path / "plain")).points.shape == (0, 3)

    _write_ngp(tmp_path, ply_file_path="missing.ply")
    with pytest.raises(
        DatasetError, match=r"transforms\.json: 'ply_file_path' 'missing\.ply': .*missing\.ply: no such file"
    ):
        load_transforms(str(tmp_path))
