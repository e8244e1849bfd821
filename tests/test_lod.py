"""Levels of detail: moment-matched merges, `gsrecon lod` (levels trained on the photos, resumable) and the streamed
SOG site of `gsrecon export --format lod` (lod-meta.json last), read back by the PlayCanvas engine in Chromium."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_config, write_yaml
from PIL import Image

from gsrecon.cli import main
from gsrecon.config import parse_structured
from gsrecon.engine.checkpoints import load_checkpoint_file
from gsrecon.engine.inference import load_trained_scene, scene_run
from gsrecon.engine.run_dir import RunDir
from gsrecon.engine.trainer import DefaultTrainer
from gsrecon.export.lod.merge import halve, merge_pairs, neighbour_pairs
from gsrecon.export.lod.site import CameraRegion, LodSiteConfig, write_lod_site
from gsrecon.geometry import quat_scale_to_factor
from gsrecon.lod.export import block_cells
from gsrecon.lod.levels import level_loaders, read_levels
from gsrecon.logging.console import Logger


def _gaussians(n: int, seed: int = 0, spread: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "means": torch.randn(n, 3, generator=g) * spread,
        "scales": torch.rand(n, 3, generator=g) * 2 - 4,
        "quats": torch.randn(n, 4, generator=g),
        "opacities": torch.randn(n, generator=g),
        "sh0": torch.randn(n, 1, 3, generator=g),
        "shN": torch.randn(n, 3, 3, generator=g),
    }


def _covariance(p: dict[str, torch.Tensor]) -> torch.Tensor:
    factor = quat_scale_to_factor(p["quats"].double(), torch.exp(p["scales"].double()))
    return factor @ factor.transpose(1, 2)  # [N, 3, 3]


def test_a_merged_pair_keeps_its_parents_mass_mean_covariance_and_colour() -> None:
    p = _gaussians(2)
    merged = merge_pairs(p, torch.tensor([[0, 1]]))
    mass = torch.sigmoid(p["opacities"].double()) * torch.exp(p["scales"].double()).prod(dim=1)  # [2]
    w = mass / mass.sum()
    mean = (w[:, None] * p["means"].double()).sum(0)
    offsets = p["means"].double() - mean
    cov = (w[:, None, None] * (_covariance(p) + offsets[:, :, None] * offsets[:, None, :])).sum(0)
    merged_mass = torch.sigmoid(merged["opacities"].double()) * torch.exp(merged["scales"].double()).prod(dim=1)
    assert torch.allclose(merged_mass, mass.sum()[None], rtol=1e-4)
    assert torch.allclose(merged["means"].double(), mean[None], atol=1e-6)
    assert torch.allclose(_covariance(merged)[0], cov, rtol=1e-3, atol=1e-9)
    assert torch.allclose(merged["shN"].double(), (w[:, None, None] * p["shN"].double()).sum(0)[None], atol=1e-6)


def test_halving_pairs_each_gaussian_once_with_a_near_neighbour() -> None:
    p = _gaussians(1001)
    pairs = neighbour_pairs(p["means"])
    assert pairs.shape == (500, 2) and len(torch.unique(pairs)) == 1000
    gaps = (p["means"][pairs[:, 0]] - p["means"][pairs[:, 1]]).norm(dim=1)
    spacing = torch.cdist(p["means"], p["means"]).fill_diagonal_(math.inf).min(dim=1).values.median()
    assert gaps.median() < 2 * spacing  # neighbours, not random partners
    half = halve(p)
    assert len(half["means"]) == 501 and all(torch.isfinite(v).all() for v in half.values())


def _leaves(node: dict) -> list[dict]:
    return [node] if "lods" in node else [leaf for child in node["children"] for leaf in _leaves(child)]


def _chunk_count(path: Path) -> int:
    return json.loads(path.read_text())["count"]


def _chunk_means(meta_path: Path) -> torch.Tensor:
    """A SOG chunk's centres [count, 3] in storage order, decoded from its 16-bit log positions."""
    meta = json.loads(meta_path.read_text())
    low, high = (
        np.asarray(Image.open(meta_path.parent / name).convert("RGB"), np.int64).reshape(-1, 3)
        for name in meta["means"]["files"]
    )
    fixed = torch.from_numpy(low + 256 * high)[: meta["count"]].double()  # [count, 3]
    lo, hi = (torch.tensor(meta["means"][key], dtype=torch.float64) for key in ("mins", "maxs"))
    logs = lo + fixed / 65535 * (hi - lo)
    return torch.sign(logs) * torch.expm1(logs.abs())


