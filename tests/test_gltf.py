"""glTF KHR_gaussian_splatting out and in: the layout read with a parser written here from the spec (Khronos's
extension README), the round trip PLY -> glb -> PLY, bad files, and the independent readers (glTF-Validator,
Babylon.js, PlayCanvas's splat-transform) where node and the web readers are installed."""

from __future__ import annotations

import base64
import json
import os
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_yaml

from gsrecon.cli import main
from gsrecon.config import parse_structured
from gsrecon.engine.trainer import DefaultTrainer
from gsrecon.errors import InputError
from gsrecon.export import export_gaussians
from gsrecon.model.gltf import load_gltf
from gsrecon.model.ply import load_ply, save_ply
from gsrecon.sh import SH_C0

KHR = "KHR_gaussian_splatting:"
COMPONENTS = {5121: "u1", 5126: "<f4"}
WIDTHS = {"SCALAR": 1, "VEC3": 3, "VEC4": 4}
ODD_ORDER = {1: [1, 0, 1], 2: [0, 1, 0, 1, 0], 3: [1, 0, 1, 0, 1, 0, 1]}  # coefficient n of degree d: m = n - d


def _params(n: int = 200, sh_degree: int = 3, seed: int = 0) -> dict[str, torch.Tensor]:
    """Gaussians with the values a float32 activation cannot give back: saturated opacities, scales near 1,
    quaternions far from unit length."""
    gen = torch.Generator().manual_seed(seed)
    k = (sh_degree + 1) ** 2 - 1
    return {
        "means": torch.randn(n, 3, generator=gen) * 3,
        "scales": torch.randn(n, 3, generator=gen) * 2 - 2,
        "quats": torch.randn(n, 4, generator=gen) * 3,
        "opacities": torch.randn(n, generator=gen) * 12,
        "sh0": torch.rand(n, 1, 3, generator=gen) * 4 - 2,
        "shN": torch.rand(n, k, 3, generator=gen) * 1.8 - 0.9,
    }


@pytest.fixture
def config(make_config, tmp_path: Path) -> Path:
    """A tiny run's config: the dataset `--ply` scenes are evaluated on."""
    return write_yaml(tmp_path / "config.yaml", make_config("run"))


def _parse_glb(path: Path) -> tuple[dict, bytes]:
    """The JSON and binary chunk of a GLB file (glTF 2.0 section 4.4)."""
    raw = path.read_bytes()
    magic, version, length = struct.unpack_from("<4sII", raw)
    assert (magic, version, length) == (b"glTF", 2, len(raw))
    json_length, json_type = struct.unpack_from("<I4s", raw, 12)
    assert json_type == b"JSON" and json_length % 4 == 0
    bin_length, bin_type = struct.unpack_from("<I4s", raw, 20 + json_length)
    assert bin_type == b"BIN\x00" and 28 + json_length + bin_length == len(raw)
    return json.loads(raw[20 : 20 + json_length]), raw[28 + json_length :]


def _pack_glb(document: dict, binary: bytes) -> bytes:
    text = json.dumps(document).encode()
    text += b" " * (-len(text) % 4)
    return (
        struct.pack("<4sII", b"glTF", 2, 28 + len(text) + len(binary))
        + struct.pack("<I4s", len(text), b"JSON")
        + text
        + struct.pack("<I4s", len(binary), b"BIN\x00")
        + binary
    )


def _attributes(document: dict, binary: bytes) -> dict[str, np.ndarray]:
    """Every attribute of the one primitive, as stored ([N, W]; tightly packed views, as gsrecon writes)."""
    out = {}
    for name, index in document["meshes"][0]["primitives"][0]["attributes"].items():
        accessor = document["accessors"][index]
        view = document["bufferViews"][accessor["bufferView"]]
        dtype = np.dtype(COMPONENTS[accessor["componentType"]])
        width = WIDTHS[accessor["type"]]
        data = binary[view["byteOffset"] : view["byteOffset"] + view["byteLength"]]
        assert view["byteOffset"] % 4 == 0 and len(data) == accessor["count"] * width * dtype.itemsize
        out[name] = np.frombuffer(data, dtype).reshape(accessor["count"], width)
    return out


def _rotation(q: np.ndarray) -> np.ndarray:
    """Rotation matrices [N, 3, 3] of unit quaternions (w, x, y, z) [N, 4]."""
    w, x, y, z = q.T
    return np.stack(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    ).transpose(2, 0, 1)


