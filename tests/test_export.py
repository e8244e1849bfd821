"""Export formats: layouts checked against their specs, round trips within each format's quantisation error."""

from __future__ import annotations

import gzip
import math
import struct
import sys

import numpy as np
import pytest
import torch
from plyfile import PlyData

from gsrecon.export import export_gaussians
from gsrecon.export.compressed_ply import CHUNK_SIZE, load_compressed_ply, morton_order
from gsrecon.export.splat import save_splat
from gsrecon.export.spz import load_spz, save_spz
from gsrecon.model.ply import load_ply, ply_antialiased
from gsrecon.registry import EXPORT_REGISTRY, RegistryError
from gsrecon.sh import SH_C0


def _params(n: int = 300, sh_degree: int = 3, seed: int = 0) -> dict[str, torch.Tensor]:
    """Gaussians whose values lie inside every format's representable range."""
    gen = torch.Generator().manual_seed(seed)
    k = (sh_degree + 1) ** 2 - 1
    return {
        "means": torch.randn(n, 3, generator=gen) * 3,
        "scales": torch.randn(n, 3, generator=gen) - 4,
        "quats": torch.randn(n, 4, generator=gen),
        "opacities": torch.randn(n, generator=gen) * 2,
        "sh0": torch.rand(n, 1, 3, generator=gen) * 4 - 2,
        "shN": torch.rand(n, k, 3, generator=gen) * 1.8 - 0.9,
    }


