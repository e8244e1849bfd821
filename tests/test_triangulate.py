"""gsrecon data triangulate: points for a transforms.json scene from its known poses, named by ply_file_path."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_yaml
from PIL import Image
from plyfile import PlyData
from test_blender import _write_ngp

from gsrecon.cli import main
from gsrecon.data.formats.colmap_model import find_sparse_dir, read_model
from gsrecon.data.prepare.posed_sfm import training_points
from gsrecon.data.prepare.triangulate import _name_point_cloud
from gsrecon.data.readers.colmap import load_colmap
from gsrecon.data.readers.synthetic import SyntheticConfig, load_synthetic, surface_distance
from gsrecon.data.readers.transforms import OPENGL_TO_OPENCV, every_frame, load_transforms
from gsrecon.data.scene import Frame

torch.set_num_threads(1)

# The synthetic scene at a size where SIFT finds enough corners: one ring of views 10 degrees apart.
SCENE = {"width": 320, "height": 240, "num_views": 36, "supersample": 1, "elevations_deg": (30.0,)}


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GSRECON_CACHE", str(tmp_path / "cache"))


def _cli(*argv: str) -> subprocess.CompletedProcess:
    """``python -m gsrecon data triangulate ARGV`` in a new process."""
    command = [sys.executable, "-m", "gsrecon", "data", "triangulate", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """(exit code, stderr) of ``gsrecon data triangulate ARGV`` in this process."""
    code = main(["data", "triangulate", *argv])
    return code, capsys.readouterr().err


def _error_line(err: str) -> str:
    """The one error line of a command's stderr, after its stage announcements."""
    *stages, last = err.strip().splitlines()
    assert all("/3] " in line for line in stages) and last.startswith("error: "), err
    return last


def _write_transforms(root: Path, frames: list[Frame]) -> str:
    """A nerfstudio-style transforms.json (indent 4, shared intrinsics, an extra key) and PNGs; its text."""
    (root / "images").mkdir(parents=True)
    K = frames[0].K.double()
    content = {
        "camera_model": "OPENCV",
        "fl_x": K[0, 0].item(),
        "fl_y": K[1, 1].item(),
        "cx": K[0, 2].item(),
        "cy": K[1, 2].item(),
        "w": frames[0].width,
        "h": frames[0].height,
        "aabb_scale": 16,
        "frames": [],
    }
    for frame in frames:
        Image.fromarray(frame.image.numpy()).save(root / "images" / f"{frame.name}.png")
        c2w = np.linalg.inv(frame.viewmat.double().numpy()) @ OPENGL_TO_OPENCV  # OpenCV w2c -> OpenGL c2w
        content["frames"].append({"file_path": f"images/{frame.name}.png", "transform_matrix": c2w.tolist()})
    text = json.dumps(content, indent=4) + "\n"
    (root / "transforms.json").write_text(text)
    return text


