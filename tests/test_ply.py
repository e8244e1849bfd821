"""The reference 3DGS .ply layout (exact round trip, reference files) and the .splat web-viewer layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from plyfile import PlyData, PlyElement

from gsrecon.model.ply import load_ply, ply_antialiased, save_ply


def _params(n: int = 50, sh_degree: int = 3, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    k = (sh_degree + 1) ** 2 - 1
    return {
        "means": torch.randn(n, 3, generator=gen) * 10,
        "scales": torch.randn(n, 3, generator=gen) - 3,
        "quats": torch.randn(n, 4, generator=gen),
        "opacities": torch.randn(n, generator=gen) * 2,
        "sh0": torch.randn(n, 1, 3, generator=gen),
        "shN": torch.randn(n, k, 3, generator=gen) * 0.1,
    }


def _reference_names(num_rest: int) -> list[str]:
    """The property list of the reference implementation's save_ply, written out independently."""
    names = ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
    names += [f"f_rest_{i}" for i in range(3 * num_rest)]
    names += ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    return names


def test_round_trip_is_bit_exact(tmp_path):
    params = _params()
    params["means"][0] = torch.tensor([-0.0, 1e-40, 3.4e38])  # signed zero, denormal, near float32 max
    save_ply(tmp_path / "scene.ply", params)
    loaded = load_ply(tmp_path / "scene.ply")
    assert loaded.keys() == params.keys()
    for key, value in params.items():
        assert loaded[key].dtype == torch.float32 and loaded[key].shape == value.shape
        assert torch.equal(loaded[key].view(torch.int32), value.view(torch.int32)), key


@pytest.mark.parametrize("sh_degree", [0, 1, 3])
def test_layout_matches_reference(tmp_path, sh_degree):
    params = _params(n=7, sh_degree=sh_degree)
    path = tmp_path / "scene.ply"
    save_ply(path, params)
    assert path.read_bytes().startswith(
        b"ply\nformat binary_little_endian 1.0\ncomment SplatRenderMode: default\ncomment antialiased 0\n"
        b"element vertex 7\n"
    )
    ply = PlyData.read(str(path))
    assert [e.name for e in ply.elements] == ["vertex"]
    vertex = ply["vertex"]
    num_rest = (sh_degree + 1) ** 2 - 1
    assert [p.name for p in vertex.properties] == _reference_names(num_rest)
    assert all(p.val_dtype == "f4" for p in vertex.properties)
    raw = path.read_bytes()
    body = raw[raw.index(b"end_header\n") + len(b"end_header\n") :]
    names = _reference_names(num_rest)
    rows = np.frombuffer(body, dtype="<f4").reshape(7, len(names))  # packed little-endian float32 rows
    assert np.array_equal(rows[:, names.index("nx")], np.zeros(7, np.float32))
    assert np.array_equal(rows[:, names.index("x")], params["means"][:, 0].numpy())
    assert np.array_equal(rows[:, names.index("f_dc_2")], params["sh0"][:, 0, 2].numpy())
    assert np.array_equal(rows[:, names.index("opacity")], params["opacities"].numpy())
    assert np.array_equal(rows[:, names.index("scale_1")], params["scales"][:, 1].numpy())
    assert np.array_equal(rows[:, names.index("rot_3")], params["quats"][:, 3].numpy())