def test_glb_layout_follows_the_extension_in_playcanvas_axes(tmp_path):
    params = _params(n=50)
    export_gaussians(params, tmp_path / "scene.glb", "glb", antialiased=True)
    document, binary = _parse_glb(tmp_path / "scene.glb")
    primitive = document["meshes"][0]["primitives"][0]
    assert primitive["mode"] == 0 and document["extensionsUsed"] == ["KHR_gaussian_splatting"]
    assert primitive["extensions"]["KHR_gaussian_splatting"]["kernel"] == "ellipse"
    assert primitive["extensions"]["KHR_gaussian_splatting"]["colorSpace"] == "srgb_rec709_display"
    assert document["asset"]["version"] == "2.0" and document["asset"]["extras"] == {"antialiased": True}
    a = _attributes(document, binary)
    sh = [f"{KHR}SH_DEGREE_{d}_COEF_{n}" for d in range(4) for n in range(2 * d + 1)]
    exact = ["_GSRECON_ROTATION", "_GSRECON_LOG_SCALE", "_GSRECON_LOGIT_OPACITY"]
    assert set(a) == {"POSITION", "COLOR_0", f"{KHR}ROTATION", f"{KHR}SCALE", f"{KHR}OPACITY", *sh, *exact}
    p = {key: value.numpy().astype(np.float64) for key, value in params.items()}
    turn = np.array([-1.0, -1.0, 1.0])  # 180 degrees about z
    assert np.array_equal(a["POSITION"], (p["means"] * turn).astype(np.float32))
    position = document["accessors"][primitive["attributes"]["POSITION"]]
    assert position["min"] == a["POSITION"].min(0).tolist() and position["max"] == a["POSITION"].max(0).tolist()
    xyzw = a[f"{KHR}ROTATION"].astype(np.float64)
    assert np.abs(np.linalg.norm(xyzw, axis=1) - 1).max() < 1e-6  # unit quaternions
    unit = p["quats"] / np.linalg.norm(p["quats"], axis=1, keepdims=True)
    turned = np.diag(turn) @ _rotation(unit)  # the Gaussian's axes, turned with the scene
    assert np.abs(_rotation(xyzw[:, [3, 0, 1, 2]]) - turned).max() < 1e-5
    assert np.allclose(a[f"{KHR}SCALE"], np.exp(p["scales"]), rtol=1e-6)
    assert np.allclose(a[f"{KHR}OPACITY"][:, 0], 1 / (1 + np.exp(-p["opacities"])), rtol=1e-6, atol=1e-7)
    assert np.array_equal(a[f"{KHR}SH_DEGREE_0_COEF_0"], params["sh0"][:, 0].numpy())
    for d, odd in ODD_ORDER.items():  # a half-turn about z negates exactly the coefficients of odd order m
        for n, flips in enumerate(odd):
            rest = params["shN"][:, d * d - 1 + n].numpy()
            assert np.array_equal(a[f"{KHR}SH_DEGREE_{d}_COEF_{n}"], -rest if flips else rest), (d, n)
    srgb = np.clip(0.5 + SH_C0 * p["sh0"][:, 0], 0, 1)
    linear = np.where(srgb <= 0.04045, srgb / 12.92, ((srgb + 0.055) / 1.055) ** 2.4)
    assert document["accessors"][primitive["attributes"]["COLOR_0"]]["normalized"] is True
    assert np.abs(a["COLOR_0"][:, :3] / 255 - linear).max() <= 0.5 / 255 + 1e-9
    assert np.abs(a["COLOR_0"][:, 3] / 255 - 1 / (1 + np.exp(-p["opacities"]))).max() <= 0.5 / 255 + 1e-9


@pytest.mark.parametrize("suffix", [".glb", ".gltf"])
@pytest.mark.parametrize("sh_degree", [0, 3])
def test_ply_to_glb_to_ply_is_bit_exact(tmp_path, config, suffix, sh_degree):
    save_ply(tmp_path / "scene.ply", _params(sh_degree=sh_degree), antialiased=False)
    code = main(["export", "--ply", str(tmp_path / "scene.ply"), "--config", str(config), "--format",
                 "glb", "--out", str(tmp_path / f"scene{suffix}")])  # fmt: skip
    assert code == 0
    if suffix == ".gltf":
        assert json.loads((tmp_path / "scene.gltf").read_text())["buffers"][0]["uri"] == "scene.bin"
    assert main(["export", "--ply", str(tmp_path / f"scene{suffix}"), "--config", str(config),
                 "--format", "ply", "--out", str(tmp_path / "back.ply")]) == 0  # fmt: skip
    assert (tmp_path / "back.ply").read_bytes() == (tmp_path / "scene.ply").read_bytes()


def test_standard_attributes_alone_read_back_within_float32_rounding(tmp_path):
    params = _params()
    params["opacities"] = params["opacities"].clamp(-15, 15)  # beyond, the sigmoid is 0 or 1 in float32
    export_gaussians(params, tmp_path / "scene.glb", "glb", options={"exact": False})
    document, _ = _parse_glb(tmp_path / "scene.glb")
    assert not any(name.startswith("_") for name in document["meshes"][0]["primitives"][0]["attributes"])
    loaded = load_gltf(tmp_path / "scene.glb")
    for key in ("means", "sh0", "shN"):
        assert torch.equal(loaded[key], params[key]), key
    assert torch.allclose(loaded["scales"], params["scales"], atol=1e-6)
    assert torch.allclose(torch.sigmoid(loaded["opacities"]), torch.sigmoid(params["opacities"]), atol=1e-7)
    unit = torch.nn.functional.normalize(params["quats"], dim=1)
    assert torch.allclose(loaded["quats"], unit, atol=1e-6)


