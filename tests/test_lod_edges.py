"""The edges of levels of detail (issue 60): `gsrecon lod` resumed at or past a level's steps, damaged records of
its own (levels.json, partition.json, a site's lod-meta.json) refused in one line naming the file and the key, an
`export --format lod --overwrite` that removes only what a previous site wrote and only after every check, a
device or a run lock refused before anything is written, and a build stopped part-way that export does not pass
off as a whole one."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

import pytest
import torch
from conftest import tiny_config
from test_lod import _gaussians, interrupted_in_second_pass

from gsrecon.cli import EXIT_TERMINATED, main
from gsrecon.config import parse_structured
from gsrecon.engine.checkpoints import load_checkpoint_file
from gsrecon.engine.run_dir import RunDir
from gsrecon.engine.trainer import DefaultTrainer
from gsrecon.export.lod.site import LodSiteConfig, write_lod_site
from gsrecon.hooks import Hook
from gsrecon.lod.levels import read_levels
from gsrecon.records import ListOf, RecordError, read_record


class TermInLevelTwoHook(Hook):
    """Sends this process SIGTERM after the first step of level 2's training (a build stopped in level 2)."""

    def after_train_iter(self, trainer) -> None:
        if trainer.exp_dir.parent.name == "level_2" and trainer.step == 1:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny trained run (32x24 photos, 20 steps) without levels."""
    root = tmp_path_factory.mktemp("edges")
    cfg = tiny_config(root / "run", root / "cache", max_steps=20, val_interval=20)
    DefaultTrainer(parse_structured(DefaultTrainer.Config, cfg)).train()
    return root / "run"


@pytest.fixture
def run(trained: Path, tmp_path: Path) -> Path:
    """A copy of the trained run for one test."""
    return Path(shutil.copytree(trained, tmp_path / "run"))


def _lod(run: Path, steps: int, levels: int = 1, *extra: str) -> int:
    return main(["lod", "--exp-dir", str(run), "--levels", str(levels), "--steps", str(steps), *extra])


def _export(run: Path, out: Path, *extra: str) -> int:
    return main(["export", "--exp-dir", str(run), "--format", "lod", "--out", str(out), *extra])


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def _level_checkpoint(run: Path, level: int = 1) -> dict:
    return load_checkpoint_file(RunDir(run / "lod" / f"level_{level}" / "run").latest_checkpoint())


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (links not followed) by relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_fewer_steps_than_a_level_was_built_with_build_it_anew_and_more_resume_it(run: Path, capsys) -> None:
    assert _lod(run, 4) == 0
    four = _level_checkpoint(run)["params"]
    capsys.readouterr()
    assert _lod(run, 2) == 0  # the level's checkpoint is at step 4: past the 2 asked, so trained anew
    assert "its run is at step 4 at data.factor 2, not before step 2 at data.factor 2: trained anew" in " ".join(
        capsys.readouterr().err.split()
    )
    record = read_levels(run)["levels"][0]
    assert record["steps"] == 2 and _level_checkpoint(run)["step"] == 2 and record["psnr"] is not None
    assert _lod(run, 4) == 0  # from step 2 on to 4: as if built with 4 steps at once
    record = read_levels(run)["levels"][0]
    assert record["steps"] == 4 and record["psnr"] is not None
    assert all(torch.equal(value, _level_checkpoint(run)["params"][name]) for name, value in four.items())
    assert "resumed from" in (run / "lod" / "level_1" / "run" / "train.log").read_text()


def test_a_level_trained_to_its_steps_but_not_recorded_gets_its_psnr(run: Path, capsys) -> None:
    assert _lod(run, 3) == 0
    levels = run / "lod" / "levels.json"
    record = json.loads(levels.read_text())
    levels.write_text(json.dumps({**record, "levels": []}))  # killed after the level's last checkpoint
    capsys.readouterr()
    assert _lod(run, 3) == 0
    assert "test PSNR" in capsys.readouterr().out
    assert read_levels(run)["levels"][0]["psnr"] is not None


def test_a_level_recorded_without_a_psnr_is_kept_and_reported(run: Path, capsys) -> None:
    assert _lod(run, 2) == 0
    levels = run / "lod" / "levels.json"
    record = json.loads(levels.read_text())
    record["levels"][0]["psnr"] = None  # no test views, or an older gsrecon resumed past the level's steps
    levels.write_text(json.dumps(record))
    capsys.readouterr()
    assert _lod(run, 2) == 0
    assert "no test PSNR" in capsys.readouterr().out


def test_a_level_trained_at_another_factor_is_not_resumed(run: Path) -> None:
    assert _lod(run, 3, 1, "--scale", "1") == 0
    assert _lod(run, 6, 1, "--scale", "2") == 0
    checkpoint = _level_checkpoint(run)
    assert checkpoint["step"] == 6 and checkpoint["config"]["data"]["factor"] == 2
    assert "resumed from" not in (run / "lod" / "level_1" / "run" / "train.log").read_text()


@pytest.mark.parametrize(
    "content, named",
    [
        ('{"levels": [', "levels.json is not valid JSON (line 1"),
        ("[]", "levels.json: the record must be an object"),
        (b"\xff\xfe", "levels.json is not valid JSON (not UTF-8"),
        (
            '{"source_step": 20, "camera_region": null, "levels": [{"level": 1, "factor": "2", "steps": 2}]}',
            "key 'levels[0].factor' must be an integer",
        ),
        ('{"source_step": 20, "camera_region": {"center": [0, 0], "radius": 1}, "levels": []}', "camera_region.center"),
        ('{"source_step": 20, "camera_region": null}', "key 'levels' is missing"),
    ],
)
def test_a_corrupt_levels_json_is_one_line_naming_it_and_the_key(run: Path, tmp_path: Path, capsys, content, named):
    levels = run / "lod" / "levels.json"
    levels.parent.mkdir()
    levels.write_bytes(content if isinstance(content, bytes) else content.encode())
    capsys.readouterr()
    assert _lod(run, 2) == 2
    assert named in _one_line(capsys)
    assert _export(run, tmp_path / "site" / "lod-meta.json") == 2
    err = _one_line(capsys)
    assert named in err and str(levels) in err
    assert not (tmp_path / "site").exists() and levels.read_bytes() == (
        content if isinstance(content, bytes) else content.encode()
    )


@pytest.mark.parametrize(
    "content, named",
    [
        ('{"ground": {"origin"', "partition.json is not valid JSON"),
        ('{"ground": {}, "blocks": []}', "key 'ground.origin' is missing"),
    ],
)
def test_a_corrupt_partition_json_is_one_line_naming_it(run: Path, tmp_path: Path, capsys, content, named) -> None:
    assert _lod(run, 2) == 0
    (run / "partition.json").write_text(content)
    capsys.readouterr()
    assert _export(run, tmp_path / "site" / "lod-meta.json") == 2
    err = _one_line(capsys)
    assert named in err and str(run / "partition.json") in err
    assert not (tmp_path / "site").exists()


def test_overwrite_keeps_the_users_folders_and_refuses_one_in_the_way(run: Path, tmp_path: Path, capsys) -> None:
    assert _lod(run, 2) == 0
    site = tmp_path / "s"
    for name in ("2024_05/IMG_0001.jpg", "levels/notes.txt", "photo.jpg"):
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(b"mine")
    mine = _files(site)
    out = site / "lod-meta.json"
    assert _export(run, out, "--overwrite", "lod.levels_ply=true") == 0  # no site was there: nothing removed
    assert _export(run, out, "--overwrite") == 0  # this one replaces the first, level PLYs too
    assert {name: data for name, data in _files(site).items() if name in mine} == mine
    meta = json.loads(out.read_text())
    assert all((site / name).is_file() for name in meta["filenames"])
    assert sorted(p.name for p in (site / "levels").iterdir()) == ["notes.txt"]
    other = tmp_path / "other"
    (other / "0_0").mkdir(parents=True)
    (other / "0_0" / "meta.json").write_bytes(b"mine")  # a folder of the site's name that no site wrote there
    capsys.readouterr()
    assert _export(run, other / "lod-meta.json", "--overwrite") == 2
    assert f"{other / '0_0'} is in the way" in _one_line(capsys)
    assert _files(other) == {"0_0/meta.json": b"mine"}


def test_a_value_refused_while_writing_keeps_the_previous_site(run: Path, tmp_path: Path, capsys) -> None:
    assert _lod(run, 2) == 0
    out = tmp_path / "site" / "lod-meta.json"
    assert _export(run, out) == 0
    before = _files(out.parent)
    capsys.readouterr()
    assert _export(run, out, "--overwrite", "lod.env_threshold=0") == 2
    assert "lod.env_threshold=0" in _one_line(capsys)
    assert _files(out.parent) == before


def test_overwrite_over_a_symlinked_chunk_folder_replaces_the_link_not_its_target(run: Path, tmp_path: Path) -> None:
    assert _lod(run, 2) == 0
    out = tmp_path / "site" / "lod-meta.json"
    assert _export(run, out) == 0
    elsewhere = tmp_path / "elsewhere"
    shutil.move(out.parent / "0_0", elsewhere)
    (out.parent / "0_0").symlink_to(elsewhere, target_is_directory=True)
    kept = _files(elsewhere)
    assert _export(run, out, "--overwrite") == 0
    assert (out.parent / "0_0").is_dir() and not (out.parent / "0_0").is_symlink()
    assert (out.parent / "0_0" / "meta.json").is_file() and _files(elsewhere) == kept


@pytest.mark.parametrize(
    "name, content, named",
    [
        ("lod-meta.json", '{"filenames": ["../../home/meta.json"]}', "key 'filenames[0]' must be a string matching"),
        ("lod-meta.json", "{", "lod-meta.json is not valid JSON"),
        (".gsrecon-site", '{"gsrecon_site": 1, "outputs": ["/etc"]}', "key 'outputs[0]' must be a string matching"),
    ],
)
def test_a_damaged_record_of_a_previous_site_is_refused_before_anything_is_removed(
    tmp_path: Path, capsys, name: str, content: str, named: str
) -> None:
    fine = _gaussians(500)
    out = tmp_path / "site" / "lod-meta.json"
    write_lod_site(out, [lambda: fine], LodSiteConfig(), None)
    (out.parent / name).write_text(content)
    before = _files(out.parent)
    with pytest.raises(RecordError, match=re.escape(named)) as caught:
        write_lod_site(out, [lambda: fine], LodSiteConfig(), None, overwrite=True)
    assert str(out.parent / name) in str(caught.value)
    assert _files(out.parent) == before


def test_an_interrupted_site_is_replaced_by_the_next_overwrite(tmp_path: Path) -> None:
    fine = _gaussians(500)
    out = tmp_path / "site" / "lod-meta.json"
    with pytest.raises(KeyboardInterrupt):
        write_lod_site(out, [lambda: fine, interrupted_in_second_pass(fine)], LodSiteConfig(), None)
    assert not out.exists() and (out.parent / "0_0" / "meta.json").is_file()
    meta = write_lod_site(out, [lambda: fine], LodSiteConfig(), None, overwrite=True)
    written = {name.split("/")[0] for name in meta["filenames"]}
    assert {p.name for p in out.parent.iterdir()} == {*written, "lod-meta.json", ".gsrecon-site"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_lod_on_a_device_this_machine_lacks_writes_nothing(run: Path, capsys) -> None:
    before = sorted(p.name for p in run.iterdir())
    capsys.readouterr()
    assert _lod(run, 2, 1, "--device", "cuda") == 2
    assert "CUDA is not available" in _one_line(capsys)
    assert sorted(p.name for p in run.iterdir()) == before


def test_lod_refuses_a_run_another_process_holds(run: Path, capsys) -> None:
    holder = RunDir(run)
    holder.lock()  # as a training process holds it
    try:
        capsys.readouterr()
        assert _lod(run, 2) == 2
        err = _one_line(capsys)
        assert f"'{run}' is in use by gsrecon pid {os.getpid()}" in err
        assert not (run / "lod").exists()
    finally:
        holder.release()
    assert _lod(run, 2) == 0


def test_export_refuses_the_levels_of_a_build_stopped_in_level_2(run: Path, tmp_path: Path, capsys, hook_registry):
    hook_registry.register()(TermInLevelTwoHook)
    assert _lod(run, 2, 2, "hooks.TermInLevelTwoHook={}") == EXIT_TERMINATED
    out = tmp_path / "site" / "lod-meta.json"
    capsys.readouterr()
    assert _export(run, out) == 2
    err = _one_line(capsys)
    assert "level 2 of the 2 levels gsrecon lod was asked for is unfinished" in err
    assert f"gsrecon lod --exp-dir {run} --steps 2 --scale 2 --levels 1" in err
    assert not out.parent.exists()
    assert _lod(run, 2, 1) == 0  # keep the one finished level: a site of two levels, as asked now
    assert "kept" in capsys.readouterr().out
    assert _export(run, out) == 0 and json.loads(out.read_text())["lodLevels"] == 2


def test_the_record_reader_names_the_key_of_a_wrong_type(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text("[" * 100_000)
    with pytest.raises(RecordError, match="nested too deep"):
        read_record(path, ListOf(int), "fix it")
    path.write_text('{"a": [1, true]}')
    with pytest.raises(RecordError, match=r"key 'a\[1\]' must be an integer, got true; fix it"):
        read_record(path, {"a": ListOf(int)}, "fix it")
    assert read_record(path, {"a": ListOf((int, bool))}, "fix it") == {"a": [1, True]}
