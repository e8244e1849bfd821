"""`gsrecon train --data FOLDER`: the config picked from what the folder holds, said in one line; --config plus
--data; folders it cannot read."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import capture_layouts
import pytest
import yaml
from PIL import Image
from test_colmap import _make_scene
from test_nerfstudio import write_nerfstudio
from test_sfm import TARGET, _eyes, _render, _write_views

from gsrecon.cli import main
from gsrecon.data.prepare.detect import CONFIGS_DIR, detect_capture
from gsrecon.render.video import write_video

TINY_RUN = [  # a run of two steps on one CPU thread, whatever the config
    "max_steps=2",
    "val_interval=2",
    "device=cpu",
    "num_threads=1",
    "renderer.name=torch",
    "model.sh_degree=0",
    "model.init_num_points=300",
    "metrics.lpips_net=none",
    "writers=[]",
]


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GSRECON_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # the runs' default exp_dir, outputs/<folder name>, lands here


def _train(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``gsrecon train ARGV`` in this process."""
    code = main(["train", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _resolved(exp_dir: Path) -> dict:
    return yaml.safe_load((exp_dir / "config.yaml").read_text())


SFM_SCENE = {"width": 320, "height": 240, "num_views": 36, "elevations_deg": (30.0,)}  # enough corners for SIFT
TRIANGULATED = (
    "points triangulated from its poses (once: the next run reads them from gsrecon's cache)"
    if importlib.util.find_spec("pycolmap")
    else "random points (with pycolmap installed: points triangulated from its poses)"
)
FROM_SFM = "the SfM points of structure from motion"
# layout -> (the config, the keys it adds, what the line names as deciding, the start); docs/training.md's table
LAYOUTS = {
    "colmap": ("mipnerf360.yaml", [], ["a COLMAP scene (sparse/0/ holds a COLMAP model; images_2/)"], "its SfM points"),
    "ns_process_data": (
        "phone.yaml",
        [],
        ["PNG photos without alpha", "camera_model OPENCV", "per-frame intrinsics", "ply_file_path sparse_pc.ply"],
        "the SfM points of its ply_file_path (sparse_pc.ply)",
    ),
    "polycam": ("phone.yaml", [], ["photos with known poses (transforms.json; JPG photos", "per-frame"], TRIANGULATED),
    "record3d": ("phone.yaml", [], ["camera_model OPENCV; fl_x", "depth maps"], TRIANGULATED),
    "instant_ngp": ("phone.yaml", [], ["JPG photos without alpha", "aabb_scale"], TRIANGULATED),
    "phone_split": (
        "phone.yaml",
        ["data.eval_split=dataset"],
        ["photos with known poses (transforms_train.json + transforms_test.json; JPG photos without alpha"],
        TRIANGULATED,
    ),
    "nerf_synthetic": (
        "blender_lego.yaml",
        [],
        ["a NeRF-synthetic scene (transforms_train.json + transforms_test.json; PNG images with a transparent"],
        "random points",
    ),
    "rgba_one_file": (
        "blender_lego.yaml",
        ["data.eval_split=every_8"],
        ["a NeRF-synthetic scene (transforms.json; PNG images with a transparent background; camera_angle_x)"],
        "random points",
    ),
    "video": ("phone.yaml", ["data.dataset=colmap"], ["a video (my_scene.mp4: 64x48, 0.9 s at 10 fps)"], FROM_SFM),
    "videos": ("phone.yaml", ["data.dataset=colmap"], ["2 videos (orbit_a.mp4: 64x48", "orbit_b.mov"], FROM_SFM),
    "photos": ("phone.yaml", ["data.dataset=colmap"], ["9 JPG photos (64x48) without poses: structure from"], FROM_SFM),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_gets_its_config_and_start_by_what_it_holds(
    tmp_path: Path, synthetic_cache: Path, layout: str
) -> None:
    config, keys, decided_by, start = LAYOUTS[layout]
    path = getattr(capture_layouts, layout)(tmp_path / "my_scene", synthetic_cache)
    recipe = detect_capture([path])
    assert recipe.config == CONFIGS_DIR / config
    assert recipe.overrides == keys
    assert all(words in recipe.why for words in decided_by), recipe.why
    assert recipe.start == start
    assert recipe.exp_dir == "outputs/my_scene"


def test_a_folder_with_a_transforms_file_and_a_colmap_model_says_which_it_trains_and_how_to_take_the_other(
    tmp_path: Path, synthetic_cache: Path
) -> None:
    path = capture_layouts.colmap(tmp_path / "both", synthetic_cache)
    capture_layouts.instant_ngp(tmp_path / "ngp", synthetic_cache)
    (tmp_path / "ngp" / "transforms.json").rename(path / "transforms.json")
    for photo in (tmp_path / "ngp" / "images").iterdir():
        photo.rename(path / "images" / photo.name)
    recipe = detect_capture([path])
    assert recipe.config == CONFIGS_DIR / "phone.yaml"
    other = (
        f"not the COLMAP model beside it (sparse/0/), which --config {CONFIGS_DIR / 'mipnerf360.yaml'} --data {path}"
    )
    assert other in recipe.why


def test_photos_outside_the_capture_are_detected_only_when_the_user_opts_in(
    tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = capture_layouts.instant_ngp(tmp_path / "ngp", synthetic_cache)
    content = json.loads((root / "transforms.json").read_text())
    first = content["frames"][0]
    (root / first["file_path"]).rename(tmp_path / "elsewhere.jpg")
    first["file_path"] = "../elsewhere.jpg"
    (root / "transforms.json").write_text(json.dumps(content))
    code, out, err = _train(capsys, "--data", str(root), *TINY_RUN)
    assert code == 2 and "lies outside the capture folder" in err and "data.outside_capture=true" in err and not out
    code, out, err = _train(capsys, "--data", str(root), *TINY_RUN, "data.outside_capture=true")
    assert code == 0 and out.startswith(f"using {CONFIGS_DIR / 'phone.yaml'} for {root}"), err
    assert "lies outside" not in err  # nor while triangulating its points from the photos


@pytest.mark.parametrize(
    ("keys", "appearance", "pose_opt"),
    [
        ([], "none", "se3"),  # phone.yaml checks each photo's pose against its keypoints; appearance off (issue 52)
        (["views.pose_opt.name=none", "views.appearance.name=bilateral_grid"], "bilateral_grid", "none"),
        (["views.pose_opt.name=se3", "views.appearance.name=affine"], "affine", "se3"),  # the old keys beside
        # phone.yaml's views: entries are refused by name (tests/test_bad_input.py)
    ],
)
def test_the_per_view_modules_of_phone_yaml_are_switched_by_name(
    tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str], keys, appearance: str, pose_opt: str
) -> None:
    root = capture_layouts.nerf_synthetic(tmp_path / "my_scene", synthetic_cache)
    config = ["--config", str(CONFIGS_DIR / "phone.yaml"), f"data.path={root}", f"exp_dir={tmp_path / 'run'}"]
    code, _, err = _train(capsys, *config, *TINY_RUN, *keys)
    assert code == 0, err
    resolved = _resolved(tmp_path / "run")
    assert resolved["views"]["appearance"]["name"] == appearance and resolved["views"]["pose_opt"]["name"] == pose_opt
    assert resolved["views"]["pose_opt"].get("without_keypoints", "keep") == "keep"


def test_the_documented_capture_table_matches_the_detection() -> None:
    page = (CONFIGS_DIR.parent / "docs" / "training.md").read_text()
    table = page.split("## What `--data` decides", 1)[1].split("| layout |", 1)[1].split("\n\n", 1)[0]
    rows = table.splitlines()[2:]  # after the header's end and the separator line
    assert len(rows) == len(LAYOUTS)
    for row, (layout, (config, keys, _, start)) in zip(rows, LAYOUTS.items()):
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[0] == f"`{layout}`" and cells[3] == " ".join([f"`{config}`", *(f"`{k}`" for k in keys)])
        assert cells[4] == {TRIANGULATED: "triangulated from its poses"}.get(start, start.split(" (")[0])


@pytest.mark.parametrize(
    ("layout", "start"),
    [("colmap", "SfM points"), ("ns_process_data", "SfM points"), ("nerf_synthetic", "random points")],
)
def test_data_alone_trains_the_capture_and_the_first_line_says_which_config_and_why(
    tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str], layout: str, start: str
) -> None:
    root = getattr(capture_layouts, layout)(tmp_path / "my_scene", synthetic_cache)
    code, out, err = _train(capsys, "--data", str(root), *TINY_RUN)
    assert code == 0, err
    assert out.splitlines()[0] == detect_capture([root]).describe(str(root))
    assert out.splitlines()[0].startswith(f"using {CONFIGS_DIR / LAYOUTS[layout][0]} for {root}: ")
    resolved = _resolved(tmp_path / "outputs" / "my_scene")
    assert resolved["data"]["path"] == str(root)
    assert resolved["data"]["dataset"] == ("colmap" if layout == "colmap" else "transforms")
    assert f"Gaussians from {start} on " in err
    assert f"outputs: {Path('outputs/my_scene')}" in out


def test_phone_config_trains_the_nerfstudio_capture_with_its_masks_and_points(
    tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "capture"
    write_nerfstudio(root, synthetic_cache)
    code, _, err = _train(capsys, "--data", str(root), *TINY_RUN, "exp_dir=run")
    assert code == 0, err
    resolved = _resolved(tmp_path / "run")
    assert resolved["data"]["eval_split"] == "every_8" and resolved["data"]["factor"] == 2
    assert (
        resolved["views"]["appearance"]["name"] == "none"
        and resolved["views"]["appearance"]["without_keypoints"] == "keep"
    )
    log = (tmp_path / "run" / "train.log").read_text()
    assert "masks: 9 of 9 images have one; the loss and the test-view metrics" in log
    # Its ply_file_path points; the cropped frame's own size; images_2/.
    assert "300 Gaussians from SfM points on 7 views at 28x21, 32x24 (data.factor 2; images images_2/" in log


def test_config_and_data_together_set_data_path(
    tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _, _ = _make_scene(tmp_path / "scene")
    config = str(CONFIGS_DIR / "fast.yaml")
    code, out, err = _train(capsys, "--config", config, "--data", str(root), *TINY_RUN, "exp_dir=run")
    assert code == 0, err
    assert "using " not in out  # the config given is used, as given
    resolved = _resolved(tmp_path / "run")
    assert resolved["data"]["path"] == str(root) and resolved["strategy"]["name"] == "multiview"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--data", "empty"],
            "empty: no capture gsrecon knows: a COLMAP model (sparse/0/), a transforms.json (or transforms_train.json",
        ),
        (["--data", "junk"], "junk: no capture gsrecon knows: a COLMAP model (sparse/0/)"),
        (
            ["--data", "broken_photos"],
            "broken_photos: 2 of 3 photos can be read as images (not: c.jpg); structure from motion needs at least 3",
        ),
        (
            ["--data", "missing"],
            "missing: --data must be a scene folder, photos or videos, and this path does not exist",
        ),
        (
            ["--data", "loop"],
            "loop: --data must be a scene folder, photos or videos, and this path is a symbolic link that loops",
        ),
        (
            ["--data", "two_photos"],
            "two_photos: 2 of 2 photos can be read as images; structure from motion needs at least 3",
        ),
        (["--data", "broken.mp4", "--data", "loop.mp4"], "loop.mp4: is a symbolic link that loops (it leads back"),
        (["--data", "broken.mp4"], "broken.mp4: cannot read the video"),
        (["--data", "broken.mp4", "--data", "notes.txt"], "notes.txt: is not a video; --data takes a scene folder"),
        ([], "gsrecon train needs --config CONFIG, --data CAPTURE, or both"),
    ],
)
def test_captures_it_cannot_read_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("not a capture")
    (tmp_path / "junk" / "model.bin").write_bytes(bytes(100))
    (tmp_path / "broken_photos").mkdir()
    for name in ("a.jpg", "b.jpg"):
        Image.new("RGB", (8, 6)).save(tmp_path / "broken_photos" / name)
    (tmp_path / "broken_photos" / "c.jpg").write_bytes(b"")
    (tmp_path / "two_photos").mkdir()
    for name in ("a.jpg", "b.jpg"):
        Image.new("RGB", (8, 6)).save(tmp_path / "two_photos" / name)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "loop.mp4").symlink_to(tmp_path / "loop.mp4")
    (tmp_path / "broken.mp4").write_bytes(b"not a video")
    (tmp_path / "notes.txt").write_text("not a video")
    code, out, err = _train(capsys, *argv)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert not out and not (tmp_path / "outputs").exists()