def test_standard_attributes_win_over_stale_exact_ones(tmp_path):
    """A tool that changes SCALE but keeps gsrecon's exact attribute: the changed scale is what is read."""
    params = _params(n=10)
    export_gaussians(params, tmp_path / "scene.glb", "glb")

    def grow(document: dict, binary: bytearray) -> None:  # Gaussian 3 doubles in size
        start = document["bufferViews"][_attribute(document, f"{KHR}SCALE")["bufferView"]]["byteOffset"] + 3 * 12
        binary[start : start + 12] = (np.frombuffer(binary, "<f4", 3, start) * 2).tobytes()

    loaded = load_gltf(_edit(tmp_path / "scene.glb", grow))
    assert torch.equal(loaded["scales"][[0, 1, 2, 4]], params["scales"][[0, 1, 2, 4]])
    assert torch.allclose(loaded["scales"][3], params["scales"][3] + np.log(2), atol=1e-6)


def _edit(path: Path, change: Callable[[dict, bytearray], None]) -> Path:
    """A copy of the glb ``path`` after ``change(document, binary)``."""
    document, binary = _parse_glb(path)
    binary = bytearray(binary)
    change(document, binary)
    edited = path.with_name("edited.glb")
    edited.write_bytes(_pack_glb(document, bytes(binary)))
    return edited


def _attribute(document: dict, name: str) -> dict:
    return document["accessors"][document["meshes"][0]["primitives"][0]["attributes"][name]]


def _drop(name: str) -> Callable[[dict, bytearray], None]:
    return lambda document, _: document["meshes"][0]["primitives"][0]["attributes"].pop(name)


def _nan_at(name: str, point: int) -> Callable[[dict, bytearray], None]:
    def change(document: dict, binary: bytearray) -> None:
        view = document["bufferViews"][_attribute(document, name)["bufferView"]]
        width = WIDTHS[_attribute(document, name)["type"]]
        struct.pack_into("<f", binary, view["byteOffset"] + 4 * width * point, float("nan"))

    return change


def _set(name: str, **fields) -> Callable[[dict, bytearray], None]:
    return lambda document, _: _attribute(document, name).update(fields)


def _value_at(name: str, value: float) -> Callable[[dict, bytearray], None]:
    def change(document: dict, binary: bytearray) -> None:
        struct.pack_into("<f", binary, document["bufferViews"][_attribute(document, name)["bufferView"]]["byteOffset"],
                         value)  # fmt: skip

    return change


BAD_FILES = {
    "missing scale": (_drop(f"{KHR}SCALE"), f"the splat primitive has no attribute '{KHR}SCALE'"),
    "missing SH coefficient": (
        _drop(f"{KHR}SH_DEGREE_2_COEF_3"),
        f"SH degree 2 is given but attribute '{KHR}SH_DEGREE_2_COEF_3' is missing",
    ),
    "a skipped SH degree": (
        lambda d, b: [_drop(f"{KHR}SH_DEGREE_1_COEF_{n}")(d, b) for n in range(3)],
        f"SH degree 2 is given but attribute '{KHR}SH_DEGREE_1_COEF_0' is missing",
    ),
    "opacity as a VEC3": (_set(f"{KHR}OPACITY", type="VEC3"), f"attribute '{KHR}OPACITY' is 'VEC3'; it must be SCALAR"),
    "rotation as unsigned ints": (
        _set(f"{KHR}ROTATION", componentType=5125),
        f"attribute '{KHR}ROTATION' has component type unsigned int; it must be one of: float, normalized signed byte",
    ),
    "a short count": (_set(f"{KHR}SCALE", count=9), f"attribute '{KHR}SCALE' has 9 values, but POSITION has 10"),
    "an accessor past its view": (
        _set(f"{KHR}SCALE", byteOffset=64),
        f"attribute '{KHR}SCALE' ends at byte 184 of its buffer view, which has 120",
    ),
    "NaN in a position": (
        _nan_at("POSITION", 7),
        "attribute 'POSITION' has NaN/inf values at 1 points .first at point 7",
    ),
    "NaN in an SH coefficient": (
        _nan_at(f"{KHR}SH_DEGREE_3_COEF_6", 2),
        f"attribute '{KHR}SH_DEGREE_3_COEF_6' has NaN/inf values",
    ),
    "a negative scale": (_value_at(f"{KHR}SCALE", -0.5), f"attribute '{KHR}SCALE' has values outside .0.0, inf."),
    "an opacity above 1": (_value_at(f"{KHR}OPACITY", 1.5), f"attribute '{KHR}OPACITY' has values outside .0.0, 1.0."),
    "another kernel": (
        lambda d, _: d["meshes"][0]["primitives"][0]["extensions"]["KHR_gaussian_splatting"].update(kernel="disk"),
        "KHR_gaussian_splatting kernel is 'disk'; gsrecon reads 'ellipse'",
    ),
    "a node transform": (
        lambda d, _: d["nodes"][0].update(scale=[2, 2, 2]),
        "node 0, which holds the splats, moves them with a transform .scale.",
    ),
    "triangles": (
        lambda d, _: d["meshes"][0]["primitives"][0].pop("mode"),
        "the KHR_gaussian_splatting primitive has mode 4; it must be 0",
    ),
    "a truncated buffer": (lambda d, b: b.__delitem__(slice(-200, None)), "buffer 0 declares .* bytes but holds"),
}


