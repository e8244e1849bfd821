"""The mesh export: TSDF fusion of rendered depth, marching cubes, files other libraries read back."""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_yaml

from gsrecon.cameras import Cameras
from gsrecon.cli import main
from gsrecon.data.pipeline import Batch
from gsrecon.errors import InputError
from gsrecon.export import ExportContext, export_gaussians
from gsrecon.geometry import look_at
from gsrecon.model.ply import save_ply
from gsrecon.render.torch_renderer import TorchRenderer
from gsrecon.sh import rgb_to_sh

pytest.importorskip("skimage", reason="the mesh export needs scikit-image: pip install 'gsrecon[mesh]'")
trimesh = pytest.importorskip("trimesh", reason="the mesh export needs trimesh: pip install 'gsrecon[mesh]'")
plyfile = pytest.importorskip("plyfile")

torch.set_num_threads(1)
CENTRE, RADIUS = torch.tensor([0.0, 0.0, 0.6]), 0.5
WIDTH, HEIGHT, FOCAL = 96, 72, 90.0


def _fibonacci_sphere(n: int) -> torch.Tensor:
    """[n, 3] unit vectors spread evenly over the sphere."""
    i = torch.arange(n, dtype=torch.float64) + 0.5
    z = 1 - 2 * i / n
    phi = math.pi * (1 + 5**0.5) * i
    r = torch.sqrt(1 - z * z)
    return torch.stack([r * torch.cos(phi), r * torch.sin(phi), z], dim=-1)


def _sphere_gaussians(n: int = 10000) -> dict[str, torch.Tensor]:
    """Flat, opaque Gaussians tangent to a sphere: red on its upper half, blue on its lower half."""
    normals = _fibonacci_sphere(n)  # [n, 3]
    z = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    axis = torch.cross(z.expand_as(normals), normals, dim=-1)  # rotation taking z to the normal
    half = torch.acos(normals[:, 2].clamp(-1, 1)) / 2
    axis = axis / axis.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    quats = torch.cat([torch.cos(half)[:, None], torch.sin(half)[:, None] * axis], dim=-1)
    tangent = 0.8 * RADIUS * math.sqrt(4 * math.pi / n)  # 0.8 x the spacing: the discs leave no gap
    rgb = torch.where(normals[:, 2:] > 0, torch.tensor([0.9, 0.1, 0.1]), torch.tensor([0.1, 0.1, 0.9]))
    return {
        "means": (CENTRE + RADIUS * normals).float(),
        "scales": torch.log(torch.tensor([tangent, tangent, 0.002])).repeat(n, 1).float(),
        "quats": quats.float(),
        "opacities": torch.full((n,), 5.0),
        "sh0": rgb_to_sh(rgb).reshape(n, 1, 3).float(),
        "shN": torch.zeros(n, 0, 3),
    }


def _views(n: int = 16) -> list[Batch]:
    """Cameras all around the sphere (above and below), looking at its centre."""
    directions = _fibonacci_sphere(n + 2)[1:-1]  # not the poles, where look_at's up is undefined
    viewmats = look_at(CENTRE.double() + 2.5 * directions, CENTRE.double(), torch.tensor([0.0, 0.0, 1.0]).double())
    K = torch.tensor([[FOCAL, 0.0, WIDTH / 2], [0.0, FOCAL, HEIGHT / 2], [0.0, 0.0, 1.0]])
    return [
        Batch(
            torch.zeros(1, HEIGHT, WIDTH, 3),
            Cameras(viewmat[None].float(), K[None], WIDTH, HEIGHT),
            torch.zeros(1, 3),
            [f"v{i}"],
        )
        for i, viewmat in enumerate(viewmats)
    ]


def _context(params: dict[str, torch.Tensor], views: list[Batch]) -> ExportContext:
    renderer = TorchRenderer(TorchRenderer.Config(median_depth=True))

    def render(batch: Batch):
        return renderer.render_batch(params, batch, 0)

    return ExportContext(train_batches=lambda: iter(views), render=torch.no_grad()(render))


def _sphere_distance(vertices: np.ndarray) -> np.ndarray:
    return np.abs(np.linalg.norm(vertices - CENTRE.numpy(), axis=-1) - RADIUS)


