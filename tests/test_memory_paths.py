"""Bounded-memory paths: chunked exporters write the bytes of the whole-array writers; mmap'd checkpoints;
PLY loading without whole-scene temporaries; no image-metric imports where no metric is computed."""

from __future__ import annotations

import gzip
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
import torch
from plyfile import PlyData, PlyElement

import gsrecon.engine.checkpoints
import gsrecon.export.compressed_ply
import gsrecon.export.sog
import gsrecon.export.splat
import gsrecon.export.spz
import gsrecon.io.ply
import gsrecon.model.ply
from gsrecon.cli import main
from gsrecon.engine.checkpoints import load_checkpoint_file, non_finite
from gsrecon.export import export_gaussians
from gsrecon.model.ply import ply_property_names, render_mode_comments, save_ply
from gsrecon.registry import EXPORT_REGISTRY
from tests.test_export import _params

CHUNKED = ("ply", "splat", "compressed_ply", "spz")


def _write(tmp_path, monkeypatch, fmt: str, rows: int) -> bytes:
    """The bytes ``fmt``'s writer produces for `_params` when it converts ``rows`` Gaussians at a time."""
    for module in (gsrecon.io.ply, gsrecon.export.splat, gsrecon.export.spz):
        monkeypatch.setattr(module, "WRITE_CHUNK_ROWS", rows)
    path = tmp_path / f"{fmt}_{rows}.bin"
    export_gaussians(_params(n=301), path, fmt, antialiased=True)
    return path.read_bytes()


@pytest.mark.parametrize("fmt", CHUNKED)
def test_chunked_exports_equal_one_chunk(tmp_path, monkeypatch, fmt):
    assert fmt in EXPORT_REGISTRY
    whole = _write(tmp_path, monkeypatch, fmt, 10**9)
    assert _write(tmp_path, monkeypatch, fmt, 7) == whole  # 301 = 43 chunks of 7
    assert _write(tmp_path, monkeypatch, fmt, 256) == whole  # a partial last chunk


def test_chunked_ply_equals_plyfile_whole_array_write(tmp_path, monkeypatch):
    chunked = _write(tmp_path, monkeypatch, "ply", 50)
    p = {k: v.numpy() for k, v in _params(n=301).items()}
    n = len(p["means"])
    names = ply_property_names(p["shN"].shape[1])
    columns = np.concatenate(
        [p["means"], np.zeros((n, 3), np.float32), p["sh0"].reshape(n, 3),
         p["shN"].transpose(0, 2, 1).reshape(n, -1), p["opacities"][:, None], p["scales"], p["quats"]],
        axis=1,
    )  # fmt: skip
    vertices = np.empty(n, dtype=[(name, "<f4") for name in names])
    for i, name in enumerate(names):
        vertices[name] = columns[:, i]
    path = tmp_path / "reference.ply"
    PlyData(
        [PlyElement.describe(vertices, "vertex")], text=False, byte_order="<", comments=render_mode_comments(True)
    ).write(str(path))
    assert chunked == path.read_bytes()


def test_streamed_spz_equals_one_shot_gzip(tmp_path, monkeypatch):
    chunked = _write(tmp_path, monkeypatch, "spz", 11)
    assert gzip.compress(gzip.decompress(chunked), compresslevel=6, mtime=0) == chunked


def test_mmap_loaded_checkpoint_is_copy_on_write(tmp_path):
    params = {k: v.clone() for k, v in _params(n=50).items()}
    path = tmp_path / "ckpt.pt"
    torch.save({"step": 3, "params": params, "optimizers": {"means": {"exp_avg": torch.ones(50, 3)}}}, path)
    before = path.read_bytes()
    loaded = load_checkpoint_file(path)
    for key, value in params.items():
        assert torch.equal(loaded["params"][key], value), key
    loaded["params"]["means"].add_(1.0)  # an optimiser step on a resumed parameter
    assert path.read_bytes() == before
    assert torch.equal(load_checkpoint_file(path)["params"]["means"], params["means"])


def test_export_cli_from_a_checkpoint_matches_the_parameters(tmp_path, make_trainer):
    trainer = make_trainer(max_steps=3)
    trainer.train()
    ckpt = trainer.run_dir.latest_checkpoint()
    out = tmp_path / "scene.ply"
    assert main(["export", "--checkpoint", str(ckpt), "--device", "cpu", "--out", str(out)]) == 0
    loaded = gsrecon.model.ply.load_ply(out)
    params = load_checkpoint_file(ckpt)["params"]
    for key, value in loaded.items():
        torch.testing.assert_close(value, params[key], rtol=0, atol=0, msg=key)


def test_ply_loads_float32_without_whole_scene_temporaries(tmp_path):
    params = _params(n=100_000)  # 24 MB, well above the MiB its header check reads
    path = tmp_path / "scene.ply"
    save_ply(path, params)
    tracemalloc.start()  # numpy's buffers are traced; the returned tensors are torch's own
    try:
        loaded = gsrecon.model.ply.load_ply(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    for key, value in params.items():
        assert loaded[key].dtype == torch.float32 and torch.equal(loaded[key], value), key
    scene_bytes = sum(value.numel() * 4 for value in params.values())
    assert peak < scene_bytes / 8  # a few columns at a time, never the whole scene or a float64 copy


def test_non_finite_checks_rows_in_chunks(monkeypatch):
    monkeypatch.setattr(gsrecon.engine.checkpoints, "_FINITE_CHECK_ROWS", 3)
    late_nan = torch.zeros(10, 2)
    late_nan[9, 1] = float("nan")
    params = {"ok": torch.ones(10, 2), "late": late_nan, "scalar": torch.tensor(float("inf")), "empty": torch.ones(0)}
    assert non_finite(params) == ["late", "scalar"]


@pytest.mark.parametrize(
    ("module", "name", "rows"),
    [(gsrecon.export.compressed_ply, "_ENCODE_ROWS", 256), (gsrecon.export.sog, "_ASSIGN_CHUNK_ROWS", 5)],
)
def test_encoding_in_blocks_writes_the_same_bytes(tmp_path, monkeypatch, module, name, rows):
    fmt = "compressed_ply" if module is gsrecon.export.compressed_ply else "sog"
    whole = tmp_path / "whole"
    export_gaussians(_params(n=1001), whole, fmt)
    monkeypatch.setattr(module, name, rows)
    blocks = tmp_path / "blocks"
    export_gaussians(_params(n=1001), blocks, fmt)
    assert blocks.read_bytes() == whole.read_bytes()


@pytest.mark.slow  # 9 s on the 2 loaded cores: CI's slow run (the default run stays under 5 min)
def test_exporting_imports_no_image_metrics():
    """lpips, torchvision and torchmetrics' image package cost 0.4 GB of memory; only metrics need them."""
    code = "import sys, gsrecon.engine.inference, gsrecon.engine.trainer; print(sorted(sys.modules))"
    modules = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for heavy in ("lpips", "torchvision", "torchmetrics.functional.image"):
        assert f"'{heavy}'" not in modules, heavy