def _read_points(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """xyz [P, 3] float32 and rgb [P, 3] uint8 of a point-cloud PLY, checking its property types."""
    vertex = PlyData.read(str(path))["vertex"]
    assert [(p.name, p.val_dtype) for p in vertex.properties] == [
        *((axis, "f4") for axis in "xyz"),
        *((channel, "u1") for channel in ("red", "green", "blue")),
    ]
    return np.stack([vertex[a] for a in "xyz"], -1), np.stack([vertex[c] for c in ("red", "green", "blue")], -1)


@pytest.mark.slow  # triangulates and trains: 7 s on a quiet machine
def test_triangulated_points_lie_on_the_synthetic_surfaces_and_training_reads_them(
    tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str], make_config
) -> None:
    pytest.importorskip("pycolmap")
    frames = load_synthetic(SyntheticConfig(**SCENE, cache_dir=str(synthetic_cache)), eval_split="none").train
    root = tmp_path / "scene"
    before = _write_transforms(root, frames)

    result = _cli("--data", str(root), "--cpu")
    assert result.returncode == 0, result.stderr
    for stage in ("[1/3] features: SIFT features of 36 images at 320x240 (factor 1)", "[2/3] matching", "[3/3]"):
        assert stage in result.stderr
    assert f"points: {root / 'sparse_pc.ply'}" in result.stdout
    assert 'transforms.json: added "ply_file_path": "sparse_pc.ply"' in result.stdout
    assert f"data.dataset=transforms data.path={root}" in result.stdout

    # transforms.json gained one line, as its first key; every other byte is as it was.
    after = (root / "transforms.json").read_text()
    assert after == before.replace("{\n    ", '{\n    "ply_file_path": "sparse_pc.ply",\n    ', 1)
    assert json.loads(after) == {"ply_file_path": "sparse_pc.ply", **json.loads(before)}

    points, colors = _read_points(root / "sparse_pc.ply")
    assert len(points) >= 200
    assert colors.std() > 10  # coloured from the images, not a constant
    distance = surface_distance(torch.from_numpy(points).double()).numpy()  # [P] metres; the scene is 6 m wide
    assert np.median(distance) < 0.05 and np.percentile(distance, 75) < 0.1

    # The COLMAP model kept the cameras' poses: the transforms' poses, in COLMAP's (= gsrecon's) convention.
    model = read_model(root / "triangulation" / "sparse")
    assert len(model.points) == len(points)
    for image in model.images.values():
        viewmat = next(f.viewmat for f in frames if f"{f.name}.png" == image.name).double().numpy()
        np.testing.assert_allclose(image.viewmat(), viewmat, atol=1e-5)
    assert not (root / "triangulation" / "images").exists()  # SIFT's copies of the images are removed

    scene = load_transforms(str(root), eval_split="none")  # what training with model.init: auto starts from
    assert torch.equal(scene.points, torch.from_numpy(points))
    assert torch.equal(scene.colors, torch.from_numpy(colors.astype(np.float32) / 255.0))

    code, err = _run(capsys, "--data", str(root))
    assert code == 2
    assert 'already names a point cloud ("ply_file_path": "sparse_pc.ply"); pass --overwrite' in _error_line(err)
    assert (root / "transforms.json").read_text() == after

    # A point cloud file carries no keypoints: pose refinement has them triangulated to measure the poses against.
    config = make_config(max_steps=1, data={"dataset": "transforms", "path": str(root), "eval_split": "every_8"})
    assert main(["train", "--config", str(write_yaml(tmp_path / "c.yaml", config))]) == 0
    assert "triangulating" not in capsys.readouterr().err  # without pose refinement the file's points are all it needs
    config["views"] = {"pose_opt": {"name": "se3"}}
    assert main(["train", "--config", str(write_yaml(tmp_path / "c.yaml", config)), "--overwrite"]) == 0
    err = capsys.readouterr().err
    assert f"training {len(points)} Gaussians from SfM points" in err and "[3/3]" in err
    assert "pose_opt: refining 0 of 31 training views; within trust_px 1: 31 keep their given poses" in err


@pytest.mark.slow  # 10 s on a quiet 2-core machine: CI's slow run (the default run stays under 5 min)
def test_training_a_capture_without_points_triangulates_them_once_and_leaves_the_folder_alone(
    tmp_path: Path, synthetic_cache: Path, make_config, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("pycolmap")
    frames = load_synthetic(SyntheticConfig(**SCENE, cache_dir=str(synthetic_cache)), eval_split="none").train
    root = tmp_path / "scene"
    before = _write_transforms(root, frames)
    listing = sorted(p.relative_to(root) for p in root.rglob("*"))
    config = make_config(max_steps=1, data={"dataset": "blender", "path": str(root), "eval_split": "every_8"})
    config["model"]["init"] = "auto"
    config["views"] = {"pose_opt": {"name": "se3"}}  # measures each training view's pose against its keypoints
    config_path = write_yaml(tmp_path / "c.yaml", config)

    assert main(["train", "--config", str(config_path)]) == 0
    err = capsys.readouterr().err
    assert "pose_opt: refining 0 of 31 training views; within trust_px 1: 31 keep their given poses" in err
    for stage in ("[1/3]: SIFT features of 36 images at 320x240", "[2/3]: exhaustive matching", "[3/3]: "):
        assert f"triangulating SfM points {stage}" in err
    made = int(err.split("SfM points: triangulated ")[1].split(" points")[0])
    assert made >= 200
    assert f"training {made} Gaussians from SfM points on 31 views" in err and "no SfM points" not in err
    assert (root / "transforms.json").read_text() == before  # the capture is as the user left it
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == listing

    assert main(["train", "--config", str(config_path), "--overwrite"]) == 0
    err = capsys.readouterr().err
    assert f"SfM points: {made} triangulated points of this capture from the cache" in err
    assert "[1/3]" not in err and f"training {made} Gaussians from SfM points" in err

    # The cache keeps which photo saw which point (the depth prior's tracks): every frame's points are in its view.
    cached = training_points(root, partial(every_frame, root), lambda line: None)
    assert set(cached.observed) == {frame.name for frame in frames}
    observations = sum(len(rows) for rows in cached.observed.values())
    assert observations == pytest.approx(cached.mean_track_length * made, rel=1e-4)
    for frame in frames:
        camera = torch.from_numpy(cached.points[cached.observed[frame.name]]) @ frame.viewmat[:3, :3].T
        camera += frame.viewmat[:3, 3]  # [P_i, 3]
        pixels = (camera[:, :2] / camera[:, 2:]) @ frame.K[:2, :2].T + frame.K[:2, 2]
        assert (camera[:, 2] > 0).all() and (pixels > -1).all() and (pixels < torch.tensor([321.0, 241.0])).all()
        keypoints = torch.from_numpy(cached.keypoints[frame.name])  # [P_i, 2]
        assert cached.sizes[frame.name] == (320, 240)
        assert (pixels - keypoints).norm(dim=-1).median() < 1.0  # where SIFT found each point, at the true poses


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda root: None, "no transforms_train.json or transforms.json found"),
        (lambda root: root.rmdir(), "scene folder does not exist"),
        (lambda root: (_write_ngp(root), (root / "sparse_pc.ply").write_text("mine")), "exists although"),
    ],
    ids=["no transforms file", "no folder", "unnamed sparse_pc.ply"],
)
def test_bad_folders_are_one_line_and_exit_2(capsys, tmp_path: Path, make, message: str) -> None:
    root = tmp_path / "scene"
    root.mkdir()
    make(root)
    code, err = _run(capsys, "--data", str(root))
    assert code == 2
    assert message in _error_line(err) and str(root) in err