@pytest.fixture(scope="module")
def sphere_ply(tmp_path_factory) -> Path:
    """The sphere's mesh as .ply, voxels of 2 cm."""
    path = tmp_path_factory.mktemp("mesh") / "sphere.ply"
    params = _sphere_gaussians()
    export_gaussians(params, path, "mesh", context=_context(params, _views()), options={"voxel": 0.02})
    return path


def test_the_mesh_of_a_sphere_of_gaussians_lies_on_it_faces_outwards_and_keeps_its_colours(sphere_ply: Path) -> None:
    ply = plyfile.PlyData.read(str(sphere_ply))  # an independent reader
    vertex = ply["vertex"]
    vertices = np.stack([vertex["x"], vertex["y"], vertex["z"]], axis=-1)  # [V, 3]
    colors = np.stack([vertex["red"], vertex["green"], vertex["blue"]], axis=-1)  # [V, 3] uint8
    faces = np.stack(ply["face"]["vertex_indices"])  # [F, 3]
    assert len(vertices) > 1000 and faces.shape[1] == 3 and faces.max() < len(vertices)
    # The Gaussians are discs 1.4 cm wide (one sigma): the median depth lies up to that in front of the sphere.
    distance = _sphere_distance(vertices)
    assert distance.mean() < 0.025 and distance.max() < 0.05
    mesh = trimesh.Trimesh(vertices, faces, process=False)
    outward = np.einsum("fk,fk->f", mesh.face_normals, mesh.triangles_center - CENTRE.numpy())
    assert (outward > 0).mean() > 0.99
    assert mesh.area == pytest.approx(4 * math.pi * (RADIUS + distance.mean()) ** 2, rel=0.1)  # one surface, closed
    upper, lower = vertices[:, 2] > CENTRE[2].item() + 0.1, vertices[:, 2] < CENTRE[2].item() - 0.1
    assert (colors[upper, 0] > 180).mean() > 0.95 and (colors[upper, 2] < 80).mean() > 0.95  # red
    assert (colors[lower, 2] > 180).mean() > 0.95 and (colors[lower, 0] < 80).mean() > 0.95  # blue


@pytest.mark.parametrize("suffix", [".obj", ".glb"])
def test_obj_and_glb_meshes_open_in_trimesh_with_their_vertex_colours(tmp_path: Path, suffix: str) -> None:
    params = _sphere_gaussians(1500)
    path = tmp_path / f"sphere{suffix}"
    export_gaussians(params, path, "mesh", context=_context(params, _views(10)), options={"voxel": 0.04})
    loaded = trimesh.load(path, force="mesh", process=False)
    assert len(loaded.faces) > 200
    assert _sphere_distance(np.asarray(loaded.vertices)).mean() < 0.04  # discs 3.7 cm wide (one sigma)
    colors = np.asarray(loaded.visual.vertex_colors)[:, :3]
    top = np.asarray(loaded.vertices)[:, 2] > CENTRE[2].item() + 0.1
    assert (colors[top, 0] > 180).mean() > 0.9
    if suffix == ".glb":  # a glTF 2.0 binary: magic, version, and a JSON chunk naming a mesh
        data = path.read_bytes()
        magic, version, length = struct.unpack("<4sII", data[:12])
        assert (magic, version, length) == (b"glTF", 2, len(data))
        chunk_length, chunk_type = struct.unpack("<I4s", data[12:20])
        assert chunk_type == b"JSON" and json.loads(data[20 : 20 + chunk_length])["meshes"]


def test_keep_parts_keeps_the_largest_connected_parts(tmp_path: Path) -> None:
    big = _sphere_gaussians(3000)
    small = _sphere_gaussians(800)
    small["means"] = (small["means"] - CENTRE) * 0.4 + CENTRE + torch.tensor([1.2, 0.0, 0.0])
    small["scales"] = small["scales"] + math.log(0.4)
    params = {k: torch.cat([big[k], small[k]]) for k in big}
    context = _context(params, _views())
    both, one = tmp_path / "both.ply", tmp_path / "one.ply"
    export_gaussians(params, both, "mesh", context=context, options={"voxel": 0.03})
    export_gaussians(params, one, "mesh", context=context, options={"voxel": 0.03, "keep_parts": 1})
    both, one = trimesh.load(both, process=False), trimesh.load(one, process=False)
    assert len(both.split(only_watertight=False)) >= 2 and len(one.split(only_watertight=False)) == 1
    assert np.linalg.norm(np.asarray(one.vertices) - CENTRE.numpy(), axis=-1).max() < RADIUS + 0.05  # the big one


