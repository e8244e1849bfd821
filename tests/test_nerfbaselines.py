"""gsrecon as a nerfbaselines method: the dataset nerfbaselines hands over trains and renders (gsrecon's environment,
the dataset in nerfbaselines' shapes), and, marked slow, ``nerfbaselines train`` + ``evaluate`` for real in the
venv scripts/nerfbaselines_check.sh builds (nerfbaselines pins numpy<2)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from capture_layouts import tiny_frames
from colmap_writer import write_model
from PIL import Image

from gsrecon.data.formats.colmap_model import ColmapCamera, ColmapImage, ColmapPoints, SparseModel
from gsrecon.data.readers.synthetic import SyntheticConfig, load_synthetic
from gsrecon.data.readers.transforms import load_transforms
from gsrecon.geometry import rotmat_to_quat
from gsrecon.integrations.nerfbaselines import PINHOLE, GsreconMethod, torchvision_backbone, write_scene
from gsrecon.lpips_weights import lpips_backbone_path
from gsrecon.metrics import psnr

REPO = Path(__file__).resolve().parents[1]
TINY = {"max_steps": 20, "device": "cpu", "num_threads": 1, "renderer.name": "torch", "model.sh_degree": 1,
        "metrics.lpips_net": "none"}  # fmt: skip


@dataclass
class NbCameras:
    """The fields of nerfbaselines' Cameras the method reads: poses [N, 3, 4] camera-to-world (OpenCV axes),
    intrinsics [N, 4] (fx, fy, cx, cy), camera_models [N], image_sizes [N, 2] (width, height)."""

    poses: np.ndarray
    intrinsics: np.ndarray
    camera_models: np.ndarray
    image_sizes: np.ndarray

    def __getitem__(self, index: int) -> NbCameras:
        return NbCameras(*(getattr(self, f)[index] for f in ("poses", "intrinsics", "camera_models", "image_sizes")))

    def item(self) -> NbCameras:
        return self if self.poses.ndim == 2 else self[0]


def nb_dataset(cache: Path) -> dict:
    """The synthetic scene's views and SfM points as nerfbaselines' loaders hand a dataset to a method."""
    frames = tiny_frames(cache)
    scene = load_synthetic(
        SyntheticConfig(width=64, height=48, num_views=9, supersample=1, cache_dir=str(cache)), 1, "none"
    )
    cameras = NbCameras(
        poses=np.stack([np.linalg.inv(f.viewmat.double().numpy())[:3] for f in frames]),
        intrinsics=np.stack([f.K.double().numpy()[[0, 1, 0, 1], [0, 1, 2, 2]] for f in frames]),
        camera_models=np.full(len(frames), PINHOLE, np.int32),
        image_sizes=np.array([[f.width, f.height] for f in frames]),
    )
    return {
        "cameras": cameras, "images": [f.image.numpy() for f in frames], "metadata": {},
        "points3D_xyz": scene.points.numpy(), "points3D_rgb": (scene.colors.numpy() * 255).astype(np.uint8),
    }  # fmt: skip


def test_written_scene_reads_back_with_the_poses_and_intrinsics_nerfbaselines_gave(tmp_path, synthetic_cache):
    dataset = nb_dataset(synthetic_cache)
    scene = load_transforms(str(write_scene(dataset, tmp_path / "scene")), eval_split="none")
    assert len(scene.train) == 9 and len(scene.points) == len(dataset["points3D_xyz"])
    for index, frame in enumerate(scene.train):
        c2w = np.linalg.inv(frame.viewmat.double().numpy())[:3]
        assert np.allclose(c2w, dataset["cameras"].poses[index], atol=1e-5)
        assert np.allclose(frame.K.double().numpy()[[0, 1, 0, 1], [0, 1, 2, 2]], dataset["cameras"].intrinsics[index])
        assert np.array_equal(frame.image.numpy(), dataset["images"][index])


def test_method_trains_renders_saves_and_renders_from_its_checkpoint(tmp_path, synthetic_cache):
    dataset = nb_dataset(synthetic_cache)
    method = GsreconMethod(train_dataset=dataset, config_overrides=TINY)
    assert method.get_info()["num_iterations"] == 20 and method.get_method_info()["method_id"] == "gsrecon"
    camera = dataset["cameras"][4]
    before = method.render(camera)["color"]
    losses = [method.train_iteration(step)["loss"] for step in range(20)]
    after = method.render(camera)["color"]
    assert after.shape == (48, 64, 3) and after.dtype == np.float32 and after.min() >= 0.0 and after.max() <= 1.0
    assert all(np.isfinite(losses))
    photo = torch.from_numpy(dataset["images"][4]).float() / 255.0
    assert psnr(torch.from_numpy(after), photo) > psnr(torch.from_numpy(before), photo)  # it trained on this view
    method.save(str(tmp_path / "saved"))
    loaded = GsreconMethod(checkpoint=str(tmp_path / "saved"))
    assert loaded.get_info()["loaded_step"] == 20
    assert np.allclose(loaded.render(camera)["color"], after, atol=1e-5)


def test_torchvision_alexnet_carries_the_lpips_convolutions():
    """(VGG16 the same way: its classifier takes a minute to initialise, so the slow test covers it.)"""
    import torchvision

    if not lpips_backbone_path("alex").is_file():
        pytest.skip("no LPIPS backbone in the gsrecon cache (`gsrecon weights lpips` fetches it)")
    backbone = torch.load(lpips_backbone_path("alex"), map_location="cpu", weights_only=True)
    model = torchvision.models.alexnet(weights=None)
    model.load_state_dict(torchvision_backbone("alex"))  # every key torchvision has, no other
    for key, value in backbone.items():
        assert torch.equal(model.state_dict()[f"features.{key.split('.', 1)[1]}"], value)


def synthetic_colmap(root: Path, cache: Path) -> Path:
    """The synthetic scene (16 views at 64x48) as a COLMAP scene folder: PNG photos, PINHOLE cameras, its points."""
    cfg = SyntheticConfig(width=64, height=48, num_views=16, supersample=1, cache_dir=str(cache))
    scene = load_synthetic(cfg, 1, "none")
    (root / "images").mkdir(parents=True)
    cameras, images = {}, {}
    for index, frame in enumerate(scene.train, start=1):
        fx, fy, cx, cy = frame.K.double().numpy()[[0, 1, 0, 1], [0, 1, 2, 2]]
        cameras[index] = ColmapCamera(index, "PINHOLE", frame.width, frame.height, np.array([fx, fy, cx, cy]))
        viewmat = frame.viewmat.double()
        qvec = rotmat_to_quat(viewmat[None, :3, :3])[0].numpy()
        name = f"{frame.name}.png"
        images[index] = ColmapImage(
            index, qvec, viewmat[:3, 3].numpy(), index, name, np.zeros((0, 2)), np.zeros(0, np.int64)
        )
        Image.fromarray(frame.image.numpy()).save(root / "images" / name)
    count = len(scene.points)
    points = ColmapPoints(
        np.arange(count, dtype=np.int64), scene.points.double().numpy(), (scene.colors.numpy() * 255).astype(np.uint8),
        np.zeros(count), [np.zeros((0, 2), np.int64)] * count,
    )  # fmt: skip
    write_model(SparseModel(cameras, images, points), root / "sparse" / "0")
    return root


@pytest.mark.slow
def test_nerfbaselines_trains_and_evaluates_gsrecon_on_a_colmap_scene(tmp_path, synthetic_cache):
    """scripts/nerfbaselines_check.sh for real: its venv (built on first use: minutes), `nerfbaselines train --method
    gsrecon --backend python` on the synthetic scene as a COLMAP folder (every 8th view a test view, nerfbaselines'
    LLFF split) and `nerfbaselines evaluate` of its test renders."""
    scene = synthetic_colmap(tmp_path / "scene", synthetic_cache)
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "nerfbaselines_check.sh"), str(scene), str(tmp_path / "out"), "300"],
        capture_output=True, text=True, timeout=3600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Colmap dataloader is using LLFF split with 14 training and 2 test images" in done.stdout + done.stderr
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["nb_info"]["method"] == "gsrecon" and results["nb_info"]["num_iterations"] == 300
    metrics = results["metrics"]
    assert 15 < metrics["psnr"] < 60 and 0.3 < metrics["ssim"] <= 1 and 0 <= metrics["lpips"] < 0.6