@pytest.mark.parametrize("command", ["triangulate", "colmap"])
def test_without_pycolmap_is_one_line_and_exit_2(tmp_path: Path, command: str) -> None:
    _write_ngp(tmp_path)
    before = (tmp_path / "transforms.json").read_text()
    no_pycolmap = "import sys; sys.modules['pycolmap'] = None; from gsrecon.cli import main; sys.exit(main())"
    args = {
        "triangulate": ["--data", str(tmp_path)],
        "colmap": ["--images", str(tmp_path / "images"), "--out", str(tmp_path / "scene")],
    }[command]
    result = subprocess.run(
        [sys.executable, "-c", no_pycolmap, "data", command, *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    message = f"gsrecon data {command} needs pycolmap: install it with `pip install pycolmap`"
    assert message in _error_line(result.stderr)
    assert (tmp_path / "transforms.json").read_text() == before


def _scale_first_pose(root: Path) -> None:
    content = json.loads((root / "transforms.json").read_text())
    content["frames"][0]["transform_matrix"] = (
        np.diag([2.0, 2.0, 2.0, 1.0]) @ content["frames"][0]["transform_matrix"]
    ).tolist()
    (root / "transforms.json").write_text(json.dumps(content))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda root: None, "triangulated 0 points from 6 images (at least 100 needed); 6 frame(s) with fewer than"),
        (lambda root: (root / "images" / "frame_00003.jpg").unlink(), "frame_00003.jpg: image file is missing"),
        (_scale_first_pose, "frame 'frame_00000': 'transform_matrix' is not a rotation and a translation"),
    ],
    ids=["plain images", "missing image", "scaled pose"],
)
def test_bad_scenes_are_one_line_and_leave_transforms_json_alone(capsys, tmp_path: Path, change, message: str) -> None:
    pytest.importorskip("pycolmap")
    _write_ngp(tmp_path)  # plain grey 64x40 images: no features
    change(tmp_path)
    before = (tmp_path / "transforms.json").read_text()
    code, err = _run(capsys, "--data", str(tmp_path), "--cpu")
    assert code == 2
    assert message in _error_line(err)
    assert (tmp_path / "transforms.json").read_text() == before
    assert not (tmp_path / "sparse_pc.ply").exists()


