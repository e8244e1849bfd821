"""Bounded-memory paths: chunked exporters write the bytes of the whole-array writers; mmap'd checkpoints."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch
from plyfile import PlyData, PlyElement

import gsrecon.export.splat
import gsrecon.export.spz
import gsrecon.model.ply
from gsrecon.cli import main
from gsrecon.engine.checkpoints import load_checkpoint_file
from gsrecon.export import EXPORT_FORMATS, export_gaussians
from gsrecon.model.ply import ply_property_names, render_mode_comments
from tests.test_export import _params

CHUNKED = ("ply", "splat", "compressed_ply", "spz")


def _write(tmp_path, monkeypatch, fmt: str, rows: int) -> bytes:
    """The bytes ``fmt``'s writer produces for `_params` when it converts ``rows`` Gaussians at a time."""
    for module in (gsrecon.model.ply, gsrecon.export.splat, gsrecon.export.spz):
        monkeypatch.setattr(module, "WRITE_CHUNK_ROWS", rows)
    path = tmp_path / f"{fmt}_{rows}.bin"
    export_gaussians(_params(n=301), path, fmt, antialiased=True)
    return path.read_bytes()


@pytest.mark.parametrize("fmt", CHUNKED)
def test_chunked_exports_equal_one_chunk(tmp_path, monkeypatch, fmt):
    assert fmt in EXPORT_FORMATS
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