def test_f_rest_is_channel_major(tmp_path):
    params = _params(n=4, sh_degree=3)
    k = torch.arange(15, dtype=torch.float32)[None, :, None]
    c = torch.arange(3, dtype=torch.float32)[None, None, :]
    params["shN"] = (100 * c + k).expand(4, 15, 3).clone()  # coefficient k of channel c is 100 c + k
    save_ply(tmp_path / "scene.ply", params)
    vertex = PlyData.read(str(tmp_path / "scene.ply"))["vertex"]
    for j in range(45):  # all of red's coefficients, then green's, then blue's
        assert (vertex[f"f_rest_{j}"] == 100 * (j // 15) + j % 15).all(), j


def _write_reference_ply(
    path, n: int, num_rest: int, normals: bool = True, extra: bool = False
) -> dict[str, np.ndarray]:
    """A .ply as other 3DGS tools write it (maybe without normals, with an extra property); returns its columns."""
    rng = np.random.default_rng(1)
    names = [name for name in _reference_names(num_rest) if normals or name not in ("nx", "ny", "nz")]
    dtype = [(name, "<f4") for name in names] + ([("red", "u1")] if extra else [])
    data = np.zeros(n, dtype=dtype)
    for name in names:
        data[name] = rng.standard_normal(n).astype(np.float32)
    if extra:
        data["red"] = 200
    PlyData([PlyElement.describe(data, "vertex")], byte_order="<").write(str(path))
    return {name: data[name] for name in names}


@pytest.mark.parametrize(("normals", "extra"), [(True, False), (False, True)])
def test_reads_reference_files(tmp_path, normals, extra):
    path = tmp_path / "point_cloud.ply"
    columns = _write_reference_ply(path, n=9, num_rest=8, normals=normals, extra=extra)  # SH degree 2
    loaded = load_ply(path)
    assert loaded["shN"].shape == (9, 8, 3)
    assert np.array_equal(loaded["means"][:, 2].numpy(), columns["z"])
    assert np.array_equal(loaded["sh0"][:, 0, 1].numpy(), columns["f_dc_1"])
    assert np.array_equal(loaded["opacities"].numpy(), columns["opacity"])
    assert np.array_equal(loaded["scales"][:, 2].numpy(), columns["scale_2"])
    assert np.array_equal(loaded["quats"][:, 0].numpy(), columns["rot_0"])
    for j in range(24):
        assert np.array_equal(loaded["shN"][:, j % 8, j // 8].numpy(), columns[f"f_rest_{j}"]), j


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not a readable PLY"),
        (b"solid cube\nfacet normal 0 0 1\n", "not a readable PLY"),
        (None, "header declares 10 'vertex' rows, more than the"),  # a valid header, the data cut short
    ],
)
def test_broken_files(tmp_path, content, message):
    path = tmp_path / "broken.ply"
    if content is None:
        save_ply(path, _params(n=10))
        content = path.read_bytes()[:-100]
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"broken.ply.*{message}"):
        load_ply(path)


def test_incomplete_files(tmp_path):
    path = tmp_path / "partial.ply"
    data = np.zeros(3, dtype=[(name, "<f4") for name in _reference_names(15) if name != "opacity"])
    PlyData([PlyElement.describe(data, "vertex")]).write(str(path))
    with pytest.raises(ValueError, match=r"partial.ply: missing 3DGS properties \['opacity'\]"):
        load_ply(path)

    data = np.zeros(3, dtype=[(name, "<f4") for name in _reference_names(5)])  # 15 f_rest: no SH degree fits
    PlyData([PlyElement.describe(data, "vertex")]).write(str(path))
    with pytest.raises(ValueError, match="partial.ply: 15 f_rest_"):
        load_ply(path)

    PlyData([PlyElement.describe(np.zeros(3, dtype=[("x", "<f4")]), "point")]).write(str(path))
    with pytest.raises(ValueError, match="partial.ply: no 'vertex' element"):
        load_ply(path)

    with pytest.raises(FileNotFoundError, match="missing.ply"):
        load_ply(tmp_path / "missing.ply")


def test_save_rejects_bad_params(tmp_path):
    params = _params(n=5)
    params["opacities"] = params["opacities"][:, None]  # [N, 1] instead of [N]
    with pytest.raises(ValueError, match="'opacities' has shape \\(5, 1\\)"):
        save_ply(tmp_path / "scene.ply", params)
    params = _params(n=5)
    del params["shN"]
    with pytest.raises(ValueError, match="missing \\['shN'\\]"):
        save_ply(tmp_path / "scene.ply", params)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("antialiased", [True, False])
def test_render_mode_is_recorded(tmp_path, antialiased):
    path = tmp_path / "scene.ply"
    save_ply(path, _params(n=5), antialiased=antialiased)
    comments = PlyData.read(str(path)).comments
    assert comments == [f"SplatRenderMode: {'mip' if antialiased else 'default'}", f"antialiased {int(antialiased)}"]
    assert ply_antialiased(path) is antialiased
    assert torch.equal(load_ply(path)["means"], _params(n=5)["means"])  # the comments change nothing else


@pytest.mark.parametrize(
    ("comments", "expected"),
    [
        ([], None),  # reference 3DGS files say nothing
        (["antialiased 1"], True),  # Postshot's spelling
        (["SplatRenderMode: mip"], True),  # Brush's spelling
        (["Vertical axis: y", "SplatRenderMode: default"], False),
        (["antialiased 1", "SplatRenderMode: default"], False),  # the last one wins
        (["antialiased yes"], None),  # not a recognised value
    ],
)
def test_reads_render_mode_of_other_tools(tmp_path, comments, expected):
    path = tmp_path / "scene.ply"
    data = np.zeros(2, dtype=[(name, "<f4") for name in _reference_names(0)])
    PlyData([PlyElement.describe(data, "vertex")], comments=comments).write(str(path))
    assert ply_antialiased(path) is expected


@pytest.mark.parametrize(
    ("key", "index", "value", "prop"),
    [
        ("means", (3, 0), float("nan"), "x"),
        ("opacities", (1,), float("inf"), "opacity"),
        ("quats", (0, 2), float("-inf"), "rot_2"),
        ("shN", (2, 2, 1), float("nan"), "f_rest_17"),  # coefficient 2 of green: 15 + 2
    ],
)
def test_refuses_non_finite_values(tmp_path, key, index, value, prop):
    params = _params(n=6)
    params[key][index] = value
    save_ply(tmp_path / "scene.ply", params)
    with pytest.raises(
        ValueError, match=rf"scene.ply: property '{prop}' has 1 NaN/inf values \(first at row {index[0]}\)"
    ):
        load_ply(tmp_path / "scene.ply")


def test_refuses_an_empty_scene(tmp_path):
    save_ply(tmp_path / "empty.ply", _params(n=0))
    with pytest.raises(ValueError, match="empty.ply: element 'vertex' has 0 Gaussians"):
        load_ply(tmp_path / "empty.ply")


@pytest.mark.parametrize("fmt", ["binary_little_endian", "ascii"])
def test_refuses_a_header_claiming_more_rows_than_the_file_holds(tmp_path, fmt):
    names = _reference_names(0)
    header = f"ply\nformat {fmt} 1.0\nelement vertex {10**12}\n"
    header += "".join(f"property float {name}\n" for name in names) + "end_header\n"
    rows = b"\0" * 4 * len(names) * 3 if fmt != "ascii" else ("0 " * len(names) + "\n").encode() * 3
    path = tmp_path / "huge.ply"
    path.write_bytes(header.encode() + rows)
    with pytest.raises(ValueError, match=f"huge.ply: the header declares {10**12} 'vertex' rows, more than the"):
        load_ply(path)