def test_naming_the_point_cloud_keeps_the_rest_of_the_text(tmp_path: Path) -> None:
    path = tmp_path / "transforms.json"
    for text, expected, change in [
        ('{"fl_x": 1.50, "frames": []}', '{"ply_file_path": "sparse_pc.ply", "fl_x": 1.50, "frames": []}', "added"),
        (
            '\n{\n\t"a": 1e-5,\n\t"frames": []\n}',
            '\n{\n\t"ply_file_path": "sparse_pc.ply",\n\t"a": 1e-5,\n\t"frames": []\n}',
            "added",
        ),
        (
            '{\n  "a": 1,\n  "ply_file_path" : "old.ply",\n  "frames": []\n}\n',
            '{\n  "a": 1,\n  "ply_file_path": "sparse_pc.ply",\n  "frames": []\n}\n',
            'replaced "ply_file_path": "old.ply" with "sparse_pc.ply" (old.ply is left in place)',
        ),
        (  # not a string: the file is written again as JSON in its own indentation
            '{\n   "ply_file_path": null, "frames": [ ]}',
            '{\n   "ply_file_path": "sparse_pc.ply",\n   "frames": []\n}\n',
            "(the file was written again as JSON)",
        ),
        (
            '{"ply_file_path": "sparse_pc.ply", "frames": []}',
            '{"ply_file_path": "sparse_pc.ply", "frames": []}',
            "unchanged",
        ),
    ]:
        path.write_text(text)
        assert change in _name_point_cloud(path, text, json.loads(text))
        assert path.read_text() == expected


def colmap_to_transforms(colmap_dir: Path, root: Path) -> None:
    """A transforms.json scene in ``root`` with the poses and PINHOLE cameras of a COLMAP scene, its images
    (and ``images_<f>/``) linked, frames in name order."""
    root.mkdir(parents=True, exist_ok=True)
    for folder in ["images", *(f"images_{f}" for f in (2, 4, 8))]:
        if (colmap_dir / folder).is_dir():
            (root / folder).symlink_to((colmap_dir / folder).resolve())
    model = read_model(find_sparse_dir(colmap_dir))
    frames = []
    for image in sorted(model.images.values(), key=lambda image: image.name):
        camera = model.cameras[image.camera_id]
        assert camera.model == "PINHOLE"
        fx, fy, cx, cy = (float(v) for v in camera.params)
        c2w = np.linalg.inv(image.viewmat()) @ OPENGL_TO_OPENCV
        frames.append(
            {"file_path": f"images/{image.name}", "transform_matrix": c2w.tolist()}
            | {"fl_x": fx, "fl_y": fy, "cx": cx, "cy": cy, "w": camera.width, "h": camera.height}
        )
    (root / "transforms.json").write_text(json.dumps({"camera_model": "OPENCV", "frames": frames}, indent=4) + "\n")


@pytest.mark.slow
def test_triangulating_a_capture_twice_gives_the_same_points(tmp_path: Path, shared_data: Path) -> None:
    """The matches are verified on several threads; each image pair's RANSAC draws from a fixed seed, so the
    points do not depend on which thread verified which pair (before, 3722, 3707 and 3712 points in three runs)."""
    pytest.importorskip("pycolmap")
    clouds = []
    for run in ("first", "second"):
        colmap_to_transforms(shared_data / "statuette_colmap", tmp_path / run)
        result = _cli("--data", str(tmp_path / run), "--cpu")
        assert result.returncode == 0, result.stderr
        clouds.append((tmp_path / run / "sparse_pc.ply").read_bytes())
    assert clouds[0] == clouds[1]


@pytest.mark.slow
def test_statuette_points_agree_with_its_colmap_points(tmp_path: Path, shared_data: Path) -> None:
    pytest.importorskip("pycolmap")
    statuette = shared_data / "statuette_colmap"
    colmap_to_transforms(statuette, tmp_path / "scene")
    result = _cli("--data", str(tmp_path / "scene"), "--cpu")
    assert result.returncode == 0, result.stderr
    assert "SIFT features of 23 images" in result.stderr and "(factor 1)" in result.stderr

    scene = load_transforms(str(tmp_path / "scene"), 8)
    reference = load_colmap(str(statuette), 8)
    assert [f.name for f in scene.test] == [f.name for f in reference.test]  # the same every_8 split
    points, colmap_points = scene.points.double(), reference.points.double()  # [P, 3], [Q, 3]
    assert len(points) > len(colmap_points) > 1000
    distance = torch.cdist(points, colmap_points)  # [P, Q]
    # Each triangulated point is near a COLMAP point and each COLMAP point near a triangulated one (COLMAP's
    # points are about 2 cm apart; the cameras' extent is 5 m).
    assert distance.min(1).values.median() < 0.005 * reference.extent
    assert distance.min(0).values.median() < 0.002 * reference.extent