def test_quantised_attributes_of_other_writers_are_dequantised(tmp_path):
    """ROTATION as normalised signed shorts and OPACITY as normalised unsigned bytes, as the extension allows."""
    params = _params(n=6, sh_degree=1)
    export_gaussians(params, tmp_path / "scene.glb", "glb", options={"exact": False})
    rotation = np.array([[0, 0, 0, 32767], [32767, 0, 0, 0], [0, -32767, 0, 0]] * 2, "<i2")  # x, y, z, w
    opacity = np.array([0, 255, 51, 102, 153, 204], "u1")

    def quantise(document: dict, binary: bytearray) -> None:
        quantised = [(f"{KHR}ROTATION", rotation, 5122, "VEC4"), (f"{KHR}OPACITY", opacity, 5121, "SCALAR")]
        for name, data, component, kind in quantised:
            document["bufferViews"].append({"buffer": 0, "byteOffset": len(binary), "byteLength": data.nbytes})
            binary += data.tobytes() + b"\0" * (-data.nbytes % 4)
            accessor = {"bufferView": len(document["bufferViews"]) - 1, "componentType": component, "count": 6}
            document["accessors"].append({**accessor, "type": kind, "normalized": True})
            document["meshes"][0]["primitives"][0]["attributes"][name] = len(document["accessors"]) - 1
        document["buffers"][0]["byteLength"] = len(binary)

    loaded = load_gltf(_edit(tmp_path / "scene.glb", quantise))
    # Turned back into gsrecon's axes, (w, x, y, z): the file's identity, half-turns about x and y become half-turns
    # about z, y and x.
    assert torch.equal(loaded["quats"], torch.tensor([[0.0, 0, 0, -1], [0, 0, -1, 0], [0, -1, 0, 0]] * 2))
    assert torch.allclose(torch.sigmoid(loaded["opacities"]), torch.tensor([0, 1, 0.2, 0.4, 0.6, 0.8]), atol=1e-6)
    assert torch.equal(loaded["means"], params["means"]) and torch.equal(loaded["shN"], params["shN"])


def test_glb_export_refuses_another_file_ending_before_writing(tmp_path):
    with pytest.raises(InputError, match="scene.ply: a glTF file is named .glb .binary. or .gltf"):
        export_gaussians(_params(n=5), tmp_path / "scene.ply", "glb")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("quats", [0.0, 0, 0, 0], "has a zero quaternion, which is no rotation"),
        ("scales", [0.0, 88.73, 0], r"has a log scale of 88\.73, whose exp is infinite in float32 \(above 88\.72"),
    ],
)
def test_glb_export_refuses_what_gltf_cannot_hold_naming_the_file_and_the_gaussian(tmp_path, key, value, message):
    params = _params(n=10)
    params[key][[3, 6]] = torch.tensor(value)
    with pytest.raises(InputError, match=rf"^{tmp_path / 'scene.glb'}: not written: Gaussian 3 \(2 of 10\) {message}"):
        export_gaussians(params, tmp_path / "scene.glb", "glb")
    assert list(tmp_path.iterdir()) == []


def test_a_log_scale_just_under_float32s_limit_is_written_finite(tmp_path):
    params = _params(n=10)
    params["scales"][2, 1] = 88.72
    export_gaussians(params, tmp_path / "scene.glb", "glb")
    scale = _attributes(*_parse_glb(tmp_path / "scene.glb"))[f"{KHR}SCALE"]
    assert np.isfinite(scale).all() and scale[2, 1] > 3e38
    assert torch.equal(load_gltf(tmp_path / "scene.glb")["scales"], params["scales"])


def test_a_scene_glb_cannot_hold_is_one_line_and_exit_2_from_the_cli(tmp_path, config, capsys):
    params = _params(n=10)
    params["quats"][4] = 0
    save_ply(tmp_path / "scene.ply", params)
    code = main(["export", "--ply", str(tmp_path / "scene.ply"), "--config", str(config), "--format", "glb",
                 "--out", str(tmp_path / "scene.glb")])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and not (tmp_path / "scene.glb").exists()
    assert f"{tmp_path / 'scene.glb'}: not written: Gaussian 4 (1 of 10) has a zero quaternion" in err


@pytest.mark.parametrize("case", BAD_FILES)
def test_bad_glb_is_refused_naming_what(tmp_path, case):
    change, message = BAD_FILES[case]
    export_gaussians(_params(n=10), tmp_path / "scene.glb", "glb")
    edited = _edit(tmp_path / "scene.glb", change)
    with pytest.raises(InputError, match=f"^{edited}: {message}"):
        load_gltf(edited)