@pytest.mark.slow  # 4 s on a quiet 2-core machine: CI's slow run (the default run stays under 5 min)
def test_the_median_depth_makes_a_closer_surface_than_the_expected_depth(tmp_path: Path) -> None:
    """Half-transparent Gaussians in front of the sphere: the expected depth blends them with it."""
    params = _sphere_gaussians()
    shell = _sphere_gaussians()
    shell["means"] = (shell["means"] - CENTRE) * 1.2 + CENTRE  # 10 cm in front of it
    shell["opacities"] = torch.full_like(shell["opacities"], math.log(0.08 / 0.92))  # about 0.3 a pixel: no surface
    both = {k: torch.cat([params[k], shell[k]]) for k in params}
    errors = {}
    for depth in ("median", "expected"):
        path = tmp_path / f"{depth}.ply"
        export_gaussians(both, path, "mesh", context=_context(both, _views()), options={"voxel": 0.02, "depth": depth})
        errors[depth] = _sphere_distance(np.asarray(trimesh.load(path, process=False).vertices)).mean()
    assert errors["median"] < 0.03 and errors["expected"] > errors["median"] + 0.015  # about 2.7 and 4.9 cm


def test_nothing_opaque_and_a_voxel_too_small_or_too_large_are_input_errors(tmp_path: Path) -> None:
    params = _sphere_gaussians(500)
    faint = dict(params, opacities=torch.full((500,), -4.0))  # opacity 0.02: the median depth is nowhere
    with pytest.raises(InputError, match="nothing to mesh"):
        export_gaussians(faint, tmp_path / "m.ply", "mesh", context=_context(faint, _views(4)))
    with pytest.raises(InputError, match=r"needs \d+(\.\d)? GiB of memory.*--voxel"):
        export_gaussians(params, tmp_path / "m.ply", "mesh", context=_context(params, _views(4)),
                         options={"voxel": 1e-5})  # fmt: skip
    for voxel in (1e300, 1e6, 0.5):  # the sphere spans about 1.2 units
        with pytest.raises(InputError, match=re.escape(f"voxel={voxel:g}: the voxel is larger than the scene")):
            export_gaussians(params, tmp_path / "m.ply", "mesh", context=_context(params, _views(4)),
                             options={"voxel": voxel})  # fmt: skip
    with pytest.raises(InputError, match=re.escape("voxel=1e-300: the voxel is too small for the scene, whose")):
        export_gaussians(params, tmp_path / "m.ply", "mesh", context=_context(params, _views(4)),
                         options={"voxel": 1e-300})  # fmt: skip
    with pytest.raises(InputError, match="no training views"):
        export_gaussians(params, tmp_path / "m.ply", "mesh", context=_context(params, []))
    with pytest.raises(InputError, match=r"\.ply, \.obj, \.glb"):
        export_gaussians(params, tmp_path / "m.stl", "mesh", context=_context(params, _views(4)))
    with pytest.raises(InputError, match="takes no options"):
        export_gaussians(params, tmp_path / "m.ply", "ply", options={"voxel": 0.1})
    assert not list(tmp_path.iterdir())  # nothing written


