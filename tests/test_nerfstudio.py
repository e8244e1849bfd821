"""nerfstudio's ns-process-data layout read as nerfstudio means it: applied_transform, ply_file_path in the poses'
frame, colmap/sparse/0 points of older exports, mask_path, per-frame intrinsics, images_<f>/ and masks_<f>/."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from colmap_writer import write_model
from PIL import Image
from test_colmap import _synthetic_model

from gsrecon.data.errors import DatasetError
from gsrecon.data.formats.images import downscaled_size, resize_image
from gsrecon.data.readers.synthetic import SyntheticConfig, load_synthetic
from gsrecon.data.readers.transforms import OPENGL_TO_OPENCV, load_transforms
from gsrecon.io.ply import write_points_ply

torch.set_num_threads(1)

# What ns-process-data writes for a COLMAP model: x, z, -y (rows 0, 2, 1 of the identity, the last negated).
APPLIED = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, -1.0, 0.0, 0.0]])
LEGACY = np.array([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, -1.0, 0.0]])  # older exports' implied one
SCENE = SyntheticConfig(width=64, height=48, num_views=9, num_points=300, supersample=1)
CROPPED = 3  # the frame stored cropped, with its own w, h, cx, cy
CROP = (8, 6)  # columns, rows cut from its left and top


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GSRECON_CACHE", str(tmp_path / "cache"))


def _homogeneous(transform: np.ndarray) -> np.ndarray:
    return np.vstack([transform, [0.0, 0.0, 0.0, 1.0]])


def write_nerfstudio(root: Path, synthetic_cache: Path, *, ply: bool = True, applied: bool = True) -> dict:
    """A capture as ns-process-data writes it from a COLMAP model: poses and ``sparse_pc.ply`` moved by
    ``applied_transform``, ``images/`` + ``images_2/``, ``masks/`` + ``masks_2/`` named by ``mask_path``, and one
    frame cropped with per-frame intrinsics. Returns what was written: frames, points, masks_2."""
    scene = load_synthetic(SyntheticConfig(**{**SCENE.__dict__, "cache_dir": str(synthetic_cache)}), eval_split="none")
    K = scene.train[0].K.double().numpy()
    content = {
        "w": SCENE.width,
        "h": SCENE.height,
        "fl_x": K[0, 0],
        "fl_y": K[1, 1],
        "cx": K[0, 2],
        "cy": K[1, 2],
        "k1": 0.0,
        "k2": 0.0,
        "p1": 0.0,
        "p2": 0.0,
        "camera_model": "OPENCV",
        "frames": [],
    }
    masks_2 = {}
    for folder in ("images", "images_2", "masks", "masks_2"):
        (root / folder).mkdir(parents=True)
    for index, frame in enumerate(scene.train):
        name = f"frame_{index + 1:05d}.png"
        pixels = frame.image.numpy()
        keep = np.full(pixels.shape[:2], 255, np.uint8)
        keep[10 + index : 20 + index, 30:40] = 0
        c2w = _homogeneous(APPLIED) @ np.linalg.inv(frame.viewmat.double().numpy()) @ OPENGL_TO_OPENCV
        entry = {"file_path": f"images/{name}", "transform_matrix": c2w.tolist(), "colmap_im_id": index + 1}
        entry["mask_path"] = f"masks/{name}"
        if index == CROPPED:
            pixels, keep = pixels[CROP[1] :, CROP[0] :], keep[CROP[1] :, CROP[0] :]
            height, width = pixels.shape[:2]
            entry |= {"w": width, "h": height, "cx": K[0, 2] - CROP[0], "cy": K[1, 2] - CROP[1]}
        Image.fromarray(pixels).save(root / "images" / name)
        Image.fromarray(keep).save(root / "masks" / name)
        size = downscaled_size(pixels.shape[1], pixels.shape[0], 2)
        Image.fromarray(resize_image(pixels, size)).save(root / "images_2" / name)
        masks_2[name] = np.zeros(size[::-1], bool)
        masks_2[name][:, : size[0] // 2] = True  # unlike masks/: proves masks_2/ is the one read at factor 2
        Image.fromarray(masks_2[name].astype(np.uint8) * 255).save(root / "masks_2" / name)
        content["frames"].append(entry)
    points = scene.points.double().numpy() @ APPLIED[:, :3].T + APPLIED[:, 3]  # [P, 3] in the poses' frame
    if applied:
        content["applied_transform"] = APPLIED.tolist()
    if ply:
        write_points_ply(root / "sparse_pc.ply", points, np.rint(scene.colors.numpy() * 255).astype(np.uint8))
        content["ply_file_path"] = "sparse_pc.ply"
    (root / "transforms.json").write_text(json.dumps(content, indent=4))
    return {"frames": scene.train, "points": points, "masks_2": masks_2}


def _project(viewmat: torch.Tensor, K: torch.Tensor, points: np.ndarray) -> np.ndarray:
    """Pixel coordinates [P, 2] of world points [P, 3]."""
    cam = points @ viewmat[:3, :3].double().numpy().T + viewmat[:3, 3].double().numpy()
    uv = cam @ K.double().numpy().T
    return uv[:, :2] / uv[:, 2:]


def test_points_and_poses_share_the_applied_frame_and_project_where_the_original_ones_do(
    tmp_path: Path, synthetic_cache: Path
) -> None:
    written = write_nerfstudio(tmp_path / "capture", synthetic_cache)
    scene = load_transforms(str(tmp_path / "capture"), eval_split="none")
    np.testing.assert_allclose(scene.points.double().numpy(), written["points"], atol=1e-5)  # read as they are
    original_points = written["points"] @ APPLIED[:, :3]  # APPLIED's rotation is orthonormal, no translation
    for index, (frame, original) in enumerate(zip(scene.train, written["frames"])):
        expected = _project(original.viewmat, original.K, original_points)
        if index == CROPPED:
            expected = expected - CROP
            assert (frame.width, frame.height) == (SCENE.width - CROP[0], SCENE.height - CROP[1])
        np.testing.assert_allclose(_project(frame.viewmat, frame.K, scene.points.double().numpy()), expected, atol=1e-3)


def test_factor_2_reads_images_2_and_masks_2_and_per_frame_intrinsics(tmp_path: Path, synthetic_cache: Path) -> None:
    written = write_nerfstudio(tmp_path / "capture", synthetic_cache)
    full = load_transforms(str(tmp_path / "capture"), eval_split="none")
    half = load_transforms(str(tmp_path / "capture"), factor=2, eval_split="none")
    for index, (frame, big) in enumerate(zip(half.train, full.train)):
        name = f"frame_{index + 1:05d}.png"
        assert frame.source == "images_2/"
        assert torch.equal(
            frame.image, torch.from_numpy(np.array(Image.open(tmp_path / "capture" / "images_2" / name)))
        )
        assert torch.equal(frame.mask, torch.from_numpy(written["masks_2"][name]))
        assert torch.equal(big.mask, torch.from_numpy(np.array(Image.open(tmp_path / "capture" / "masks" / name)) > 0))
        scale = torch.tensor([frame.width / big.width, frame.height / big.height, 1.0])[:, None]
        torch.testing.assert_close(frame.K, big.K * scale)
    cropped = half.train[CROPPED]
    assert (cropped.width, cropped.height) == downscaled_size(SCENE.width - CROP[0], SCENE.height - CROP[1], 2)


def test_factor_2_without_masks_2_resizes_the_full_masks(tmp_path: Path, synthetic_cache: Path) -> None:
    write_nerfstudio(tmp_path / "capture", synthetic_cache)
    for path in (tmp_path / "capture" / "masks_2").iterdir():
        path.unlink()
    frame = load_transforms(str(tmp_path / "capture"), factor=2, eval_split="none").train[0]
    assert frame.mask.shape == (24, 32)
    assert not frame.mask[5:10, 15:20].any() and frame.mask[:3].all() and frame.mask[:, :12].all()


@pytest.mark.parametrize(("applied", "transform"), [(True, APPLIED), (False, LEGACY)])
def test_without_ply_file_path_the_colmap_points_are_moved_by_applied_transform(
    tmp_path: Path, synthetic_cache: Path, applied: bool, transform: np.ndarray
) -> None:
    """Older ns-process-data exports: no ply_file_path, the COLMAP model in colmap/sparse/0/ in COLMAP's frame."""
    root = tmp_path / "capture"
    write_nerfstudio(root, synthetic_cache, ply=False, applied=applied)
    model, _ = _synthetic_model()
    write_model(model, root / "colmap" / "sparse" / "0")
    scene = load_transforms(str(root), eval_split="none")
    np.testing.assert_allclose(scene.points.double().numpy(), model.points.xyz @ transform[:, :3].T, atol=1e-6)
    torch.testing.assert_close(scene.colors, torch.from_numpy(model.points.rgb.astype(np.float32) / 255.0))
    # Training starts from these points (it triangulates only a scene without any); triangulation stays on offer for
    # the keypoints the model's file does not give pose refinement.
    assert scene.points_hint == "" and scene.posed_capture is not None