def test_bad_glb_is_one_line_and_exit_2_from_the_cli(tmp_path, config, capsys):
    export_gaussians(_params(n=10), tmp_path / "scene.glb", "glb")
    edited = _edit(tmp_path / "scene.glb", _nan_at(f"{KHR}OPACITY", 4))
    code = main(["eval", "--ply", str(edited), "--config", str(config), "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert str(edited) in err and f"'{KHR}OPACITY' has NaN/inf values at 1 points (first at point 4)" in err
    (tmp_path / "short.glb").write_bytes((tmp_path / "scene.glb").read_bytes()[:-100])
    assert main(["eval", "--ply", str(tmp_path / "short.glb"), "--config", str(config)]) == 2
    assert "short.glb: the GLB header declares" in capsys.readouterr().err


def test_a_trained_run_exported_as_glb_evaluates_and_initialises_as_its_ply(make_config, tmp_path):
    config = write_yaml(tmp_path / "train.yaml", make_config("trained", max_steps=4))
    assert main(["train", "--config", str(config)]) == 0
    run = tmp_path / "trained"
    assert main(["export", "--exp-dir", str(run), "--format", "glb", "--out", str(tmp_path / "scene.glb")]) == 0
    scores = {}
    for scene in ("scene.glb", "trained/point_cloud.ply"):
        out = tmp_path / f"eval_{Path(scene).suffix[1:]}"
        assert main(["eval", "--ply", str(tmp_path / scene), "--config", str(config), "--out", str(out)]) == 0
        scores[scene] = json.loads((out / "metrics.json").read_text())["mean"]["psnr"]
    assert scores["scene.glb"] == scores["trained/point_cloud.ply"]
    model = {"sh_degree": 1, "init": "ply", "init_path": str(tmp_path / "scene.glb")}  # model.init=ply takes a glb
    trainer = DefaultTrainer(parse_structured(DefaultTrainer.Config, make_config("again", model=model)))
    for key, value in load_ply(run / "point_cloud.ply").items():
        assert torch.equal(trainer.model.params[key].detach(), value), key


# The independent readers (node scripts; the web_readers fixture skips where node or the packages are missing).

VALIDATE = """
const fs = require('fs');
const path = require('path');
const validator = require('gltf-validator');
const file = process.argv[2];
const external = (uri) => Promise.resolve(new Uint8Array(fs.readFileSync(path.join(path.dirname(file),
    decodeURIComponent(uri)))));
validator.validateBytes(new Uint8Array(fs.readFileSync(file)), {maxIssues: 0, externalResourceFunction: external})
    .then((report) => console.log(JSON.stringify(report.issues)));
"""

BABYLON = """
import fs from 'fs';
import path from 'path';
import { pathToFileURL } from 'url';
const load = (name) => import(pathToFileURL(path.join(process.env.NODE_PATH, name)).href);
const { NullEngine } = await load('@babylonjs/core/Engines/nullEngine.js');
const { Scene } = await load('@babylonjs/core/scene.js');
const { ImportMeshAsync } = await load('@babylonjs/core/Loading/sceneLoader.js');
await load('@babylonjs/loaders/glTF/2.0/index.js');
globalThis.Worker = class { postMessage() {} terminate() {} };  // the depth-sorting worker: nothing is drawn here
const engine = new NullEngine();
const scene = new Scene(engine);
const result = await ImportMeshAsync(new Uint8Array(fs.readFileSync(process.argv[2])), scene,
                                     { pluginExtension: '.glb' });
const splats = result.meshes.filter((mesh) => mesh.getClassName() === 'GaussianSplattingMesh');
console.log(JSON.stringify(splats.map((mesh) => ({ count: mesh.renderedSplatCount, shDegree: mesh.shDegree,
                                                   positions: Array.from(mesh._splatPositions.slice(0, 8)) }))));
engine.dispose();
"""


def _node(web_readers: Path, script: Path, *args: str) -> str:
    """The standard output of ``node script args`` with the web readers on NODE_PATH; fails on a non-zero exit."""
    env = {**os.environ, "NODE_PATH": str(web_readers)}
    done = subprocess.run(["node", str(script), *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _script(tmp_path: Path, name: str, text: str) -> Path:
    (tmp_path / name).write_text(text)
    return tmp_path / name


@pytest.mark.parametrize("suffix", [".glb", ".gltf"])
def test_gltf_validator_finds_nothing_but_the_prefixed_attribute_names(web_readers, tmp_path, suffix):
    export_gaussians(_params(n=40), tmp_path / f"scene{suffix}", "glb")
    script = _script(tmp_path, "validate.cjs", VALIDATE)
    issues = json.loads(_node(web_readers, script, str(tmp_path / f"scene{suffix}")))
    counted = [m for m in issues["messages"] if m["code"] != "MESH_PRIMITIVE_INVALID_ATTRIBUTE"]
    errors = [m for m in counted if m["severity"] == 0]
    warnings = [m for m in counted if m["severity"] == 1]
    assert errors == [] and warnings == [], counted
    named = {m["pointer"].rsplit("/", 1)[1] for m in issues["messages"] if m["severity"] == 0}
    assert named == {f"{KHR}{name}" for name in ("ROTATION", "SCALE", "OPACITY")} | {
        f"{KHR}SH_DEGREE_{d}_COEF_{n}" for d in range(4) for n in range(2 * d + 1)
    }  # the validator's issue #252: every prefixed name, and nothing else


@pytest.mark.parametrize("sh_degree", [0, 2])
def test_babylon_reads_the_count_the_sh_degree_and_the_positions(web_readers, tmp_path, sh_degree):
    params = _params(n=37, sh_degree=sh_degree)
    export_gaussians(params, tmp_path / "scene.glb", "glb")
    out = _node(web_readers, _script(tmp_path, "babylon.mjs", BABYLON), str(tmp_path / "scene.glb"))
    (mesh,) = json.loads(out.strip().splitlines()[-1])  # after Babylon's banner
    assert mesh["count"] == 37 and mesh["shDegree"] == sh_degree
    turned = params["means"][:2] * torch.tensor([-1.0, -1.0, 1.0])
    assert np.array_equal(np.array(mesh["positions"], np.float32).reshape(2, 4)[:, :3], turned.numpy())


def test_splat_transform_writes_the_same_glb_from_the_same_ply(web_readers, tmp_path, config):
    params = _params(n=64)
    params["opacities"] = params["opacities"].clamp(-15, 15)
    save_ply(tmp_path / "scene.ply", params)
    cli = web_readers / "@playcanvas" / "splat-transform" / "bin" / "cli.mjs"
    _node(web_readers, cli, "-w", str(tmp_path / "scene.ply"), str(tmp_path / "theirs.glb"))
    assert main(["export", "--ply", str(tmp_path / "scene.ply"), "--config", str(config), "--format",
                 "glb", "--out", str(tmp_path / "ours.glb")]) == 0  # fmt: skip
    ours_document, ours_binary = _parse_glb(tmp_path / "ours.glb")
    theirs_document, theirs_binary = _parse_glb(tmp_path / "theirs.glb")
    ours, theirs = _attributes(ours_document, ours_binary), _attributes(theirs_document, theirs_binary)
    assert set(ours) - set(theirs) == {"_GSRECON_ROTATION", "_GSRECON_LOG_SCALE", "_GSRECON_LOGIT_OPACITY"}
    assert set(theirs) <= set(ours)
    ours_primitive = ours_document["meshes"][0]["primitives"][0]
    assert ours_primitive["extensions"] == theirs_document["meshes"][0]["primitives"][0]["extensions"]
    for name in theirs:
        if name == "COLOR_0":  # splat-transform stores the sRGB colour; glTF's COLOR_0 is linear
            srgb = theirs[name][:, :3] / 255
            linear = np.where(srgb <= 0.04045, srgb / 12.92, ((srgb + 0.055) / 1.055) ** 2.4)
            assert np.abs(linear - ours[name][:, :3] / 255).max() <= 0.01
            assert np.abs(theirs[name][:, 3].astype(int) - ours[name][:, 3]).max() <= 1
        elif name == f"{KHR}ROTATION":  # splat-transform keeps the PLY's quaternion lengths; the spec wants units
            unit = theirs[name] / np.linalg.norm(theirs[name], axis=1, keepdims=True)
            assert np.abs(unit - ours[name]).max() <= 2e-7, name
        else:
            assert np.allclose(theirs[name], ours[name], rtol=1e-6, atol=1e-7), name
    assert _attribute(ours_document, "POSITION")["min"] == _attribute(theirs_document, "POSITION")["min"]
    assert _attribute(ours_document, "POSITION")["max"] == _attribute(theirs_document, "POSITION")["max"]


# The JSON's structure: every member gsrecon reads has the type glTF gives it, or the file is refused naming the
# JSON path of the member.

WRONG_STRUCTURE = {
    "an accessor type that is a list": (
        _set(f"{KHR}SCALE", type=["VEC3"]),
        r"accessors\[3\]\.type is an array of 1 item; it must be a string",
    ),
    "the extension object a boolean": (
        lambda d, _: d["meshes"][0]["primitives"][0]["extensions"].update({"KHR_gaussian_splatting": True}),
        r"meshes\[0\]\.primitives\[0\]\.extensions\.KHR_gaussian_splatting is true; it must be an object",
    ),
    "asset a string": (lambda d, _: d.update(asset="2.0"), "asset is '2.0'; it must be an object"),
    "meshes an object": (
        lambda d, _: d.update(meshes={"0": d["meshes"][0]}),
        "meshes is an object; it must be an array",
    ),
    "byteStride a string": (
        lambda d, _: d["bufferViews"][3].update(byteStride="12"),
        r"bufferViews\[3\]\.byteStride is '12'; it must be an integer >= 0",
    ),
    "an attribute index that is a string": (
        lambda d, _: d["meshes"][0]["primitives"][0]["attributes"].update(POSITION="0"),
        r"meshes\[0\]\.primitives\[0\]\.attributes\.POSITION is '0'; it must be an integer >= 0",
    ),
    "a negative byte offset": (
        lambda d, _: d["bufferViews"][2].update(byteOffset=-4),
        r"bufferViews\[2\]\.byteOffset is -4; it must be an integer >= 0",
    ),
    "a count that is a float": (_set("POSITION", count=10.0), r"accessors\[0\]\.count is 10\.0; it must be an integer"),
    "a buffer view without its length": (
        lambda d, _: d["bufferViews"][1].pop("byteLength"),
        r"bufferViews\[1\] has no member 'byteLength', which glTF requires",
    ),
    "a translation of two numbers": (
        lambda d, _: d["nodes"][0].update(translation=[0, 0]),
        r"nodes\[0\]\.translation is an array of 2 items; it must be an array of 3 numbers",
    ),
    "an empty JSON object": (lambda d, _: d.clear(), "the JSON document has no member 'asset', which glTF requires"),
}


@pytest.mark.parametrize("case", WRONG_STRUCTURE)
def test_wrong_json_structure_is_refused_naming_the_json_path(tmp_path, case):
    change, message = WRONG_STRUCTURE[case]
    export_gaussians(_params(n=10), tmp_path / "scene.glb", "glb")
    edited = _edit(tmp_path / "scene.glb", change)
    with pytest.raises(InputError, match=f"^{edited}: {message}"):
        load_gltf(edited)


def _with_json_text(path: Path, text: bytes) -> Path:
    """A copy of the glb ``path`` whose JSON chunk is ``text`` (the binary chunk kept)."""
    _, binary = _parse_glb(path)
    text += b" " * (-len(text) % 4)
    edited = path.with_name("edited.glb")
    edited.write_bytes(
        struct.pack("<4sII", b"glTF", 2, 28 + len(text) + len(binary))
        + struct.pack("<I4s", len(text), b"JSON")
        + text
        + struct.pack("<I4s", len(binary), b"BIN\x00")
        + binary
    )
    return edited


def test_json_nested_past_the_parser_and_numbers_past_its_digits_are_refused(tmp_path, config, capsys):
    export_gaussians(_params(n=10), tmp_path / "scene.glb", "glb")
    text = json.dumps(_parse_glb(tmp_path / "scene.glb")[0]).encode()
    deep = _with_json_text(tmp_path / "scene.glb", text[:-1] + b', "extras": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    with pytest.raises(InputError, match=f"^{deep}: not a glTF file .its JSON nests deeper than"):
        load_gltf(deep)
    assert main(["eval", "--ply", str(deep), "--config", str(config), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(deep) in err
    long = _with_json_text(tmp_path / "scene.glb", text[:-1] + b', "extras": ' + b"7" * 5000 + b"}")
    with pytest.raises(InputError, match=f"^{long}: not a glTF file .its JSON cannot be read"):
        load_gltf(long)


def _gltf_with_data_uri(tmp_path: Path, params: dict[str, torch.Tensor], payload: str | None = None) -> Path:
    """``params`` as a .gltf (standard attributes only) whose buffer is a base64 ``data:`` URI of its bytes (or
    ``payload``)."""
    export_gaussians(params, tmp_path / "scene.gltf", "glb", options={"exact": False})
    document = json.loads((tmp_path / "scene.gltf").read_text())
    data = base64.b64encode((tmp_path / "scene.bin").read_bytes()).decode() if payload is None else payload
    document["buffers"][0]["uri"] = f"data:application/octet-stream;base64,{data}"
    (tmp_path / "scene.bin").unlink()
    (tmp_path / "scene.gltf").write_text(json.dumps(document))
    return tmp_path / "scene.gltf"


def test_a_data_uri_buffer_is_read_and_bad_base64_is_refused(tmp_path):
    params = _params(n=10, sh_degree=1)
    loaded = load_gltf(_gltf_with_data_uri(tmp_path, params))
    assert torch.equal(loaded["means"], params["means"]) and torch.equal(loaded["shN"], params["shN"])
    bad = _gltf_with_data_uri(tmp_path, params, payload="AAAA@@@=")
    with pytest.raises(InputError, match=rf"^{bad}: buffers\[0\]\.uri is a data URI whose base64 cannot be read"):
        load_gltf(bad)


_WRONG_VALUES = (None, True, -1, 2**64, 0.5, "x", "\x00", [0], {"a": 1})  # every JSON type, out of range, a NUL


def _members(value: object, where: tuple = ()) -> list[tuple]:
    """The paths (keys and indices) of every member and item under ``value``."""
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [path for key, child in children for path in [(*where, key), *_members(child, (*where, key))]]


def _json_with(document: dict, where: tuple, value: object) -> str:
    """``document`` as JSON with the member at ``where`` replaced by ``value`` (``document`` is left as it was)."""
    parent = document
    for key in where[:-1]:
        parent = parent[key]
    original, parent[where[-1]] = parent[where[-1]], value
    try:
        return json.dumps(document)
    finally:
        parent[where[-1]] = original


def test_every_member_of_another_type_is_refused_as_input_and_never_crashes(tmp_path):
    """Every member of a valid file, in turn, replaced by a value of each JSON type: the file either loads or is
    refused with an InputError naming it, and never raises anything else (a .gltf whose buffer is a data: URI, so
    that the JSON holds everything and its ``uri`` is walked too)."""
    document = json.loads(_gltf_with_data_uri(tmp_path, _params(n=4, sh_degree=0)).read_text())
    members, refused, edited = _members(document), 0, tmp_path / "edited.gltf"
    for where in members:
        for value in _WRONG_VALUES:
            edited.write_text(_json_with(document, where, value))
            try:
                load_gltf(edited)
            except InputError as e:
                assert str(e).startswith(f"{edited}: ") and "\n" not in str(e), (where, value, e)
                refused += 1
            except Exception as e:  # the point of the test: nothing but InputError
                pytest.fail(f"{'.'.join(map(str, where))} = {value!r}: {type(e).__name__}: {e}")
    assert len(members) > 100 and refused > len(members) * len(_WRONG_VALUES) // 2


# The scene's node tree: a transform anywhere on the way from the scene to the splats is refused naming its node.


def _nodes(*nodes: dict, roots: list[int] | None = None) -> Callable[[dict, bytearray], None]:
    """A change that gives the file ``nodes`` and the scene ``roots`` (default: node 0)."""

    def change(document: dict, _: bytearray) -> None:
        document["nodes"] = list(nodes)
        document["scenes"] = [{"nodes": [0] if roots is None else roots}]

    return change


SCENE_TREES = {
    "a translation on the parent": (
        _nodes({"children": [1], "translation": [5, 0, 0]}, {"mesh": 0}),
        r"node 0, above node 1 which holds the splats, moves them with a transform \(translation\); gsrecon reads",
    ),
    "a matrix two levels up": (
        _nodes(
            {"children": [1], "matrix": [2, 0, 0, 0, 0, 2, 0, 0, 0, 0, 2, 0, 0, 0, 0, 1]},
            {"children": [2]},
            {"mesh": 0},
        ),
        r"node 0, above node 2 which holds the splats, moves them with a transform \(matrix\)",
    ),
    "the splats drawn twice": (
        _nodes({"mesh": 0}, {"children": [2]}, {"mesh": 0}, roots=[0, 1]),
        r"the scene draws the splats 2 times \(nodes 0, 2\)",
    ),
    "a node with two parents": (
        _nodes({"children": [2]}, {"children": [2]}, {"mesh": 0}, roots=[0, 1]),
        "node 2 is a child of node 0 and of node 1; a glTF node has one parent",
    ),
    "a cycle": (
        _nodes({"children": [1]}, {"children": [0], "mesh": 0}),
        r"scenes\[0\]\.nodes names node 0, a child of node 1; it must be a root",
    ),
    "a root named twice": (_nodes({"mesh": 0}, roots=[0, 0]), r"scenes\[0\]\.nodes names a node twice"),
    "a child that is not there": (
        _nodes({"children": [7]}, {"mesh": 0}),
        r"nodes\[0\]\.children names node 7, which the file does not have",
    ),
    "a scene that is not there": (lambda d, _: d.update(scene=3), "scene names scene 3, which the file does not have"),
    "an extension required that gsrecon does not implement": (
        lambda d, _: d.update(extensionsRequired=["KHR_gaussian_splatting", "KHR_draco_mesh_compression"]),
        "extensionsRequired names KHR_draco_mesh_compression, which gsrecon does not implement",
    ),
}


@pytest.mark.parametrize("case", SCENE_TREES)
def test_a_scene_that_moves_or_repeats_the_splats_is_refused_naming_the_node(tmp_path, case):
    change, message = SCENE_TREES[case]
    export_gaussians(_params(n=10), tmp_path / "scene.glb", "glb")
    edited = _edit(tmp_path / "scene.glb", change)
    with pytest.raises(InputError, match=f"^{edited}: {message}"):
        load_gltf(edited)


def test_identity_transforms_nodes_outside_the_scene_and_a_long_chain_are_read(tmp_path):
    """Identity transforms on the way, a moved node the scene does not draw, the splats 5,000 nodes deep (walked
    without recursion) and the extension gsrecon implements required: read as the file stores them."""
    params = _params(n=10)
    export_gaussians(params, tmp_path / "scene.glb", "glb")
    chain = [{"children": [i + 1], "rotation": [0, 0, 0, 1.0]} for i in range(5000)]
    identity = {"matrix": [1.0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1], "scale": [1, 1, 1]}
    outside = {"mesh": 0, "translation": [5, 0, 0]}

    def change(document: dict, binary: bytearray) -> None:
        _nodes(*chain, {"mesh": 0, **identity}, outside)(document, binary)
        document["extensionsRequired"] = ["KHR_gaussian_splatting"]

    loaded = load_gltf(_edit(tmp_path / "scene.glb", change))
    for key, value in params.items():
        assert torch.equal(loaded[key], value), key
