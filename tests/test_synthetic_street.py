"""The synthetic scene's street layout (a scene that needs blocks, issue 30): determinism, cameras along the
street that each see a part of it, points on its surfaces, depth, alpha and fisheye, the CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor

from gsrecon.cache import cache_file
from gsrecon.cli import main
from gsrecon.data.formats.lens import Distortion
from gsrecon.data.readers import synthetic
from gsrecon.data.readers.synthetic import (
    SyntheticConfig,
    cache_path,
    load_synthetic,
    pinhole_intrinsics,
    render_view,
    street_viewmats,
    surface_distance,
)
from gsrecon.data.scene import Frame, Scene

# The street's fixtures render its 48 views at 2x supersampling, 16 s on a quiet 2-core machine: CI's slow run (the
# default run stays under 5 minutes)
pytestmark = pytest.mark.slow

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cfg(tmp_path_factory: pytest.TempPathFactory) -> SyntheticConfig:
    """The street as configs/street.yaml has it, with fewer points (48 views, 64 x 48)."""
    return SyntheticConfig(
        layout="street", num_views=48, num_points=1500, cache_dir=str(tmp_path_factory.mktemp("street_cache"))
    )


@pytest.fixture(scope="module")
def scene(cfg: SyntheticConfig) -> Scene:
    return load_synthetic(cfg)


@pytest.fixture(scope="module")
def exact(cfg: SyntheticConfig) -> Scene:
    """The street with its points exactly on the surfaces (no jitter)."""
    return load_synthetic(dataclasses.replace(cfg, point_noise=0.0))


def _all_frames(scene: Scene) -> list[Frame]:
    return sorted(scene.train + scene.test, key=lambda f: f.name)


def _in_image(points: Tensor, frame: Frame) -> Tensor:
    """[P] bool: the world points [P, 3] are in front of the camera and project inside its image."""
    cam = points @ frame.viewmat[:3, :3].T + frame.viewmat[:3, 3]  # [P, 3]
    uv = cam @ frame.K.T
    u, v = uv[:, 0] / uv[:, 2], uv[:, 1] / uv[:, 2]
    height, width = frame.image.shape[:2]
    return (cam[:, 2] > 0) & (u >= 0) & (u < width) & (v >= 0) & (v < height)


def test_the_street_is_deterministic_and_not_the_orbit(cfg, tmp_path):
    small = dataclasses.replace(cfg, num_views=8, num_points=300, cache_dir=str(tmp_path / "a"))
    scene = load_synthetic(small)
    fresh = load_synthetic(dataclasses.replace(small, cache_dir=str(tmp_path / "b")))
    for a, b in zip(_all_frames(fresh), _all_frames(scene), strict=True):
        assert torch.equal(a.image, b.image) and torch.equal(a.viewmat, b.viewmat)
    assert torch.equal(fresh.points, scene.points) and torch.equal(fresh.colors, scene.colors)

    reseeded = load_synthetic(dataclasses.replace(small, seed=1))
    assert torch.equal(reseeded.test[0].image, scene.test[0].image)  # the seed draws the points only
    assert not torch.allclose(reseeded.points, scene.points)

    orbit = dataclasses.replace(small, layout="orbit")
    assert cache_path(orbit) != cache_path(small)
    assert not torch.equal(load_synthetic(orbit).test[0].image, scene.test[0].image)
    assert cache_path(cfg) != cache_path(dataclasses.replace(cfg, street_length=20.0))
    assert cache_path(cfg) == cache_path(dataclasses.replace(cfg, val_every=3))  # the split, not the data


def test_an_orbit_config_keeps_its_cache_key(cfg):
    orbit = SyntheticConfig(cache_dir=cfg.cache_dir)
    before_layouts = dataclasses.asdict(orbit)
    for name in ("layout", "street_length", "sky", "val_every", "depth_noise", "tracks", "cache_dir"):
        del before_layouts[name]
    key = {"generator": synthetic._GENERATOR_DIGEST, **before_layouts}
    assert cache_path(orbit) == cache_file("synthetic", key, ".npz", Path(cfg.cache_dir))


def test_cameras_move_along_the_street_and_look_ahead_and_down(scene, cfg):
    frames = _all_frames(scene)
    assert len(scene.test) == 6 and [f.name for f in scene.test][:2] == ["view_000", "view_008"]
    centres = torch.stack([f.camera_center for f in frames])  # [N, 3]
    spread = centres.std(dim=0)
    assert spread[0] > 4 * spread[1]  # along x, not across: blocks along the street make sense
    assert (centres[1:, 0] > centres[:-1, 0]).all()
    assert centres[:, 0].max() - centres[:, 0].min() > 0.75 * cfg.street_length
    assert (centres[:, 1].abs() < 3.0).all() and (centres[:, 2] > 2.0).all()  # over the street, above its objects
    for frame in frames:
        forward = frame.viewmat[2, :3]  # camera z in world
        assert forward[0] > 0.3 and forward[2] < -0.3  # down the street (+x), looking down
        assert (frame.viewmat[:3, :3] @ torch.tensor([0.0, 0.0, 1.0]))[1] < -0.5  # world up is image up


def test_each_camera_sees_only_a_few_metres_of_the_street(exact, cfg):
    frames = _all_frames(exact)
    for frame in frames:
        seen_x = exact.points[_in_image(exact.points, frame), 0]
        assert len(seen_x) > 10
        assert seen_x.max() - seen_x.min() < cfg.street_length / 3
    objects = torch.tensor(np.stack([prim.center for prim in synthetic._primitives(cfg)[1:]]), dtype=torch.float32)
    far_end = objects[:, 0] > 0.0  # the objects on the second half of the street
    assert far_end.sum() >= 5 and (~far_end).sum() >= 5
    assert not _in_image(objects[far_end], frames[0]).any()  # the first camera does not see the far end
    assert not _in_image(objects[~far_end], frames[-1]).any()
    assert _in_image(objects, frames[0]).any() or _in_image(objects, frames[1]).any()


def test_every_stretch_looks_different(scene):
    images = torch.stack([f.image for f in _all_frames(scene)]).float() / 255  # [N, H, W, 3]
    quarter = len(images) // 4
    first, last = images[:quarter].mean((0, 1, 2)), images[-quarter:].mean((0, 1, 2))  # [3] mean colours
    assert (first - last).abs().max() > 0.05
    assert images.mean((1, 2, 3)).min() > 0.2  # no dark or empty view
    for frame in _all_frames(scene):
        img = frame.image.float() / 255
        assert img.std() > 0.1
        assert (img[img.shape[0] // 2 :].amax(-1) == 0).float().mean() < 0.05  # the street fills the lower half


def test_points_lie_on_the_surfaces_the_cameras_see(scene, exact, cfg):
    sigma = cfg.point_noise * 3.0  # relative to the street's half-width, as to the orbit's ground radius
    dist = surface_distance(scene.points, cfg)
    assert 0.3 * sigma < dist.median() < 1.2 * sigma and dist.max() < 6 * sigma
    assert surface_distance(scene.points).median() > 10 * sigma  # the orbit scene (the default) is elsewhere

    assert surface_distance(exact.points, cfg).max() < 1e-5
    assert exact.points[:, 0].min() < -0.4 * cfg.street_length and exact.points[:, 0].max() > 0.4 * cfg.street_length
    assert 0.08 < (exact.points[:, 2] > 1e-3).float().mean() < 0.6  # objects and ground both get points
    best = torch.full((len(exact.points),), float("inf"))  # [P] best colour match over the views
    for frame in _all_frames(exact):
        cam = exact.points @ frame.viewmat[:3, :3].T + frame.viewmat[:3, 3]
        uv = cam @ frame.K.T
        col, row = (uv[:, 0] / uv[:, 2]).floor().long(), (uv[:, 1] / uv[:, 2]).floor().long()
        inside = _in_image(exact.points, frame)
        pixel = frame.image[row.clamp(0, cfg.height - 1), col.clamp(0, cfg.width - 1)].float() / 255
        best = torch.where(inside, torch.minimum(best, (pixel - exact.colors).abs().amax(-1)), best)
    assert (best < 0.1).float().mean() > 0.9  # the rest: pixels that blend checker cells seen at a grazing angle


def test_depth_alpha_and_fisheye_work_on_the_street(tmp_path):
    small = SyntheticConfig(
        layout="street", num_views=8, num_points=200, background=(0.2, 0.3, 0.9), depth=True, cache_dir=str(tmp_path)
    )
    scene = load_synthetic(small)
    for frame in _all_frames(scene):
        ys, xs = torch.nonzero(frame.depth > 0, as_tuple=True)
        assert len(ys) > 0.5 * small.width * small.height
        z = frame.depth[ys, xs]
        cam = torch.stack(
            [(xs + 0.5 - frame.K[0, 2]) / frame.K[0, 0] * z, (ys + 0.5 - frame.K[1, 2]) / frame.K[1, 1] * z, z], -1
        )
        world = (cam - frame.viewmat[:3, 3]) @ frame.viewmat[:3, :3]  # [P, 3]
        assert surface_distance(world, small).max() < 1e-4

    rgba = load_synthetic(dataclasses.replace(small, alpha=True))
    for a, b in zip(_all_frames(rgba), _all_frames(scene), strict=True):
        alpha = a.image[..., 3:].float() / 255
        composite = a.image[..., :3].float() / 255 * alpha + torch.tensor(small.background) * (1 - alpha)
        assert (composite - b.image.float() / 255).abs().max() < 3 / 255
    assert any((f.image[..., 3] == 0).any() for f in _all_frames(rgba))  # past the street's end: no surface

    K = pinhole_intrinsics(small)
    viewmat = street_viewmats(small)[3]
    pinhole = render_view(viewmat, K, small).astype(np.float64)
    fisheye = render_view(viewmat, K, small, Distortion(k1=0.08, k2=0.01, fisheye=True)).astype(np.float64)
    centre = (slice(small.height // 2 - 1, small.height // 2 + 1), slice(small.width // 2 - 1, small.width // 2 + 1))
    assert np.abs(fisheye[centre] - pinhole[centre]).max() < 12  # no distortion at the centre
    assert np.abs(fisheye - pinhole).mean() > 5  # and some away from it


def test_configs_street_yaml_trains_from_the_command_line(tmp_path: Path, synthetic_cache: Path, capsys) -> None:
    exp_dir = tmp_path / "run"
    argv = [
        "train",
        "--config",
        str(REPO / "configs" / "street.yaml"),
        f"exp_dir={exp_dir}",
        "device=cpu",
        "num_threads=1",
        "max_steps=4",
        "val_interval=4",
        "model.sh_degree=1",
        "renderer.name=torch",
        "metrics.lpips_net=none",
        "writers=[{name: JsonlWriter}]",
        "data.synthetic.width=32",
        "data.synthetic.height=24",
        "data.synthetic.num_views=16",
        "data.synthetic.num_points=400",
        "data.synthetic.supersample=1",
        f"data.synthetic.cache_dir={synthetic_cache}",
        "hooks.LogHook={progress: false, log_interval: 1}",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    metrics = json.loads((exp_dir / "metrics.json").read_text())
    assert metrics["step"] == 4 and metrics["mean"]["psnr"] > 5.0
    assert "layout: street" in (exp_dir / "config.yaml").read_text()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.synthetic.layout=avenue", "SyntheticConfig.layout must be one of ['orbit', 'street'], got 'avenue'"),
        (
            "data.synthetic.street_length=-3",
            "SyntheticConfig.street_length must be >= 5.5 (metres: what one view sees of it), got -3.0",
        ),
        ("data.synthetic.orbit_radius=3", "SyntheticConfig.orbit_radius is not an option of layout 'street'"),
        ("data.synthetic.look_at=[1,0,0]", "SyntheticConfig.look_at is not an option of layout 'street'"),
    ],
)
def test_bad_street_options_are_one_line_naming_the_key(tmp_path: Path, capsys, override: str, message: str) -> None:
    code = main(["train", "--config", str(REPO / "configs" / "street.yaml"), f"exp_dir={tmp_path / 'run'}", override])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "key 'data.synthetic'" in err[0] and message in err[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"layout": "Street"}, "layout"),
        ({"layout": "street", "street_length": 5.0}, "street_length"),
        ({"layout": "street", "elevations_deg": (30.0,)}, "elevations_deg"),
        ({"layout": "street", "arc_deg": 90.0}, "arc_deg"),
        ({"street_length": 30.0}, "street_length"),  # an orbit option only
    ],
)
def test_invalid_layout_options_name_the_field(fields: dict, name: str) -> None:
    with pytest.raises(ValueError, match=f"SyntheticConfig.{name}"):
        SyntheticConfig(**fields)
    assert SyntheticConfig(layout="street", elevations_deg=[25.0, 45.0]).layout == "street"  # the default, as a list
