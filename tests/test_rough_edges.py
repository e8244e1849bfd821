"""What a new user meets at the edges: an output gsrecon cannot write, a run whose last.pt was cut short, paths that
loop, captures that are two things at once; each one line that names the user's path, or the work done anyway."""

from __future__ import annotations

import resource
import shutil
from pathlib import Path

import numpy as np
import pytest

from gsrecon.cli import main
from gsrecon.render.video import write_video


@pytest.fixture
def trained(make_trainer) -> Path:
    """A finished tiny run with checkpoints at steps 3 and 6."""
    trainer = make_trainer(max_steps=6)
    trainer.train()
    return trainer.exp_dir


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    "out", ["/proc/m.ply", "{tmp}", "{tmp}/scene.yaml/m.ply"], ids=["unwritable", "a-folder", "under-a-file"]
)
def test_an_output_that_cannot_be_written_names_the_users_path(trained, tmp_path, capsys, out: str) -> None:
    out = out.format(tmp=tmp_path)
    (tmp_path / "scene.yaml").write_text("a file, not a folder")
    capsys.readouterr()
    assert main(["export", "--exp-dir", str(trained), "--out", out]) == 2
    err = _one_line(capsys)
    assert f"cannot write {out}:" in err and ".tmp" not in err


def test_a_full_disk_during_an_export_names_the_file_and_leaves_nothing_behind(trained, tmp_path, capsys) -> None:
    out = tmp_path / "out" / "scene.ply"
    out.parent.mkdir()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(
        resource.RLIMIT_FSIZE, (16 * 1024, hard)
    )  # as ulimit -f: the write fails part way, as on a full disk
    try:
        code = main(["export", "--exp-dir", str(trained), "--out", str(out)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert code == 2
    assert f"cannot write {out}: File too large" in _one_line(capsys)
    assert not list(out.parent.iterdir())


def test_a_video_that_cannot_be_written_whole_is_one_line_naming_it(trained, tmp_path, capfd) -> None:
    assert main(["render", "--exp-dir", str(trained), "--out", "/proc/x.mp4", "--frames", "2"]) == 2
    err = capfd.readouterr().err.strip().splitlines()  # the render's log, then one error line (and none of ffmpeg's)
    assert err[-1] == "error: cannot write /proc/x.mp4: No such file or directory" and "error" not in err[0]
    out = tmp_path / "out" / "path.mp4"
    out.parent.mkdir()
    frames = np.random.default_rng(0).integers(0, 256, (30, 48, 64, 3), dtype=np.uint8)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))  # ffmpeg, which inherits it, stops part way
    try:
        with pytest.raises(OSError, match=f"cannot write {out}: the video encoder .ffmpeg. stopped before its end"):
            write_video(out, frames)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert not list(out.parent.iterdir())
    assert write_video(out, frames) == 30 and out.is_file()  # with room, the same video is written whole


def test_eval_and_export_of_a_run_with_a_truncated_last_pt_take_the_newest_intact_checkpoint(
    trained, tmp_path, capsys
) -> None:
    last = trained / "checkpoints" / "last.pt"
    last.unlink()  # a hard link to step_000006.pt: cut a copy of it
    shutil.copy(trained / "checkpoints" / "step_000006.pt", last)
    with last.open("r+b") as f:
        f.truncate(last.stat().st_size // 2)
    (trained / "checkpoints" / "step_000006.pt").unlink()  # killed while writing: only last.pt had step 6
    capsys.readouterr()
    assert main(["export", "--exp-dir", str(trained), "--out", str(tmp_path / "m.splat"), "--format", "splat"]) == 0
    assert f"passing over {last}: {last} is truncated" in " ".join(capsys.readouterr().err.split())
    assert main(["eval", "--exp-dir", str(trained), "--out", str(tmp_path / "eval")]) == 0
    assert (tmp_path / "m.splat").is_file() and (tmp_path / "eval" / "metrics.json").is_file()