def _unit(quats: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``quats`` normalised, with the sign (the same rotation) that brings them closest to ``like``."""
    quats = torch.nn.functional.normalize(quats, dim=1)
    return quats * torch.where((quats * like).sum(dim=1, keepdim=True) < 0, -1.0, 1.0)


def test_export_refuses_an_unknown_format(tmp_path):
    known = "compressed_ply, glb, lod, mesh, ply, sog, splat, spz"
    message = f"^unknown export format 'obj'; known export formats: {known}$"
    with pytest.raises(RegistryError, match=message):
        export_gaussians(_params(), tmp_path / "scene.obj", "obj")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fmt", [name for name in EXPORT_REGISTRY.names() if not EXPORT_REGISTRY.get(name).needs])
def test_every_format_of_the_gaussians_alone_writes_its_file(tmp_path, fmt):  # the mesh: tests/test_mesh.py
    path = export_gaussians(_params(n=10), tmp_path / f"scene.{fmt}", fmt, antialiased=True)
    assert path == tmp_path / f"scene.{fmt}" and path.stat().st_size > 0
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # written atomically: no temporary left


def test_ply_round_trip_records_the_render_mode(tmp_path):
    params = _params()
    export_gaussians(params, tmp_path / "scene.ply", "ply", antialiased=True)
    assert ply_antialiased(tmp_path / "scene.ply") is True
    loaded = load_ply(tmp_path / "scene.ply")
    assert all(torch.equal(loaded[key], params[key]) for key in params)


def test_splat_layout(tmp_path):
    params = _params(n=20, sh_degree=1)
    path = tmp_path / "scene.splat"
    save_splat(path, params)
    raw = path.read_bytes()
    assert len(raw) == 32 * 20
    records = np.frombuffer(
        raw, dtype=[("position", "<f4", 3), ("scale", "<f4", 3), ("rgba", "u1", 4), ("rot", "u1", 4)]
    )
    opacity = torch.sigmoid(params["opacities"])
    importance = torch.exp(params["scales"].sum(1)) * opacity
    order = torch.argsort(importance, descending=True).numpy()
    assert np.array_equal(records["position"], params["means"].numpy()[order])  # exact, sorted by importance
    assert np.allclose(records["scale"], torch.exp(params["scales"]).numpy()[order], rtol=1e-6)
    rgb = (0.5 + SH_C0 * params["sh0"][:, 0]).clamp(0, 1).numpy()[order]
    assert np.abs(records["rgba"][:, :3] / 255.0 - rgb).max() <= 1 / 255 + 1e-6
    assert np.abs(records["rgba"][:, 3] / 255.0 - opacity.numpy()[order]).max() <= 1 / 255 + 1e-6
    quats = torch.nn.functional.normalize(params["quats"], dim=1).numpy()[order]
    assert np.abs((records["rot"].astype(np.float64) - 128) / 128 - quats).max() <= 1 / 128 + 1e-6


@pytest.mark.parametrize("sh_degree", [0, 3])
def test_compressed_ply_round_trip(tmp_path, sh_degree):
    params = _params(n=600, sh_degree=sh_degree)  # 3 chunks, the last one partial
    path = tmp_path / "scene.compressed.ply"
    export_gaussians(params, path, "compressed_ply", antialiased=True)
    ply = PlyData.read(str(path))
    assert [(e.name, e.count) for e in ply.elements][:2] == [("chunk", 3), ("vertex", 600)]
    assert ("sh" in ply) == (sh_degree > 0) and ply_antialiased(path) is True
    order = morton_order(params["means"])
    expected = {key: value[order] for key, value in params.items()}
    loaded = load_compressed_ply(path)
    assert {key: value.shape for key, value in loaded.items()} == {key: value.shape for key, value in params.items()}

    chunk = {name: np.repeat(ply["chunk"][name], CHUNK_SIZE)[:600] for name in ply["chunk"].data.dtype.names}
    steps = np.array([2047, 1023, 2047])  # 11-10-11 bits
    for key, names in [("means", ("x", "y", "z")), ("scales", ("scale_x", "scale_y", "scale_z"))]:
        span = np.stack([chunk[f"max_{n}"] - chunk[f"min_{n}"] for n in names], axis=1)  # [N, 3]
        error = (loaded[key] - expected[key]).abs().numpy()
        assert (error <= span / steps / 2 + 1e-5).all(), key
    color_span = np.stack([chunk[f"max_{c}"] - chunk[f"min_{c}"] for c in "rgb"], axis=1)
    assert ((loaded["sh0"] - expected["sh0"]).abs()[:, 0].numpy() <= color_span / 255 / 2 / SH_C0 + 1e-5).all()
    opacity_error = (torch.sigmoid(loaded["opacities"]) - torch.sigmoid(expected["opacities"])).abs()
    assert opacity_error.max() <= 0.5 / 255 + 1e-6
    quats = _unit(expected["quats"], loaded["quats"])
    assert (loaded["quats"] - quats).abs().max() <= 2e-3  # three 10-bit components, the largest derived
    assert ((loaded["shN"] - expected["shN"]).abs() <= 8 / 256 / 2 + 1e-6).all()


def test_compressed_ply_chunks_are_compact(tmp_path):
    params = _params(n=2048, sh_degree=0)
    export_gaussians(params, tmp_path / "scene.compressed.ply", "compressed_ply")
    chunk = PlyData.read(str(tmp_path / "scene.compressed.ply"))["chunk"]
    chunk_volume = np.prod([chunk[f"max_{a}"] - chunk[f"min_{a}"] for a in "xyz"], axis=0)  # [C]
    scene_volume = np.prod((params["means"].amax(0) - params["means"].amin(0)).numpy())
    assert np.median(chunk_volume) < scene_volume / 8  # Morton order: a chunk is a small part of the scene


def test_compressed_ply_packs_the_reference_bits(tmp_path):
    params = _params(n=1, sh_degree=0)
    params["quats"] = torch.tensor([[-0.8, 0.0, 0.6, 0.0]])  # largest |w| is negative: stored as -q
    export_gaussians(params, tmp_path / "one.compressed.ply", "compressed_ply")
    vertex = PlyData.read(str(tmp_path / "one.compressed.ply"))["vertex"]
    color, rotation = int(vertex["packed_color"][0]), int(vertex["packed_rotation"][0])
    assert color & 255 == math.floor(torch.sigmoid(params["opacities"][0]).item() * 255 + 0.5)
    assert color >> 8 == 0  # one Gaussian: its colour is its chunk's minimum
    fields = [(rotation >> shift) & 1023 for shift in (20, 10, 0)]  # x, y, z of -q
    assert rotation >> 30 == 0 and fields == [512, math.floor((-0.6 * math.sqrt(0.5) + 0.5) * 1023 + 0.5), 512]


@pytest.mark.parametrize("version", [2, 3])
def test_spz_layout_follows_the_spec(tmp_path, version):
    params = _params(n=7, sh_degree=1)
    save_spz(tmp_path / "scene.spz", params, antialiased=True, version=version)
    raw = gzip.decompress((tmp_path / "scene.spz").read_bytes())
    magic, file_version, n, degree, bits, flags, reserved = struct.unpack("<IIIBBBB", raw[:16])
    assert (magic, file_version, n, degree, bits, flags, reserved) == (0x5053474E, version, 7, 1, 12, 1, 0)
    assert raw[:4] == b"NGSP"
    assert len(raw) == 16 + 7 * (9 + 1 + 3 + 3 + (3 if version == 2 else 4) + 9)
    positions = np.frombuffer(raw[16 : 16 + 9 * 7], np.uint8).reshape(7, 3, 3).astype(np.int64)
    fixed = positions[..., 0] | positions[..., 1] << 8 | positions[..., 2] << 16
    fixed = np.where(fixed >= 1 << 23, fixed - (1 << 24), fixed)
    rub = params["means"].numpy() * np.array([1, -1, -1])  # SPZ axes: right, up, back
    assert np.abs(fixed / 4096 - rub).max() <= 0.5 / 4096 + 1e-6


@pytest.mark.parametrize("version", [2, 3])
def test_spz_round_trip(tmp_path, version):
    params = _params(n=300, sh_degree=3)
    save_spz(tmp_path / "scene.spz", params, antialiased=version == 3, version=version)
    loaded, antialiased = load_spz(tmp_path / "scene.spz")
    assert antialiased is (version == 3)
    assert {key: value.shape for key, value in loaded.items()} == {key: value.shape for key, value in params.items()}
    assert (loaded["means"] - params["means"]).abs().max() <= 0.5 / 4096 + 1e-6
    assert (loaded["scales"] - params["scales"]).abs().max() <= 0.5 / 16 + 1e-6
    assert (loaded["sh0"] - params["sh0"]).abs().max() <= 0.5 / 255 / 0.15 + 1e-5
    opacity_error = (torch.sigmoid(loaded["opacities"]) - torch.sigmoid(params["opacities"])).abs()
    assert opacity_error.max() <= 0.5 / 255 + 1e-6
    sh_error = (loaded["shN"] - params["shN"]).abs()
    assert sh_error[:, :3].max() <= 4.5 / 128 + 1e-6 and sh_error[:, 3:].max() <= 8.5 / 128 + 1e-6  # 5 / 4 bits
    if version == 3:
        assert (loaded["quats"] - _unit(params["quats"], loaded["quats"])).abs().max() <= 2e-3
    else:  # x, y, z in 8 bits with w >= 0
        xyz_error = (loaded["quats"] - _unit(params["quats"], loaded["quats"]))[:, 1:].abs()
        assert xyz_error.max() <= 0.5 / 127.5 + 1e-6


def test_spz_sh_follows_the_axis_turn(tmp_path):
    """Rest SH coefficients change sign as the reference's flipSh says for RDF to RUB (x kept, y and z negated)."""
    params = _params(n=15, sh_degree=3)
    params["shN"] = torch.eye(15)[:, :, None].expand(15, 15, 3) * 0.5  # Gaussian i: coefficient i is 0.5
    save_spz(tmp_path / "scene.spz", params)
    raw = gzip.decompress((tmp_path / "scene.spz").read_bytes())
    sh = np.frombuffer(raw[-15 * 45 :], np.uint8).reshape(15, 15, 3).astype(int)  # coefficient-major, channel inner
    reference = np.array([-1, -1, 1, -1, 1, 1, -1, 1, -1, 1, -1, -1, 1, -1, 1])
    assert np.array_equal(np.diagonal(sh, axis1=0, axis2=1), np.repeat(128 + 64 * reference[None], 3, axis=0))


def test_spz_fewer_fractional_bits_for_large_scenes(tmp_path):
    params = _params(n=5, sh_degree=0)
    params["means"][0, 0] = 5000.0  # does not fit 24 bits with 12 fractional bits; does with 10
    save_spz(tmp_path / "big.spz", params)
    assert gzip.decompress((tmp_path / "big.spz").read_bytes())[13] == 10
    loaded, _ = load_spz(tmp_path / "big.spz")
    assert (loaded["means"] - params["means"]).abs().max() <= 0.5 / 1024 + 1e-6


def test_spz_refuses_bad_files(tmp_path):
    path = tmp_path / "bad.spz"
    path.write_bytes(gzip.compress(struct.pack("<IIIBBBB", 0x5053474E, 3, 10**9, 0, 12, 0, 0) + b"\0" * 100))
    with pytest.raises(ValueError, match="bad.spz: the header declares 1000000000 Gaussians, more than a"):
        load_spz(path)
    path.write_bytes(b"NGSP" + b"\0" * 28)
    with pytest.raises(ValueError, match="bad.spz: SPZ version 4"):
        load_spz(path)
    save_spz(path, _params(n=50))
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes())[:-10]))
    with pytest.raises(ValueError, match="bad.spz: truncated"):
        load_spz(path)


def test_the_mesh_without_its_libraries_names_the_install_command(tmp_path, monkeypatch):
    from gsrecon.errors import InputError
    from gsrecon.export import ExportContext

    monkeypatch.setitem(sys.modules, "skimage.measure", None)  # as where scikit-image is not installed
    context = ExportContext(train_batches=lambda: iter(()), render=lambda batch: None)
    with pytest.raises(InputError, match=r"needs skimage.*pip install 'gsrecon\[mesh\]'"):
        export_gaussians(_params(), tmp_path / "mesh.ply", "mesh", context=context)
    assert list(tmp_path.iterdir()) == []
