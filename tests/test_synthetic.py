"""The built-in synthetic scene: determinism, cache (and gsrecon's cache naming), splits, cameras, point cloud,
images."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor

from gsrecon.cache import cache_dir, cache_file
from gsrecon.data.pipeline import DataPipeline
from gsrecon.data.readers import synthetic
from gsrecon.data.readers.synthetic import (
    SyntheticConfig,
    cache_path,
    generator_digest,
    generator_sources,
    load_synthetic,
    surface_distance,
)
from gsrecon.data.scene import Frame, Scene

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def cfg(tmp_path_factory: pytest.TempPathFactory) -> SyntheticConfig:
    return SyntheticConfig(cache_dir=str(tmp_path_factory.mktemp("synthetic_cache")))


@pytest.fixture(scope="module")
def scene(cfg: SyntheticConfig) -> Scene:
    return load_synthetic(cfg)


def _all_frames(scene: Scene) -> list[Frame]:
    return sorted(scene.train + scene.test, key=lambda f: f.name)


def _images(scene: Scene) -> Tensor:
    return torch.stack([f.image for f in _all_frames(scene)])  # [N, H, W, C] uint8


def _project(points: Tensor, viewmat: Tensor, K: Tensor) -> tuple[Tensor, Tensor]:
    """Pixel coordinates [P, 2] and camera depths [P] of world points [P, 3]."""
    cam = points @ viewmat[:3, :3].T + viewmat[:3, 3]  # [P, 3]
    uv = cam @ K.T
    return uv[:, :2] / uv[:, 2:], cam[:, 2]


def test_same_config_is_bitwise_identical_and_seed_changes_points_only(cfg, scene, tmp_path):
    fresh = load_synthetic(dataclasses.replace(cfg, cache_dir=str(tmp_path / "a")))
    assert torch.equal(_images(fresh), _images(scene))
    assert torch.equal(fresh.points, scene.points)
    assert torch.equal(fresh.colors, scene.colors)

    other = load_synthetic(dataclasses.replace(cfg, seed=1, cache_dir=str(tmp_path / "b")))
    assert torch.equal(_images(other), _images(scene))  # images do not depend on the seed
    assert not torch.allclose(other.points, scene.points)


def test_points_carry_sfm_like_tracks_unless_asked_not_to(cfg, scene, tmp_path):
    frames = _all_frames(scene)
    assert set(scene.observed) == set(scene.keypoints) == {f.name for f in frames}
    for frame in frames:
        rows, keypoints = scene.observed[frame.name], scene.keypoints[frame.name]  # [P_i], [P_i, 2]
        assert len(rows) > 100 and keypoints.shape == (len(rows), 2) and scene.keypoint_scale[frame.name] == 1.0
        pixels, depth = _project(scene.points[rows], frame.viewmat, frame.K)
        assert (depth > 0).all()
        distance = (pixels - keypoints).norm(dim=-1)  # the detector's noise about each point's projection
        assert 0.1 < distance.median() < 0.4 and distance.max() < 1.5
    seen_by = torch.zeros(len(scene.points), dtype=torch.int64)
    for rows in scene.observed.values():
        seen_by[rows] += 1
    assert (seen_by >= 3).float().mean() > 0.8  # most points are seen by several views, as SfM points are

    untracked = load_synthetic(dataclasses.replace(cfg, tracks=False))
    assert untracked.observed == {} and untracked.keypoints == {}
    assert torch.equal(untracked.points, scene.points)


def test_cache_file_is_written_and_read(cfg, scene, tmp_path):
    assert cache_path(cfg).is_file()  # written by the `scene` fixture
    local = dataclasses.replace(cfg, cache_dir=str(tmp_path))
    with np.load(cache_path(cfg)) as npz:
        arrays = {name: npz[name] for name in npz.files}
    arrays["points"] = arrays["points"] + 1.0  # a marker only a cache hit can return
    np.savez(cache_path(local), **arrays)

    cached = load_synthetic(local)
    assert torch.equal(cached.points, scene.points + 1.0)
    assert torch.equal(_images(cached), _images(scene))


@pytest.mark.parametrize("corruption", [b"not an npz file", b"", "truncated", "wrong_shape"])
def test_corrupt_cache_is_regenerated(cfg, scene, tmp_path, corruption):
    local = dataclasses.replace(cfg, cache_dir=str(tmp_path))
    path = cache_path(local)
    path.parent.mkdir(parents=True, exist_ok=True)
    if corruption == "truncated":
        path.write_bytes(cache_path(cfg).read_bytes()[:1000])
    elif corruption == "wrong_shape":
        arrays = {"images": np.zeros((1, 2, 3), np.uint8), "viewmats": np.eye(4), "Ks": np.eye(3)}
        np.savez(path, points=np.zeros((1, 3)), colors=np.zeros((1, 3)), **arrays)
    else:
        path.write_bytes(corruption)

    regenerated = load_synthetic(local)
    assert torch.equal(_images(regenerated), _images(scene))
    assert torch.equal(regenerated.points, scene.points)
    with np.load(path) as npz:  # the bad file was replaced by a good one
        assert npz["images"].shape == (cfg.num_views, cfg.height, cfg.width, 3)


def test_cache_key_follows_the_data_fields_and_the_environment(cfg, tmp_path, monkeypatch):
    assert cache_path(cfg) == cache_path(dataclasses.replace(cfg))
    assert cache_path(cfg) != cache_path(dataclasses.replace(cfg, seed=7))
    assert cache_path(cfg) != cache_path(dataclasses.replace(cfg, width=65))
    assert cache_path(cfg) != cache_path(dataclasses.replace(cfg, alpha=True))
    assert cache_path(cfg) == cache_path(dataclasses.replace(cfg, val_every=3))  # the split, not the data
    monkeypatch.setenv("GSRECON_CACHE", str(tmp_path))
    default = dataclasses.replace(cfg, cache_dir=None)
    assert cache_path(default).parent == tmp_path / "synthetic"
    assert cache_path(default).name == cache_path(cfg).name


def test_cache_key_follows_the_generator_source(cfg):
    sources = generator_sources()
    assert sources[0] == Path(synthetic.__file__).read_bytes()
    assert cache_path(cfg) == cache_path(cfg, generator_digest(sources))  # the default is the installed source
    middle = len(sources[0]) // 2
    one_byte = [sources[0][:middle] + bytes([sources[0][middle] ^ 1]) + sources[0][middle + 1 :], *sources[1:]]
    assert cache_path(cfg, generator_digest(one_byte)) != cache_path(cfg)
    helper = [*sources[:-1], sources[-1] + b"\n"]  # the camera helpers count too
    assert cache_path(cfg, generator_digest(helper)) != cache_path(cfg)
    assert generator_digest([b"ab", b"c"]) != generator_digest([b"a", b"bc"])  # file boundaries matter


def test_cache_dir_is_not_created(tmp_path, monkeypatch):
    monkeypatch.setenv("GSRECON_CACHE", str(tmp_path / "root"))
    assert cache_dir("synthetic") == tmp_path / "root" / "synthetic"
    assert not (tmp_path / "root").exists()


def test_unusable_cache_root_only_costs_time(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("GSRECON_CACHE", str(blocker / "cache"))  # cannot be created
    small = SyntheticConfig(num_views=2, width=16, height=12, num_points=20)
    assert load_synthetic(small).train[0].image.shape == (12, 16, 3)
    assert cache_path(small).parent == blocker / "cache" / "synthetic"
    unwritable = load_synthetic(dataclasses.replace(small, cache_dir=str(blocker / "folder")))
    assert unwritable.train[0].image.shape == (12, 16, 3) and blocker.read_text() == ""


def test_cache_file_names_are_canonical(tmp_path):
    key = {"size": (64, 48), "scale": 0.1, "nested": {"b": 1, "a": [0.5, 2.0]}}
    path = cache_file("images", key, ".png")
    assert path.parent == cache_dir("images") and path.name.startswith("images_") and path.suffix == ".png"
    same = {"nested": {"a": np.array([0.5, 2.0]), "b": 1}, "scale": np.float64(0.1), "size": [np.int64(64), 48]}
    assert cache_file("images", same, ".png") == path  # dict order, numpy numbers and tuples do not matter
    assert cache_file("images", key | {"scale": 0.1 + 1e-16}, ".png") != path
    assert cache_file("images", key | {"scale": np.float32(0.1)}, ".png") != path  # a different number
    assert cache_file("weights", key, ".png").name.split("_")[1] != path.name.split("_")[1]  # kind is hashed too
    assert cache_file("images", key, ".png", folder=tmp_path) == tmp_path / path.name
    assert cache_file("images", {"source": Path("/a/b")}, ".png") == cache_file("images", {"source": "/a/b"}, ".png")
    with pytest.raises(TypeError, match="object"):
        cache_file("images", {"x": object()}, ".png")


def test_split_sizes_and_names(scene, cfg, tmp_path):
    assert len(scene.train) == 21 and len(scene.test) == 3
    assert [f.name for f in scene.test] == ["view_000", "view_008", "view_016"]
    assert len({f.name for f in scene.train + scene.test}) == cfg.num_views

    no_val = load_synthetic(SyntheticConfig(num_views=5, val_every=0, num_points=50, cache_dir=str(tmp_path)))
    assert len(no_val.train) == 5 and no_val.test == []


def test_the_shared_data_keys_apply_to_the_synthetic_scene(cfg, tmp_path):
    """data.factor, data.eval_split and data.max_images mean the same as for photo datasets."""
    all_train = load_synthetic(cfg, eval_split="none")
    assert len(all_train.train) == cfg.num_views and all_train.test == []
    thinned = load_synthetic(cfg, eval_split="every_8", max_images=7)
    names = [f.name for f in _all_frames(thinned)]
    assert names == ["view_000", "view_004", "view_008", "view_012", "view_015", "view_019", "view_023"]
    assert [f.name for f in thinned.test] == ["view_000", "view_008"]  # the scene's own split (val_every)

    small = SyntheticConfig(num_views=2, num_points=50, width=16, height=12, cache_dir=str(tmp_path))
    half = load_synthetic(small, factor=2)
    assert half.train[0].image.shape == (6, 8, 3)
    full_k, half_k = load_synthetic(small).train[0].K, half.train[0].K
    assert half_k[0, 0] == pytest.approx(full_k[0, 0] / 2) and half_k[0, 2] == pytest.approx(full_k[0, 2] / 2)
    with pytest.raises(ValueError, match="data.factor=8 leaves no pixels of the 16x6 synthetic scene"):
        load_synthetic(dataclasses.replace(small, height=6), factor=8)
    pipeline = DataPipeline(
        DataPipeline.Config(factor=2, eval_split="none", max_images=3, reader=dataclasses.asdict(small)),
        torch.device("cpu"),
    )
    assert len(pipeline.scene.train) == 2 and pipeline.scene.train[0].image.shape == (6, 8, 3)


def test_camera_convention(scene, cfg):
    center = torch.tensor([cfg.look_at], dtype=torch.float32)  # [1, 3]
    up = torch.tensor([0.0, 0.0, 1.0])
    for frame in _all_frames(scene):
        R = frame.viewmat[:3, :3]
        assert frame.viewmat.dtype == torch.float32 and frame.viewmat.shape == (4, 4)
        assert torch.allclose(R @ R.T, torch.eye(3), atol=1e-5)
        assert torch.linalg.det(R) == pytest.approx(1.0, abs=1e-5)
        assert torch.equal(frame.viewmat[3], torch.tensor([0.0, 0.0, 0.0, 1.0]))
        assert frame.K[0, 2] == cfg.width / 2 and frame.K[1, 2] == cfg.height / 2
        uv, depth = _project(center, frame.viewmat, frame.K)
        assert depth.item() == pytest.approx(cfg.orbit_radius, rel=1e-5)
        assert torch.allclose(uv[0], torch.tensor([cfg.width / 2, cfg.height / 2]), atol=0.5)
        assert (R @ up)[1] < -0.5  # world up points up the image (camera y is down)
        assert frame.camera_center[2] > 1.0  # cameras look down from above the ground


def test_ground_fills_the_bottom_and_sky_shows_at_the_top(scene, cfg):
    images = _images(scene).float() / 255  # [N, H, W, 3]
    background = torch.tensor(cfg.background)
    is_sky = (images - background).abs().amax(-1) < 1e-6  # [N, H, W]
    assert not is_sky[:, cfg.height // 2 :].any()  # ground or objects everywhere in the lower half
    assert is_sky[:, 0].any(dim=-1).all()  # the top row of every view shows some sky
    assert is_sky.float().mean() < 0.3


def test_images_have_sensible_content(scene, cfg):
    images = _images(scene)
    assert images.dtype == torch.uint8
    assert images.shape == (cfg.num_views, cfg.height, cfg.width, 3)
    x = images.float() / 255
    assert x.std() > 0.15
    assert x.mean(dim=(1, 2, 3)).min() > 0.2  # no dark or empty view
    for frame in _all_frames(scene):
        img = frame.image.float() / 255
        assert img.std() > 0.1  # every view has structure
        assert (img.amax(-1) > 0.8).any()  # bright texture present
        # texture detail: neighbouring pixels differ, but mostly by little (learnable)
        dx = (img[:, 1:] - img[:, :-1]).abs().amax(-1)
        assert (dx > 0.1).float().mean() > 0.05
        assert dx.median() < 0.05


def test_point_cloud_lies_on_visible_surfaces(scene, cfg):
    points, colors = scene.points, scene.colors
    assert points.shape == (cfg.num_points, 3) and points.dtype == torch.float32
    assert colors.shape == (cfg.num_points, 3) and colors.dtype == torch.float32
    assert colors.min() >= 0.0 and colors.max() <= 1.0 and colors.std() > 0.1

    sigma = cfg.point_noise * 3.0  # noise is relative to the scene half-size (the 3 m ground disc)
    dist = surface_distance(points)
    assert 0.3 * sigma < dist.median() < 1.2 * sigma
    assert dist.max() < 6 * sigma

    seen = torch.zeros(len(points), dtype=torch.bool)
    for frame in _all_frames(scene):
        uv, depth = _project(points, frame.viewmat, frame.K)
        inside = (uv[:, 0] >= 0) & (uv[:, 0] < cfg.width) & (uv[:, 1] >= 0) & (uv[:, 1] < cfg.height)
        seen |= inside & (depth > 0)
    assert seen.float().mean() > 0.97


def test_exact_points_are_on_surfaces_with_the_colours_the_cameras_see(cfg, tmp_path):
    exact = load_synthetic(dataclasses.replace(cfg, point_noise=0.0, num_points=500, cache_dir=str(tmp_path)))
    assert surface_distance(exact.points).max() < 1e-5
    above_ground = exact.points[:, 2] > 1e-3
    assert 0.15 < above_ground.float().mean() < 0.6  # objects and ground both get points

    best = torch.full((len(exact.points),), float("inf"))  # [P] best colour match over the views
    for frame in _all_frames(exact):
        uv, depth = _project(exact.points, frame.viewmat, frame.K)
        col, row = uv[:, 0].floor().long(), uv[:, 1].floor().long()
        inside = (col >= 0) & (col < cfg.width) & (row >= 0) & (row < cfg.height) & (depth > 0)
        pixel = frame.image[row.clamp(0, cfg.height - 1), col.clamp(0, cfg.width - 1)].float() / 255
        error = (pixel - exact.colors).abs().amax(-1)
        best = torch.where(inside, torch.minimum(best, error), best)
    assert (best < 0.1).float().mean() > 0.97


@pytest.mark.parametrize("size", [(128, 96), (160, 120)])
def test_other_resolutions(size, tmp_path):
    width, height = size
    small = SyntheticConfig(num_views=2, width=width, height=height, num_points=100, cache_dir=str(tmp_path))
    scene = load_synthetic(small)
    frame = scene.test[0]
    assert frame.image.shape == (height, width, 3)
    assert frame.K[0, 2] == width / 2 and frame.K[1, 2] == height / 2
    base = load_synthetic(SyntheticConfig(num_views=2, num_points=100, cache_dir=str(tmp_path)))
    assert frame.K[0, 0] == pytest.approx(base.test[0].K[0, 0] * width / 64)  # same field of view


def test_alpha_images_composite_to_the_rgb_images(tmp_path):
    base = SyntheticConfig(num_views=3, num_points=50, background=(0.2, 0.3, 0.9), cache_dir=str(tmp_path))
    rgb = _images(load_synthetic(base)).float() / 255
    rgba = _images(load_synthetic(dataclasses.replace(base, alpha=True))).float() / 255
    assert rgba.shape[-1] == 4
    alpha = rgba[..., 3:]
    assert (alpha == 0).any() and (alpha == 1).any() and ((alpha > 0) & (alpha < 1)).any()
    composite = rgba[..., :3] * alpha + torch.tensor(base.background) * (1 - alpha)
    assert (composite - rgb).abs().max() < 3 / 255


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("width", 0),
        ("num_views", -1),
        ("val_every", -2),
        ("fov_deg", 180.0),
        ("point_noise", -0.1),
        ("arc_deg", 0.0),
        ("arc_deg", 400.0),
        ("elevations_deg", (95.0,)),
        ("background", (0.0, 2.0, 0.0)),
    ],
)
def test_invalid_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SyntheticConfig(**{field: value})


def test_cameras_that_miss_the_scene_are_an_error(tmp_path):
    far = SyntheticConfig(num_views=2, num_points=10, look_at=(50.0, 0.0, 0.0), cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="look_at"):
        load_synthetic(far)