def _chunk_cells(site: Path, meta: dict, levels: list[torch.Tensor], cell_of) -> dict[int, torch.Tensor]:
    """Per chunk (its index in ``filenames``): the cell of each of its rows, each decoded centre taken as the
    nearest of its level's centres ``levels`` [N_k, 3] (the decoded ones are 16-bit approximations)."""
    cells = {}
    for file, name in enumerate(meta["filenames"]):
        decoded = _chunk_means(site / name)
        exact = levels[int(name.split("_")[0])].double()
        cells[file] = cell_of(exact[torch.cdist(decoded, exact).argmin(dim=1)])
    return cells


def _leaf_cells(node: dict, chunk_cells: dict[int, torch.Tensor]) -> set[int]:
    """The cells of the Gaussians under ``node``."""
    if "children" in node:
        return set().union(*(_leaf_cells(child, chunk_cells) for child in node["children"]))
    runs = node["lods"].values()
    return {c for e in runs for c in chunk_cells[e["file"]][e["offset"] : e["offset"] + e["count"]].tolist()}


def _assert_cells_are_subtrees(tree: dict, chunk_cells: dict[int, torch.Tensor]) -> None:
    """No chunk holds two cells' Gaussians, and each cell's Gaussians are the whole of one subtree."""
    assert all(len(torch.unique(cells)) == 1 for cells in chunk_cells.values())
    tops: list[int] = []  # the cell of each largest subtree holding one cell

    def walk(node: dict) -> None:
        mine = _leaf_cells(node, chunk_cells)
        if len(mine) == 1:
            tops.extend(mine)
        else:
            for child in node["children"]:
                walk(child)

    walk(tree)
    assert sorted(tops) == sorted({c for cells in chunk_cells.values() for c in cells.tolist()})


def test_the_site_splits_chunks_by_count_and_puts_far_gaussians_in_the_environment(tmp_path: Path) -> None:
    fine = _gaussians(6000, spread=3.0)
    fine["means"][:50] *= 100  # far outside the cameras
    coarse = halve(fine)
    out = tmp_path / "site" / "lod-meta.json"
    region = CameraRegion((0.0, 0.0, 0.0), 2.0)
    meta = write_lod_site(out, [lambda: fine, lambda: coarse], LodSiteConfig(chunk_count=2), region)
    far = [int((p["means"].norm(dim=1) > 16).sum()) for p in (fine, coarse)]
    assert meta["counts"] == [6000 - far[0], len(coarse["means"]) - far[1]]
    assert _chunk_count(out.parent / "env" / "meta.json") == far[0] == 50
    leaves = _leaves(json.loads(out.read_text())["tree"])
    assert len(leaves) > 2  # split: more than 2048 Gaussians per node
    for level in (0, 1):
        runs = sorted((e["file"], e["offset"], e["count"]) for leaf in leaves if (e := leaf["lods"].get(str(level))))
        assert sum(count for _, _, count in runs) == meta["counts"][level]
        for file in {f for f, _, _ in runs}:  # each chunk's leaves tile its rows
            mine = [(offset, count) for f, offset, count in runs if f == file]
            assert [offset for offset, _ in mine] == list(np.cumsum([0] + [c for _, c in mine])[:-1])
            assert _chunk_count(out.parent / meta["filenames"][file]) == sum(c for _, c in mine)
            assert meta["filenames"][file].startswith(f"{level}_")


def test_cells_become_subtrees_split_further_by_count(tmp_path: Path) -> None:
    fine = _gaussians(6000, spread=3.0)
    coarse = halve(fine)

    def bands(means: torch.Tensor) -> torch.Tensor:  # three cells: x < -1, -1 <= x < 1, x >= 1
        return torch.bucketize(means[:, 0].contiguous(), torch.tensor([-1.0, 1.0]), right=True)

    out = tmp_path / "site" / "lod-meta.json"
    meta = write_lod_site(out, [lambda: fine, lambda: coarse], LodSiteConfig(chunk_count=1), None, cells=bands)
    assert len(_leaves(meta["tree"])) > 6  # more than 1024 Gaussians per cell: split inside the cells too
    chunk_cells = _chunk_cells(out.parent, meta, [fine["means"], coarse["means"]], bands)
    _assert_cells_are_subtrees(meta["tree"], chunk_cells)
    assert sorted(torch.cat(list(chunk_cells.values())).unique().tolist()) == [0, 1, 2]