@pytest.mark.parametrize("value", [[[1, 0, 0], [0, 1, 0], [0, 0, 1]], "identity", [[1, 0, 0, float("nan")]] * 3])
def test_a_bad_applied_transform_names_the_key(tmp_path: Path, synthetic_cache: Path, value) -> None:
    root = tmp_path / "capture"
    write_nerfstudio(root, synthetic_cache)
    content = json.loads((root / "transforms.json").read_text())
    (root / "transforms.json").write_text(json.dumps(content | {"applied_transform": value}))
    with pytest.raises(DatasetError, match=r"transforms.json: 'applied_transform' must be a 3x4 matrix"):
        load_transforms(str(root))


def test_a_missing_mask_path_file_names_it_and_its_frame(tmp_path: Path, synthetic_cache: Path) -> None:
    root = tmp_path / "capture"
    write_nerfstudio(root, synthetic_cache)
    (root / "masks" / "frame_00004.png").unlink()
    with pytest.raises(DatasetError, match=r"masks/frame_00004.png: mask file is missing \(the 'mask_path' of frame"):
        load_transforms(str(root))


def test_dataset_split_without_filenames_points_to_the_phone_config(tmp_path: Path, synthetic_cache: Path) -> None:
    root = tmp_path / "capture"
    write_nerfstudio(root, synthetic_cache)
    with pytest.raises(DatasetError, match=r"needs 'test_filenames' .*configs/phone.yaml"):
        load_transforms(str(root), eval_split="dataset")
