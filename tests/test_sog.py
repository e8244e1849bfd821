"""SOG export, read back by a decoder written from the published spec
(developer.playcanvas.com/user-manual/gaussian-splatting/formats/sog), not from the encoder."""

from __future__ import annotations

import io
import json
import math
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gsrecon.cli import main
from gsrecon.engine.checkpoints import load_checkpoint_file
from gsrecon.export import export_gaussians
from gsrecon.export.compressed_ply import morton_order
from gsrecon.export.sog import save_sog

IMAGES = ["means_l.webp", "means_u.webp", "scales.webp", "quats.webp", "sh0.webp"]
SH_IMAGES = ["shN_centroids.webp", "shN_labels.webp"]
SPEC_REST_COEFFS = {1: 3, 2: 8, 3: 15}  # rest coefficients per channel for shN.bands


def _params(n: int = 600, sh_degree: int = 3, seed: int = 0) -> dict[str, torch.Tensor]:
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


def _reader(path: Path) -> Callable[[str], bytes]:
    """The bytes of a SOG file by name: members of a bundle, or files beside a ``meta.json``."""
    if path.name == "meta.json":
        return lambda name: (path.parent / name).read_bytes()
    archive = zipfile.ZipFile(path)
    return archive.read


def _decode_sog(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """meta.json and every Gaussian's decoded values (float64), as the spec's decoding formulas give them."""
    read = _reader(path)
    meta = json.loads(read("meta.json"))
    n = meta["count"]

    def image(name: str) -> np.ndarray:  # [H, W, 4] int64
        return np.asarray(Image.open(io.BytesIO(read(name))).convert("RGBA")).astype(np.int64)

    def texels(name: str) -> np.ndarray:  # [n, 4]: texel i at x = i % W, y = i // W
        pixels = image(name)
        assert pixels.shape[0] * pixels.shape[1] >= n
        return pixels.reshape(-1, 4)[:n]

    low, high = (texels(name) for name in meta["means"]["files"])
    mins, maxs = np.array(meta["means"]["mins"]), np.array(meta["means"]["maxs"])
    v = mins + (maxs - mins) * ((high[:, :3] << 8) + low[:, :3]) / 65535
    quats = texels(meta["quats"]["files"][0])
    abc = (quats[:, :3] / 255 - 0.5) * math.sqrt(2)
    d = np.sqrt(np.maximum(0, 1 - (abc**2).sum(1)))
    mode = quats[:, 3] - 252
    assert set(mode) <= {0, 1, 2, 3}
    a, b, c = abc.T
    wxyz = {0: (d, a, b, c), 1: (a, d, b, c), 2: (a, b, d, c), 3: (a, b, c, d)}  # the spec's switch, as (w, x, y, z)
    sh0 = texels(meta["sh0"]["files"][0])
    decoded = {
        "means": np.sign(v) * (np.exp(np.abs(v)) - 1),
        "quats": np.stack([np.where(mode == m, np.stack(wxyz[m]), 0) for m in range(4)]).sum(0).T,
        "largest": mode,
        "scales": np.array(meta["scales"]["codebook"])[texels(meta["scales"]["files"][0])[:, :3]],
        "sh0": np.array(meta["sh0"]["codebook"])[sh0[:, :3]],
        "opacity": sh0[:, 3] / 255,
    }
    if "shN" in meta:
        k = SPEC_REST_COEFFS[meta["shN"]["bands"]]
        centroids = image(meta["shN"]["files"][0])
        assert centroids.shape[1] == 64 * k
        labels = texels(meta["shN"]["files"][1])
        label = labels[:, 0] + (labels[:, 1] << 8)
        assert label.max() < meta["shN"]["count"]
        x = (label % 64)[:, None] * k + np.arange(k)  # [n, K]: coefficient j of an entry at row label // 64
        indices = centroids[(label // 64)[:, None], x, :3]  # [n, K, 3]: red, green, blue
        decoded["shN"] = np.array(meta["shN"]["codebook"])[indices]
    return meta, decoded


def _log(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.log1p(np.abs(x))


def _assert_nearest_codebook_entry(values: np.ndarray, decoded: np.ndarray, codebook: list[float]) -> None:
    """Each value decodes to its nearest codebook entry (the best a 256-entry codebook can do)."""
    assert len(codebook) == 256
    best = np.abs(values[..., None] - np.array(codebook)).min(-1)
    assert np.all(np.abs(values - decoded) <= best + 1e-12)


@pytest.mark.parametrize("sh_degree", [0, 3])
def test_decodes_to_within_the_quantisation_step(tmp_path, sh_degree):
    params = _params(sh_degree=sh_degree)
    save_sog(tmp_path / "scene.sog", params, antialiased=sh_degree == 3)
    meta, got = _decode_sog(tmp_path / "scene.sog")
    assert meta["version"] == 2 and meta["count"] == 600 and meta["antialias"] is (sh_degree == 3)
    assert ("shN" in meta) is (sh_degree > 0) and zipfile.ZipFile(tmp_path / "scene.sog").namelist() == [
        *IMAGES,
        *(SH_IMAGES if sh_degree else []),
        "meta.json",
    ]
    want = {key: value[morton_order(params["means"])].double().numpy() for key, value in params.items()}
    step = (np.array(meta["means"]["maxs"]) - np.array(meta["means"]["mins"])) / 65535  # [3], log domain
    assert np.all(np.abs(_log(got["means"]) - _log(want["means"])) <= step / 2 * (1 + 1e-6))
    quats = want["quats"] / np.linalg.norm(want["quats"], axis=1, keepdims=True)
    quats *= np.sign((quats * got["quats"]).sum(1, keepdims=True))  # q and -q are the same rotation
    stored = np.arange(4) != got["largest"][:, None]  # [N, 4]: the three components in the image
    assert np.abs(got["quats"] - quats)[stored].max() <= math.sqrt(2) / 2 / 255 + 1e-9
    assert np.abs(got["quats"] - quats).max() < 0.02  # the largest, rebuilt from the other three
    assert np.all(np.abs(got["opacity"] - 1 / (1 + np.exp(-want["opacities"]))) <= 0.5 / 255 + 1e-9)
    _assert_nearest_codebook_entry(want["scales"], got["scales"], meta["scales"]["codebook"])
    _assert_nearest_codebook_entry(want["sh0"][:, 0], got["sh0"], meta["sh0"]["codebook"])
    for decoded, values in ((got["scales"], want["scales"]), (got["sh0"], want["sh0"][:, 0])):
        rms = np.sqrt(((decoded - values) ** 2).mean())
        assert rms < (values.max() - values.min()) / 256 / 2  # better than half a step of an even 8-bit grid
    if sh_degree:
        assert meta["shN"]["bands"] == 3 and meta["shN"]["count"] == 512  # the largest power of two <= 600
        rms = np.sqrt(((got["shN"] - want["shN"]) ** 2).mean())
        assert rms < 0.75 * np.sqrt((want["shN"] ** 2).mean())  # random 45-D coefficients barely cluster


def test_clustered_sh_and_few_distinct_values_are_exact(tmp_path):
    params = _params(n=3000, sh_degree=2)
    gen = torch.Generator().manual_seed(1)
    centres = torch.randint(-16, 17, (12, 8, 3), generator=gen) / 16  # 12 sets of SH on a 1/16 grid
    params["shN"] = centres[torch.randint(0, 12, (3000,), generator=gen)]
    params["scales"] = torch.randint(-40, 0, (3000, 3), generator=gen) / 8  # 40 distinct values
    save_sog(tmp_path / "scene.sog", params)
    meta, got = _decode_sog(tmp_path / "scene.sog")
    want = {key: value[morton_order(params["means"])].double().numpy() for key, value in params.items()}
    assert meta["shN"]["bands"] == 2 and meta["shN"]["count"] <= 2048  # the largest power of two <= 3000, or fewer
    assert np.array_equal(got["shN"], want["shN"]) and np.array_equal(got["scales"], want["scales"])


def test_same_scene_same_bytes_and_the_unbundled_folder_holds_the_same_files(tmp_path):
    params = _params(n=700)
    save_sog(tmp_path / "a.sog", params)
    save_sog(tmp_path / "b.sog", {key: value.clone() for key, value in params.items()})
    assert (tmp_path / "a.sog").read_bytes() == (tmp_path / "b.sog").read_bytes()
    save_sog(tmp_path / "folder" / "meta.json", params)
    bundle = zipfile.ZipFile(tmp_path / "a.sog")
    assert sorted(p.name for p in (tmp_path / "folder").iterdir()) == sorted(bundle.namelist())
    for name in bundle.namelist():
        assert (tmp_path / "folder" / name).read_bytes() == bundle.read(name), name
        if name.endswith(".webp"):
            assert bundle.read(name)[12:16] == b"VP8L", f"{name} is not lossless WebP"
    assert _decode_sog(tmp_path / "folder" / "meta.json")[0] == _decode_sog(tmp_path / "a.sog")[0]


def test_refuses_empty_scenes_and_sh_degree_4_before_writing(tmp_path):
    (tmp_path / "scene.sog").write_bytes(b"old")
    with pytest.raises(ValueError, match="no Gaussians"):
        save_sog(tmp_path / "scene.sog", _params(n=0))
    with pytest.raises(ValueError, match="SH degree 4, above the highest gsrecon renders"):
        export_gaussians(_params(n=20, sh_degree=4), tmp_path / "scene.sog", "sog")
    assert [p.name for p in tmp_path.iterdir()] == ["scene.sog"] and (tmp_path / "scene.sog").read_bytes() == b"old"


def test_export_cli_writes_sog_and_refuses_an_empty_scene_in_one_line(make_trainer, tmp_path, capsys):
    trainer = make_trainer(max_steps=3)
    trainer.train()
    ckpt = trainer.run_dir.latest_checkpoint()
    out = tmp_path / "scene.sog"
    assert main(["export", "--checkpoint", str(ckpt), "--device", "cpu", "--format", "sog", "--out", str(out)]) == 0
    params = load_checkpoint_file(ckpt)["params"]
    meta, got = _decode_sog(out)
    want = params["means"][morton_order(params["means"])].double().numpy()
    step = (np.array(meta["means"]["maxs"]) - np.array(meta["means"]["mins"])) / 65535
    assert meta["count"] == params["means"].shape[0] and "shN" in meta
    assert np.all(np.abs(_log(got["means"]) - _log(want)) <= step / 2 * (1 + 1e-6))

    checkpoint = torch.load(ckpt, weights_only=True)
    checkpoint["params"] = {key: value[:0] for key, value in checkpoint["params"].items()}
    torch.save(checkpoint, tmp_path / "empty.pt")
    capsys.readouterr()
    empty = ["export", "--checkpoint", str(tmp_path / "empty.pt"), "--format", "sog", "--out", str(tmp_path / "e.sog")]
    assert main(empty) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no Gaussians" in err, err
    assert not (tmp_path / "e.sog").exists()
