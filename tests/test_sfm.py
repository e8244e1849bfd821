"""Structure from motion with pycolmap on raycast renders of a richly textured box-on-a-floor scene."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gsrecon.data.errors import DatasetError
from gsrecon.data.prepare.sfm import run_sfm
from gsrecon.data.readers.colmap import load_colmap

needs_pycolmap = pytest.mark.skipif(importlib.util.find_spec("pycolmap") is None, reason="pycolmap not installed")

torch.set_num_threads(1)

W, H, FOCAL = 320, 240, 260.0
NUM_VIEWS = 12
BOX_MIN, BOX_MAX = np.array([-0.7, -0.7, 0.0]), np.array([0.7, 0.7, 1.2])
TARGET = np.array([0.0, 0.0, 0.4])


def _value_noise(a: np.ndarray, b: np.ndarray, seed: int) -> np.ndarray:
    """Multi-octave value noise in [0, 1] of surface coordinates a, b in [-4, 4] (same shapes)."""
    rng = np.random.default_rng(seed)
    total = np.zeros_like(a)
    for cells_per_unit, weight in ((2, 0.35), (4, 0.3), (8, 0.2), (16, 0.15)):
        grid = rng.uniform(0.0, 1.0, (8 * cells_per_unit + 2, 8 * cells_per_unit + 2))
        ga, gb = (a + 4.0) * cells_per_unit, (b + 4.0) * cells_per_unit
        i, j = np.floor(ga).astype(int), np.floor(gb).astype(int)
        fa, fb = ga - i, gb - j
        total += weight * (
            (grid[i, j] * (1 - fa) + grid[i + 1, j] * fa) * (1 - fb)
            + (grid[i, j + 1] * (1 - fa) + grid[i + 1, j + 1] * fa) * fb
        )
    return total


def _render(eye: np.ndarray, target: np.ndarray, width: int = W, height: int = H, focal: float = FOCAL) -> np.ndarray:
    """Raycast a noise-textured box on a noise-textured floor from ``eye`` towards ``target``: uint8 [H, W, 3]."""
    forward = (target - eye) / np.linalg.norm(target - eye)
    right = np.cross(forward, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right)
    down = np.cross(forward, right)
    u, v = np.meshgrid(np.arange(width) + 0.5 - width / 2, np.arange(height) + 0.5 - height / 2)
    dirs = (u[..., None] * right + v[..., None] * down) / focal + forward  # [H, W, 3]
    with np.errstate(divide="ignore", invalid="ignore"):
        t_floor = np.where(dirs[..., 2] < 0, -eye[2] / dirs[..., 2], np.inf)  # [H, W], plane z = 0
        t0, t1 = (BOX_MIN - eye) / dirs, (BOX_MAX - eye) / dirs  # [H, W, 3], slab test
    near, far = np.minimum(t0, t1), np.maximum(t0, t1)
    t_box = near.max(-1)
    t_box = np.where((t_box <= far.min(-1)) & (t_box > 0), t_box, np.inf)
    points = eye + np.minimum(t_floor, t_box).clip(max=1e3)[..., None] * dirs  # [H, W, 3]
    floor = (t_floor < t_box) & (np.abs(points[..., :2]).max(-1) < 3.9)
    surfaces = [(floor, 2)] + [((t_box < t_floor) & (near.argmax(-1) == ax), ax) for ax in range(3)]
    image = np.full((height, width, 3), 0.5)  # the sky
    for index, (mask, normal_axis) in enumerate(surfaces):
        a, b = (points[mask][:, k] for k in range(3) if k != normal_axis)
        for channel in range(3):
            image[mask, channel] = _value_noise(a, b, seed=3 * index + channel)
    return (image * 255).astype(np.uint8)


def _eyes() -> list[np.ndarray]:
    """Camera positions on a 90-degree arc around the box."""
    angles = np.deg2rad(np.linspace(-45, 45, NUM_VIEWS))
    return [np.array([4.0 * np.sin(a), -4.0 * np.cos(a), 2.2]) for a in angles]


def _write_views(folder: Path) -> None:
    folder.mkdir(parents=True)
    for i, eye in enumerate(_eyes()):
        Image.fromarray(_render(eye, TARGET)).save(folder / f"view_{i:02d}.png")


@pytest.mark.slow  # 4 s on a quiet 2-core machine: CI's slow run (the default run stays under 5 min)
@needs_pycolmap
def test_sfm_reconstructs_synthetic_views_and_load_colmap_reads_them(tmp_path: Path) -> None:
    _write_views(tmp_path / "photos")
    stages: list[str] = []
    report = run_sfm(
        str(tmp_path / "photos"), str(tmp_path / "scene"), use_gpu=False, on_stage=lambda name, _: stages.append(name)
    )
    assert stages == ["features", "matching", "mapping", "undistortion"]
    assert report.num_images == NUM_VIEWS
    assert report.num_registered >= 3 and report.num_points > 100
    assert report.num_registered + len(report.unregistered) == NUM_VIEWS
    assert report.num_cameras == 1  # photos of one size share one camera
    assert (tmp_path / "scene" / "sparse" / "0" / "cameras.bin").is_file()

    scene = load_colmap(str(report.scene_dir), eval_split="none")
    assert len(scene.train) == report.num_registered
    assert scene.points.shape == (report.num_points, 3)
    # Undistorted output: pinhole, with a focal length close to the true one.
    for frame in scene.train:
        assert frame.image.shape[2] == 3
        assert 0.85 * FOCAL < frame.K[0, 0].item() < 1.15 * FOCAL
        assert 0.85 * FOCAL < frame.K[1, 1].item() < 1.15 * FOCAL
    # Camera centres match the true ones up to a similarity: compare scale-normalised pairwise distances.
    true_centers = {f"view_{i:02d}": eye for i, eye in enumerate(_eyes())}
    names = [f.name for f in scene.train]
    est = torch.stack([f.camera_center for f in scene.train]).double().numpy()  # [R, 3]
    ref = np.stack([true_centers[name] for name in names])  # [R, 3]
    d_est = np.linalg.norm(est[:, None] - est[None], axis=-1)
    d_ref = np.linalg.norm(ref[:, None] - ref[None], axis=-1)
    np.testing.assert_allclose(d_est / d_est.max(), d_ref / d_ref.max(), atol=0.03)


SMALL_W, SMALL_H, SMALL_FOCAL = 256, 200, 230.0  # a second "device": other size, aspect and focal length


@pytest.mark.slow  # 4 s on a quiet 2-core machine: CI's slow run (the default run stays under 5 min)
@needs_pycolmap
def test_photos_of_two_sizes_get_one_camera_per_size_and_pycolmap_stays_quiet(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import pycolmap

    photos = tmp_path / "photos"
    photos.mkdir()
    focals = {}
    for i, eye in enumerate(_eyes()):
        size = (W, H, FOCAL) if i % 2 == 0 else (SMALL_W, SMALL_H, SMALL_FOCAL)
        Image.fromarray(_render(eye, TARGET, *size)).save(photos / f"view_{i:02d}.png")
        focals[f"view_{i:02d}"] = size[2]
    level = pycolmap.logging.minloglevel
    capfd.readouterr()
    report = run_sfm(str(photos), str(tmp_path / "scene"), use_gpu=False)
    logged = capfd.readouterr()
    assert report.num_registered >= NUM_VIEWS - 2 and report.num_cameras == 2
    assert len((logged.out + logged.err).splitlines()) < 5  # not pycolmap's hundreds of progress lines
    assert pycolmap.logging.minloglevel == level  # the caller's logging setting is restored

    scene = load_colmap(str(report.scene_dir), eval_split="none")
    assert len(scene.train) == report.num_registered
    widths = {frame.name: frame.image.shape[1] for frame in scene.train}
    assert {w > (W + SMALL_W) / 2 for w in widths.values()} == {True, False}  # both sizes registered
    for frame in scene.train:
        assert 0.85 * focals[frame.name] < frame.K[0, 0].item() < 1.15 * focals[frame.name]


@pytest.mark.slow  # 4 s on a quiet 2-core machine: CI's slow run (the default run stays under 5 min)
@needs_pycolmap
def test_per_image_camera_mode_gives_each_photo_its_own_camera(tmp_path: Path) -> None:
    _write_views(tmp_path / "photos")
    report = run_sfm(str(tmp_path / "photos"), str(tmp_path / "scene"), camera_mode="per_image", use_gpu=False)
    assert report.num_registered >= NUM_VIEWS - 2
    assert report.num_cameras == report.num_registered


def _size(path: Path) -> tuple[int, int]:
    with Image.open(path) as image:
        return image.size


@pytest.mark.slow  # structure from motion on 8 real photos: 17 s on a quiet machine
@needs_pycolmap
def test_real_photos_of_slightly_different_sizes_register(tmp_path: Path, shared_data: Path) -> None:
    photos = shared_data / "statuette_colmap" / "images"
    sizes = {_size(path) for path in photos.iterdir()}
    assert len(sizes) > 1  # widths 1000, heights 656-662: a single camera cannot hold them all
    report = run_sfm(str(photos), str(tmp_path / "scene"), use_gpu=False)
    assert report.num_images == 23 and report.num_registered >= 20
    assert report.num_cameras <= len(sizes)
    scene = load_colmap(str(report.scene_dir), eval_split="none")
    assert len(scene.train) == report.num_registered and scene.points.shape == (report.num_points, 3)
    for frame in scene.train:  # the shared model's focal length is about 2040 px at 1000 px width
        assert 1800 < frame.K[0, 0].item() < 2300


@needs_pycolmap
def test_sfm_rejects_empty_and_missing_folders(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="images folder does not exist"):
        run_sfm(str(tmp_path / "nope"), str(tmp_path / "out"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="no images found"):
        run_sfm(str(tmp_path / "empty"), str(tmp_path / "out"))


@needs_pycolmap
def test_sfm_reports_too_few_registered_images(tmp_path: Path) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):  # unrelated noise images: nothing can be matched
        Image.fromarray(rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)).save(photos / f"{i}.png")
    with pytest.raises(
        DatasetError, match=r"registered (no images out of 3|only \d of 3 images).*no two photos share 15 or more"
    ):
        run_sfm(str(photos), str(tmp_path / "out"), use_gpu=False)


@needs_pycolmap
def test_featureless_photos_are_named_as_the_cause(tmp_path: Path) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(4):
        Image.fromarray(np.full((60, 80, 3), 40 * i, dtype=np.uint8)).save(photos / f"plain_{i}.png")
    with pytest.raises(
        DatasetError, match=r"no images out of 4.*4 photos with fewer than 100 features.*plain_0\.png, plain_1\.png"
    ):
        run_sfm(str(photos), str(tmp_path / "out"), use_gpu=False)


def _write_noise_photos(folder: Path, count: int = 3) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = [folder / f"{i}.png" for i in range(count)]
    for path in paths:
        Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)).save(path)
    return paths


def test_missing_pycolmap_tells_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pycolmap", None)  # makes `import pycolmap` fail
    _write_noise_photos(tmp_path / "photos")
    with pytest.raises(ImportError, match=r"install it with `pip install pycolmap`"):
        run_sfm(str(tmp_path / "photos"), str(tmp_path / "out"))


@needs_pycolmap
def test_photos_pycolmap_cannot_read_are_named_as_the_cause(tmp_path: Path) -> None:
    _write_noise_photos(tmp_path / "photos")
    (tmp_path / "photos" / "broken.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(DatasetError, match=r"out of 4 .*pycolmap could not read 1 photo \(broken\.jpg\)"):
        run_sfm(str(tmp_path / "photos"), str(tmp_path / "out"), camera_mode="per_image", use_gpu=False)


def test_unknown_camera_mode_is_rejected_before_anything_else(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pycolmap", None)
    with pytest.raises(ValueError, match=r"camera_mode must be one of \('auto', 'per_image'\), got 'single'"):
        run_sfm(str(tmp_path / "photos"), str(tmp_path / "out"), camera_mode="single")


def test_unreadable_photo_is_named_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pycolmap", None)
    _write_noise_photos(tmp_path / "photos")
    (tmp_path / "photos" / "broken.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(DatasetError, match=r"broken\.jpg: cannot read the photo"):
        run_sfm(str(tmp_path / "photos"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_unknown_matcher_is_rejected_before_anything_else(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pycolmap", None)
    with pytest.raises(ValueError, match=r"matcher must be one of \('exhaustive', 'sequential', 'auto'\), got 'bogus'"):
        run_sfm(str(tmp_path / "photos"), str(tmp_path / "out"), matcher="bogus")


@pytest.mark.parametrize("photos", ["images", "images/sub", "sparse", "sparse/0", "stereo", "distorted/sparse"])
def test_photos_inside_the_output_it_replaces_are_refused_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, photos: str
) -> None:
    monkeypatch.setitem(sys.modules, "pycolmap", None)  # the refusal comes before any work
    out = tmp_path / "scene"
    paths = _write_noise_photos(out / photos)
    replaced = photos.split("/")[0] if not photos.startswith("distorted") else "distorted"
    with pytest.raises(
        DatasetError, match=rf"photos are inside .*scene/{replaced}, which this command deletes.*e\.g\. .*scene/input"
    ):
        run_sfm(str(out / photos), str(out))
    assert all(path.is_file() for path in paths)
    assert not (out / "distorted" / "database.db").exists()


@pytest.mark.parametrize("out", [".", "scene", "scene/deeper"])
def test_output_inside_the_photos_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: str) -> None:
    monkeypatch.setitem(sys.modules, "pycolmap", None)
    photos = tmp_path / "photos"
    paths = _write_noise_photos(photos / "images")  # what `--images scene --out scene` would delete
    with pytest.raises(DatasetError, match=r"the output folder is, or is inside, the photos folder"):
        run_sfm(str(photos), str(photos / out))
    assert all(path.is_file() for path in paths)


def test_photos_beside_the_output_folders_are_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pycolmap", None)
    _write_noise_photos(tmp_path / "scene" / "input")
    with pytest.raises(ImportError):  # past the folder checks
        run_sfm(str(tmp_path / "scene" / "input"), str(tmp_path / "scene"))


@needs_pycolmap
def test_cli_data_colmap_reports_too_few_images_in_one_line(tmp_path: Path, capsys) -> None:
    from gsrecon.cli import main

    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(1)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)).save(photos / f"{i}.png")
    assert main(["data", "colmap", "--images", str(photos), "--out", str(tmp_path / "scene"), "--cpu"]) == 2
    err = capsys.readouterr().err
    assert "of 3" in err and "Traceback" not in err