@pytest.mark.slow  # 10 s on the 2 loaded cores: CI's slow run (the default run stays under 5 min)
@pytest.mark.skipif(importlib.util.find_spec("pycolmap") is None, reason="pycolmap not installed")
def test_a_phone_capture_with_its_own_split_files_trains_from_triangulated_points_with_its_split(
    tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The figurine of issue 32: JPEG photos, transforms.json + transforms_train.json + transforms_test.json."""
    frames = capture_layouts.tiny_frames(synthetic_cache, **SFM_SCENE)
    root = capture_layouts.split_capture(tmp_path / "figurine", frames)
    listing = sorted(p.relative_to(root) for p in root.rglob("*"))
    code, out, err = _train(capsys, "--data", str(root), *TINY_RUN)
    assert code == 0, err
    assert out.splitlines()[0].startswith(
        f"using {CONFIGS_DIR / 'phone.yaml'} data.eval_split=dataset for {root}: photos with known poses "
        "(transforms_train.json + transforms_test.json; JPG photos without alpha; camera_model OPENCV; fl_x); "
        "starts from points triangulated from its poses"
    )
    # The 27 training photos are triangulated (the test views left out), and the log says how long it took.
    assert "triangulating SfM points [1/3]: SIFT features of 27 images at 320x240 (factor 1)" in err
    assert re.search(r"SfM points: triangulated \d+ points from 27 images at factor 1 .* in \d+\.\d s", err)
    assert (
        "Gaussians from SfM points on 27 views at 160x120 (data.factor 2; images resized 1/2; 9 for validation)" in err
    )
    assert _resolved(tmp_path / "outputs" / "figurine")["data"]["eval_split"] == "dataset"
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == listing  # nothing written into the capture


@pytest.mark.slow  # 6 s on a quiet 2-core machine: CI's slow run (the default run stays under 5 min)
@pytest.mark.skipif(importlib.util.find_spec("pycolmap") is None, reason="pycolmap not installed")
def test_a_folder_of_photos_goes_through_structure_from_motion_into_the_cache_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    photos = tmp_path / "photos"
    _write_views(photos)
    code, out, err = _train(capsys, "--data", str(photos), *TINY_RUN)
    assert code == 0, err
    assert out.splitlines()[0].startswith(
        f"using {CONFIGS_DIR / 'phone.yaml'} data.dataset=colmap for {photos}: 12 PNG photos (320x240) without poses: "
        "structure from motion first (gsrecon data colmap, into gsrecon's cache); starts from the SfM points of "
        "structure from motion (exp_dir outputs/photos unless set)"
    )
    cache = tmp_path / "cache" / "scenes"
    assert f"structure from motion of 12 PNG photos (320x240) into gsrecon's cache ({cache}" in err
    assert all(f"[{i}/4] {stage}:" in err for i, stage in enumerate(("features", "matching", "mapping"), start=1))
    assert re.search(r"structure from motion: registered \d+ of 12 images.*points, in \d+\.\d s \(features", err)
    assert "Gaussians from SfM points on " in err
    scene = Path(_resolved(tmp_path / "outputs" / "photos")["data"]["path"])
    assert scene.parent == cache and (scene / "sparse" / "0" / "cameras.bin").is_file()
    assert sorted(p.name for p in photos.iterdir()) == [f"view_{i:02d}.png" for i in range(12)]  # left alone

    code, _, err = _train(capsys, "--data", str(photos), *TINY_RUN, "--overwrite")
    assert code == 0, err
    assert (
        f"structure from motion: reusing the scene made of these 12 PNG photos (320x240) by an earlier run ({scene})"
        in err
    )
    assert "[1/4]" not in err


def test_the_nerf_synthetic_config_on_a_phone_capture_points_to_the_phone_config(
    tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "capture"
    write_nerfstudio(root, synthetic_cache)
    config = str(CONFIGS_DIR / "blender_lego.yaml")
    code, _, err = _train(capsys, "--config", config, "--data", str(root), *TINY_RUN, "exp_dir=run")
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "eval_split 'dataset' needs 'test_filenames' or 'train_filenames'" in err and "configs/phone.yaml" in err


@pytest.mark.slow  # 4 s on a quiet 2-core machine: CI's slow run (the default run stays under 5 min)
@pytest.mark.skipif(importlib.util.find_spec("pycolmap") is None, reason="pycolmap not installed")
def test_a_video_goes_through_structure_from_motion_and_trains(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clip = tmp_path / "walk.mp4"
    write_video(clip, [_render(eye, TARGET) for eye in _eyes()], fps=4)
    code, out, err = _train(capsys, "--data", str(clip), *TINY_RUN)
    assert code == 0, err
    assert out.splitlines()[0].startswith(
        f"using {CONFIGS_DIR / 'phone.yaml'} data.dataset=colmap for {clip}: a video (walk.mp4: 320x240, 3 s at 4 fps) "
        "without poses: structure from motion first"
    )
    assert all(f"[{i}/5] {stage}:" in err for i, stage in enumerate(("frames", "features", "matching"), start=1))
    assert "Gaussians from SfM points on " in err
    scene = Path(_resolved(tmp_path / "outputs" / "walk")["data"]["path"])
    assert scene.parent == tmp_path / "cache" / "scenes" and len(list((scene / "input").iterdir())) == 12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "outputs", "walk.mp4"]  # nothing beside the video


@pytest.mark.slow  # 4 s on a quiet 2-core machine: CI's slow run (the default run stays under 5 min)
def test_data_on_a_scene_folder_needs_no_ffmpeg(tmp_path: Path) -> None:
    """imageio-ffmpeg is for videos only: detecting and training a COLMAP folder works without it."""
    root = capture_layouts.colmap(tmp_path / "scene", tmp_path)
    no_ffmpeg = "import sys; sys.modules['imageio_ffmpeg'] = None; from gsrecon.cli import main; sys.exit(main())"
    argv = ["train", "--data", str(root), *TINY_RUN, f"exp_dir={tmp_path / 'run'}"]
    result = subprocess.run([sys.executable, "-c", no_ffmpeg, *argv], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"using {CONFIGS_DIR / 'mipnerf360.yaml'} for {root}: a COLMAP scene")


def test_split_lists_inside_a_capture_are_its_own_split_too(tmp_path: Path, synthetic_cache: Path) -> None:
    """nerfstudio's test_filenames in transforms.json and COLMAP's test.txt are a capture's own split too."""
    root = capture_layouts.ns_process_data(tmp_path / "ns", synthetic_cache)
    content = json.loads((root / "transforms.json").read_text())
    (root / "transforms.json").write_text(json.dumps(content | {"test_filenames": ["images/frame_00002.png"]}))
    recipe = detect_capture([root])
    assert recipe.overrides == ["data.eval_split=dataset"] and recipe.why.endswith("; test_filenames)")

    root = capture_layouts.colmap(tmp_path / "colmap", synthetic_cache)
    (root / "test.txt").write_text("img_03.png\n")
    recipe = detect_capture([root])
    assert recipe.overrides == ["data.eval_split=dataset"] and recipe.why.endswith("; images_2/; test.txt)")