def interrupted_in_second_pass(fine: dict[str, torch.Tensor]) -> Callable[[], dict[str, torch.Tensor]]:
    """A level loader giving ``fine`` halved, that raises KeyboardInterrupt when called the second time: in the
    pass that writes the chunks."""
    calls = []

    def load() -> dict[str, torch.Tensor]:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return halve(fine)

    return load


def test_a_site_interrupted_while_writing_has_no_lod_meta(tmp_path: Path) -> None:
    fine = _gaussians(500)
    out = tmp_path / "site" / "lod-meta.json"
    write_lod_site(out, [lambda: fine], LodSiteConfig(), None)
    with pytest.raises(KeyboardInterrupt):
        write_lod_site(out, [lambda: fine, interrupted_in_second_pass(fine)], LodSiteConfig(), None, overwrite=True)
    assert not out.exists() and (out.parent / "0_0" / "meta.json").exists()


@pytest.fixture(scope="module")
def lod_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny trained run (32x24 photos) with `gsrecon lod --levels 2 --steps 3` built in it."""
    root = tmp_path_factory.mktemp("lod")
    cfg = tiny_config(root / "run", root / "cache", max_steps=20, val_interval=20)
    DefaultTrainer(parse_structured(DefaultTrainer.Config, cfg)).train()
    assert main(["lod", "--exp-dir", str(root / "run"), "--levels", "2", "--steps", "3"]) == 0
    return root / "run"


def test_lod_builds_levels_of_half_the_gaussians_at_half_the_resolution(lod_run: Path, capsys) -> None:
    levels = read_levels(lod_run)["levels"]
    scene = load_trained_scene(exp_dir=str(lod_run))
    n = len(scene.params["means"])
    assert [r["gaussians"] for r in levels] == [(n + 1) // 2, ((n + 1) // 2 + 1) // 2]
    assert [r["factor"] for r in levels] == [2, 4]
    assert all(math.isfinite(r["psnr"]) for r in levels)
    log = (lod_run / "lod" / "level_2" / "run" / "train.log").read_text()
    assert "at 8x6" in log and "from a PLY" in log  # trained on the photos at a quarter of 32x24
    assert main(["lod", "--exp-dir", str(lod_run), "--levels", "2", "--steps", "3"]) == 0  # again: both kept
    assert capsys.readouterr().out.count("kept") == 2


def test_export_lod_writes_a_site_and_refuses_to_overwrite_one(lod_run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "site" / "lod-meta.json"
    args = ["export", "--exp-dir", str(lod_run), "--format", "lod", "--out", str(out), "lod.levels_ply=true"]
    assert main(args) == 0
    meta = json.loads(out.read_text())
    assert meta["version"] == 1 and meta["lodLevels"] == 3
    chunks = [out.parent / name for name in meta["filenames"]]
    assert all(p.is_file() for p in chunks) and max(p.stat().st_mtime for p in chunks) <= out.stat().st_mtime
    assert sorted(p.name for p in (out.parent / "levels").iterdir()) == ["level_0.ply", "level_1.ply", "level_2.ply"]
    capsys.readouterr()
    assert main(args) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0


@pytest.mark.parametrize(
    "command, named",
    [
        (["lod", "--levels", "0"], "--levels"),
        (["lod", "--levels", "-1"], "--levels"),
        (["export", "--format", "lod", "lod.chunk_count=0"], "chunk_count"),
        (["export", "--format", "lod", "lod.env_threshold=nan"], "env_threshold"),
        (["export", "--format", "lod", "lod.env_threshold=-1"], "env_threshold"),
    ],
)
def test_bad_lod_input_is_one_line_and_exit_2(lod_run: Path, tmp_path: Path, capsys, command, named) -> None:
    out = ["--out", str(tmp_path / "site" / "lod-meta.json")] if command[0] == "export" else []
    assert main([*command, "--exp-dir", str(lod_run), *out]) == 2
    err = capsys.readouterr().err.strip()
    assert named in err and len(err.splitlines()) == 1
    assert not (tmp_path / "site").exists()


def test_playcanvas_in_chromium_draws_the_site_as_gsrecon_renders_it(
    lod_run: Path, tmp_path: Path, web_readers, chromium: str
):
    from lod_browser import draw_site

    out = tmp_path / "site" / "lod-meta.json"
    assert main(["export", "--exp-dir", str(lod_run), "--format", "lod", "--out", str(out)]) == 0
    scene = load_trained_scene(exp_dir=str(lod_run))
    run = scene_run(scene, "cpu", Logger())
    pipeline = run.datapipeline
    batch = next(iter(pipeline.val_batches()))
    frame = pipeline.scene.test[0]
    expected = run.renderer.render_batch(scene.params, batch, scene.sh_degree).image[0].clamp(0, 1).numpy()
    background = tuple(pipeline.fixed_background().tolist())
    shot = draw_site(
        chromium, web_readers, out.parent, frame.viewmat.numpy(), frame.K.numpy(), frame.width, frame.height,
        background, 0, tmp_path / "chromium",
    )  # fmt: skip
    Image.fromarray(shot).save(tmp_path / "playcanvas_level0.png")
    Image.fromarray((expected * 255 + 0.5).astype(np.uint8)).save(tmp_path / "gsrecon_level0.png")
    psnr = -10 * math.log10(float(((shot / 255.0 - expected) ** 2).mean()))
    assert psnr >= 25.0, f"PlayCanvas's picture is {psnr:.2f} dB from gsrecon's ({tmp_path})"


@pytest.mark.slow  # 3 s on a quiet 2-core machine: CI's slow run (the default run stays under 5 min)
def test_a_merged_block_run_gets_levels_and_a_site(make_config, tmp_path: Path) -> None:
    cfg = make_config("blocks", max_steps=6, val_interval=6, partition={"blocks": 2})
    assert main(["train", "--config", str(write_yaml(tmp_path / "blocks.yaml", cfg))]) == 0
    exp_dir = tmp_path / "blocks"
    out = tmp_path / "site" / "lod-meta.json"
    assert main(["lod", "--exp-dir", str(exp_dir), "--levels", "1", "--steps", "2"]) == 0
    assert main(["export", "--exp-dir", str(exp_dir), "--format", "lod", "--out", str(out)]) == 0
    scene = load_trained_scene(exp_dir=str(exp_dir))
    merged = len(scene.params["means"])
    meta = json.loads(out.read_text())
    assert meta["counts"] == [merged, (merged + 1) // 2]
    # The blocks' cells are the tree's top: each holds the Gaussians the merge kept from its block.
    levels = [level()["means"] for level in level_loaders(scene, exp_dir, 1)]
    chunk_cells = _chunk_cells(out.parent, meta, levels, block_cells(exp_dir))
    _assert_cells_are_subtrees(meta["tree"], chunk_cells)
    kept = json.loads((exp_dir / "metrics.json").read_text())["kept_per_block"]
    level_0 = torch.cat([cells for file, cells in chunk_cells.items() if meta["filenames"][file].startswith("0_")])
    assert torch.bincount(level_0).tolist() == kept and len(meta["tree"]["children"]) == 2


def test_levels_start_their_per_view_modules_from_the_runs_trained_ones(make_config, tmp_path: Path) -> None:
    views = {"pose_opt": {"name": "se3", "trust_px": 0}}  # every view refined
    cfg = make_config("views", max_steps=14, val_interval=14, views=views)  # 2 epochs of 7 training views
    assert main(["train", "--config", str(write_yaml(tmp_path / "views.yaml", cfg))]) == 0
    assert main(["lod", "--exp-dir", str(tmp_path / "views"), "--levels", "1", "--steps", "2"]) == 0
    trained = load_trained_scene(exp_dir=str(tmp_path / "views")).views
    level = RunDir(tmp_path / "views" / "lod" / "level_1" / "run").latest_checkpoint()
    tuned = load_checkpoint_file(level)["views"]
    run, now = trained["pose_opt"]["module"]["twists"], tuned["pose_opt"]["module"]["twists"]  # [7, 6]
    # The rows of the views that the level's 2 steps did not visit hold what the run trained them to (not zero).
    kept = (now == run).all(dim=1) & (run != 0).any(dim=1)  # [7]
    assert int(kept.sum()) >= 4


@pytest.mark.slow  # trains two levels for the default 100 steps each: 5 s on a quiet machine
def test_export_lod_of_a_run_without_levels_builds_them_first_and_says_so(make_config, tmp_path: Path, capsys):
    cfg = make_config("plain", max_steps=4, val_interval=4)
    assert main(["train", "--config", str(write_yaml(tmp_path / "plain.yaml", cfg))]) == 0
    capsys.readouterr()
    out = tmp_path / "site" / "lod-meta.json"
    assert main(["export", "--exp-dir", str(tmp_path / "plain"), "--format", "lod", "--out", str(out)]) == 0
    assert "no levels of detail yet: building 2 first" in capsys.readouterr().err.replace("\n", " ")
    assert json.loads(out.read_text())["lodLevels"] == 3 and len(read_levels(tmp_path / "plain")["levels"]) == 2


def test_a_run_with_a_sky_carries_it_in_the_sites_environment_as_far_gaussians(make_config, tmp_path: Path, capsys):
    cfg = make_config("sky", max_steps=4, val_interval=4, views={"sky": {"name": "environment", "resolution": 4}})
    assert main(["train", "--config", str(write_yaml(tmp_path / "sky.yaml", cfg))]) == 0
    exp_dir = tmp_path / "sky"
    assert main(["lod", "--exp-dir", str(exp_dir), "--levels", "1", "--steps", "2"]) == 0
    capsys.readouterr()
    out = tmp_path / "site" / "lod-meta.json"
    assert main(["export", "--exp-dir", str(exp_dir), "--format", "lod", "--out", str(out)]) == 0
    assert "the trained sky joins the environment as 96 Gaussians" in capsys.readouterr().err.replace("\n", " ")
    meta = json.loads(out.read_text())
    assert meta["environment"] == "env/meta.json"
    assert _chunk_count(out.parent / "env" / "meta.json") >= 6 * 4 * 4  # the sky, and any far Gaussians of level 0


def test_export_hook_writes_the_lod_site_that_gsrecon_export_writes(make_config, tmp_path: Path, capsys) -> None:
    config = write_yaml(tmp_path / "run.yaml", make_config("run", max_steps=4, val_interval=4))
    exp_dir = tmp_path / "run"
    assert main(["train", "--config", str(config)]) == 0
    assert main(["lod", "--exp-dir", str(exp_dir), "--levels", "1", "--steps", "2"]) == 0
    exported = tmp_path / "exported" / "lod-meta.json"
    assert main(["export", "--exp-dir", str(exp_dir), "--format", "lod", "--out", str(exported)]) == 0
    hook = ["hooks.ExportHook.format=lod", "hooks.ExportHook.path=site/lod-meta.json"]
    assert main(["train", "--config", str(config), "--resume", *hook]) == 0  # at max_steps: the hook runs at once
    written = exp_dir / "site"
    files = sorted(path.relative_to(exported.parent) for path in exported.parent.rglob("*") if path.is_file())
    assert files == sorted(path.relative_to(written) for path in written.rglob("*") if path.is_file())
    assert all((written / name).read_bytes() == (exported.parent / name).read_bytes() for name in files)
    capsys.readouterr()
    bad = "hooks.ExportHook.format=lod"  # its path stays point_cloud.ply
    assert main(["train", "--config", str(config), "--overwrite", bad]) == 2
    err = capsys.readouterr().err
    assert "hooks.ExportHook" in err and "lod-meta.json" in err and len(err.strip().splitlines()) == 1
    assert (exp_dir / "site" / "lod-meta.json").is_file()  # refused before the run folder was replaced


@pytest.mark.slow  # trains two levels for the default 100 steps each inside the run's ExportHook
def test_export_hook_builds_the_levels_under_the_runs_own_lock(make_config, tmp_path: Path) -> None:
    hooks = {**make_config()["hooks"], "ExportHook": {"format": "lod", "path": "site/lod-meta.json"}}
    config = write_yaml(tmp_path / "run.yaml", make_config("run", max_steps=4, val_interval=4, hooks=hooks))
    assert main(["train", "--config", str(config)]) == 0
    assert json.loads((tmp_path / "run" / "site" / "lod-meta.json").read_text())["lodLevels"] == 3
    assert len(read_levels(tmp_path / "run")["levels"]) == 2
