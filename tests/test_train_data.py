"""`gsrecon train --data FOLDER`: the config picked from what the folder holds, said in one line; --config plus
--data; folders it cannot read."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_blender import _write_synthetic
from test_colmap import _make_scene
from test_nerfstudio import write_nerfstudio

from gsrecon.cli import main
from gsrecon.data.prepare.detect import CONFIGS_DIR

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


@pytest.mark.parametrize(
    ("make", "config", "why"),
    [
        (lambda root, cache: _make_scene(root), "mipnerf360.yaml", "sparse/0/ holds a COLMAP model"),
        (
            lambda root, cache: write_nerfstudio(root, cache),
            "phone.yaml",
            "transforms.json, a phone / nerfstudio capture",
        ),
        (
            lambda root, cache: _write_synthetic(root),
            "blender_lego.yaml",
            "transforms_train.json + transforms_test.json, a NeRF-synthetic scene",
        ),
    ],
    ids=["colmap", "nerfstudio", "nerf_synthetic"],
)
def test_data_alone_picks_the_config_for_the_capture_and_says_why(
    tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str], make, config: str, why: str
) -> None:
    root = tmp_path / "my_scene"
    make(root, synthetic_cache)
    code, out, err = _train(capsys, "--data", str(root), *TINY_RUN)
    assert code == 0, err
    assert out.splitlines()[0] == (
        f"using {CONFIGS_DIR / config} for {root}: {why} (exp_dir outputs/my_scene unless set)"
    )
    resolved = _resolved(tmp_path / "outputs" / "my_scene")
    assert resolved["data"]["path"] == str(root)
    assert resolved["data"]["dataset"] == ("colmap" if config == "mipnerf360.yaml" else "transforms")
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
    assert resolved["appearance"]["mode"] == "none"  # per-image appearance did not pay on steady captures
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
    assert resolved["data"]["path"] == str(root) and resolved["strategy"]["name"] == "mcmc"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--data", "empty"],
            "empty: no capture gsrecon knows (a COLMAP sparse/0/, a transforms.json, or NeRF-synthetic",
        ),
        (["--data", "missing"], "missing: --data must be a scene folder, and this one does not exist"),
        ([], "gsrecon train needs --config CONFIG, --data SCENE_FOLDER, or both"),
    ],
)
def test_folders_it_cannot_read_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "photo.jpg").write_bytes(b"")
    code, _, err = _train(capsys, *argv)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err
    assert not (tmp_path / "outputs").exists()


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