def test_cli_meshes_a_ply_with_the_config_of_its_capture_and_refuses_a_ply_alone(
    make_config, tmp_path: Path, capsys
) -> None:
    config = write_yaml(tmp_path / "capture.yaml", make_config("capture", renderer={"name": "torch"}))
    ply = tmp_path / "sphere_gaussians.ply"
    save_ply(ply, _sphere_gaussians())
    out = tmp_path / "mesh.obj"
    args = ["export", "--ply", str(ply), "--format", "mesh", "--voxel", "0.03", "--out", str(out)]
    assert main([*args, "--config", str(config)]) == 0
    captured = capsys.readouterr()
    assert str(out) in captured.out and "Gaussians of" not in captured.err  # the capture's views see the sphere
    loaded = trimesh.load(out, force="mesh", process=False)
    assert len(loaded.faces) > 100  # the synthetic capture's cameras see the sphere
    assert main(args) == 2
    assert "--ply needs --config" in capsys.readouterr().err
    elsewhere = _sphere_gaussians()  # and twice as many Gaussians that no view of this capture sees
    far = {name: torch.cat([value, value, value]) for name, value in elsewhere.items()}
    far["means"][len(elsewhere["means"]) :] += torch.tensor([0.0, 0.0, 500.0])
    save_ply(tmp_path / "other.ply", far)
    other = ["export", "--ply", str(tmp_path / "other.ply"), "--config", str(config), "--voxel", "0.03"]
    assert main([*other, "--format", "mesh", "--out", str(tmp_path / "other.obj")]) == 0
    warning = " ".join(capsys.readouterr().err.split())
    assert f"see only 33% of the 30000 Gaussians of {tmp_path / 'other.ply'}: is the --config that of" in warning
    assert main([*args, "--config", str(config), "--voxel", "-1"]) == 2
    assert "voxel" in capsys.readouterr().err


def test_render_depth_median_writes_the_surface_depth_video(make_config, tmp_path: Path) -> None:
    iio = pytest.importorskip("imageio.v3")
    config = write_yaml(tmp_path / "capture.yaml", make_config("capture", renderer={"name": "torch"}))
    ply = tmp_path / "sphere_gaussians.ply"
    save_ply(ply, _sphere_gaussians(3000))
    out = tmp_path / "orbit.mp4"
    args = ["render", "--ply", str(ply), "--config", str(config), "--frames", "4", "--out", str(out)]
    assert main([*args, "--depth", "median"]) == 0
    frames = np.stack(list(iio.imiter(tmp_path / "orbit_depth.mp4")))  # [4, H, W, 3]
    assert len(frames) == 4 and frames.max() > 100  # the sphere, colour-mapped
    assert (frames.max(-1) < 30).mean() > 0.2  # black around it: the median depth is 0 where nothing is opaque
    with pytest.raises(SystemExit) as refused:  # argparse's own exit for a choice it does not know
        main([*args, "--depth", "nearest"])
    assert refused.value.code == 2


def test_depth_image_shows_the_median_depth_black_where_it_is_zero() -> None:
    from gsrecon.render.base import RenderOutput
    from gsrecon.render.colormap import depth_image

    median = torch.tensor([[0.0, 2.0], [3.0, 4.0]])[None, ..., None]  # [1, 2, 2, 1]
    out = RenderOutput(torch.zeros(1, 2, 2, 3), torch.ones(1, 2, 2, 1), median + 1.0, {}, median_depth=median)
    image = depth_image(out, "median")
    assert image[0, 0].tolist() == [0, 0, 0] and image[1, 1].sum() > 0
    assert depth_image(out, "expected")[0, 0].sum() > 0  # the expected depth is 1 there


@pytest.mark.slow  # trains, then renders every view for the mesh: 9 s on a quiet machine
def test_export_hook_writes_the_mesh_when_training_ends(make_trainer, tmp_path: Path) -> None:
    ply = tmp_path / "sphere_gaussians.ply"
    save_ply(ply, _sphere_gaussians(3000))
    trainer = make_trainer(
        "hooked", max_steps=3, model={"sh_degree": 0, "init": "ply", "init_path": str(ply)},
        hooks={"CheckPointHook": {"interval": 3}, "ExportHook": {"format": "mesh", "path": "mesh.obj"}},
    )  # fmt: skip
    trainer.train()
    loaded = trimesh.load(trainer.exp_dir / "mesh.obj", force="mesh", process=False)
    assert len(loaded.faces) > 100
    out = tmp_path / "again.glb"  # and gsrecon export on the finished run
    assert main(["export", "--exp-dir", str(trainer.exp_dir), "--format", "mesh", "--out", str(out)]) == 0
    assert len(trimesh.load(out, force="mesh", process=False).faces) == pytest.approx(len(loaded.faces), rel=0.05)
