"""The sky module: an environment behind the Gaussians (gsrecon.render.environment, views: {name: environment})."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from gsrecon.cameras import CameraModel, Cameras
from gsrecon.cameras.lens import project_points
from gsrecon.cameras.rays import camera_rays
from gsrecon.cli import main
from gsrecon.config import parse_structured
from gsrecon.data.pipeline import Batch
from gsrecon.data.readers.synthetic import SyntheticConfig, render_view, street_viewmats
from gsrecon.engine.checkpoints import load_checkpoint_file
from gsrecon.engine.inference import TrainedScene
from gsrecon.engine.resolve import RunConfig
from gsrecon.export.lod.site import CameraRegion
from gsrecon.lod.export import sky_gaussians
from gsrecon.logging.console import Logger
from gsrecon.model.views.base import ViewModules
from gsrecon.model.views.environment import Environment, environment_module, sky_key, stored_sky, trained_sky
from gsrecon.registry import RENDERER_REGISTRY, VIEW_REGISTRY
from gsrecon.render.base import RenderOutput
from gsrecon.render.environment import (
    Sky,
    above_horizon,
    composite,
    cube_lookup,
    far_sphere_gaussians,
    texel_directions,
)
from gsrecon.sh import sh_to_rgb
from tests.conftest import write_yaml

SKY = {"sky": {"name": "environment", "resolution": 4}}
K = torch.tensor([[30.0, 0.0, 32.0], [0.0, 30.0, 24.0], [0.0, 0.0, 1.0]])


def _turned(angle: float) -> torch.Tensor:
    """[4, 4] a camera at the origin turned by ``angle`` radians about its y axis."""
    c, s = math.cos(angle), math.sin(angle)
    viewmat = torch.eye(4)
    viewmat[:3, :3] = torch.tensor([[c, 0.0, -s], [0.0, 1.0, 0.0], [s, 0.0, c]])
    return viewmat


def test_lookup_at_texel_centres_reads_each_texel() -> None:
    texture = torch.rand(6, 5, 5, 3, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(cube_lookup(texture, texel_directions(5)), texture)


@pytest.mark.parametrize("lens", ["pinhole", "fisheye"])
def test_camera_rays_project_back_onto_their_pixels(lens: str) -> None:
    coeffs = torch.tensor([0.05, 0.01, -0.002, 0.0])
    model = CameraModel() if lens == "pinhole" else CameraModel.fisheye(coeffs)
    batch_model = model if lens == "pinhole" else CameraModel.fisheye(coeffs[None])
    viewmat = _turned(0.7)
    viewmat[:3, 3] = torch.tensor([0.3, -1.0, 2.0])
    rays = camera_rays(Cameras(viewmat[None], K[None], 64, 48, batch_model))  # [1, 48, 64, 3]
    torch.testing.assert_close(rays.norm(dim=-1), torch.ones(1, 48, 64))
    centre = torch.linalg.inv(viewmat)[:3, 3]
    pixels, seen = project_points(centre + 5.0 * rays[0].reshape(-1, 3), viewmat, K, model)
    ys, xs = torch.meshgrid(torch.arange(48) + 0.5, torch.arange(64) + 0.5, indexing="ij")
    assert seen.all()
    torch.testing.assert_close(pixels[:, :2], torch.stack([xs, ys], dim=-1).reshape(-1, 2), atol=1e-3, rtol=0)


@pytest.mark.parametrize("renderer", ["torch", "cpu"])
def test_gradient_reaches_the_environment_and_the_opacities(renderer: str) -> None:
    """The composited image's gradient reaches the cube map (only the texels the camera sees) and the Gaussians'
    opacity through alpha: its derivative there is the colour seen minus the environment's."""
    generator = torch.Generator().manual_seed(0)
    n = 40
    params = {
        "means": torch.randn(n, 3, generator=generator) * 0.3 + torch.tensor([0.0, 0.0, 3.0]),
        "scales": torch.full((n, 3), -2.5),
        "quats": torch.tensor([1.0, 0.0, 0.0, 0.0]).repeat(n, 1),
        "opacities": torch.zeros(n),
        "sh0": torch.rand(n, 1, 3, generator=generator),
        "shN": torch.zeros(n, 0, 3),
    }
    params = {k: v.requires_grad_() for k, v in params.items()}
    module = Environment(Environment.Config(resolution=4), ["a"])
    cameras = Cameras(torch.eye(4)[None], K[None], 64, 48)
    backgrounds = torch.tensor([[0.2, 0.3, 0.4]])
    out = RENDERER_REGISTRY.build({"name": renderer}).render(params, cameras, 0, backgrounds)
    image = module.composite(out, cameras, backgrounds).image
    target = torch.rand(image.shape, generator=generator)
    ((image - target) ** 2).sum().backward()
    grad = module.texels.grad  # [6, 4, 4, 3]
    assert grad[4].abs().sum() > 0  # +z: the face the camera looks at
    assert torch.equal(grad[5], torch.zeros_like(grad[5]))  # -z: behind it
    assert params["opacities"].grad.abs().sum() > 0
    # alpha's own gradient: d image / d alpha = -(environment - background) beyond what the renderer composited
    alpha = out.alpha.detach().requires_grad_()
    env = torch.rand(1, 48, 64, 3, generator=generator)
    composed = composite(type(out)(out.image.detach(), alpha, out.depth, out.info), env, backgrounds).image
    composed.sum().backward()
    torch.testing.assert_close(alpha.grad, -(env - backgrounds[:, None, None, :]).sum(-1, keepdim=True))


def test_opacity_reg_pushes_the_opacity_to_either_side() -> None:
    """The entropy term of a step's render lowers an opacity below 1/2 and raises one above it."""
    module = Environment(Environment.Config(resolution=2, opacity_reg=0.5), ["a"])
    cameras = Cameras(torch.eye(4)[None], K[None], 64, 48)
    alpha = torch.full((1, 48, 64, 1), 0.3)
    alpha[:, :24] = 0.8
    alpha.requires_grad_()
    out = RenderOutput(torch.zeros(1, 48, 64, 3), alpha, torch.zeros(1, 48, 64, 1), {})
    batch = Batch(torch.zeros(1, 48, 64, 3), cameras, torch.zeros(1, 3), ["a"])
    drawn, terms = ViewModules({"sky": module}).draw(out, batch)  # a training step's render
    term = terms["sky"]
    term.backward()
    assert term > 0 and (alpha.grad[:, :24] < 0).all() and (alpha.grad[:, 24:] > 0).all()  # descent: up, down
    assert torch.equal(module.render_term(out), term.detach())  # the step's values given, nothing kept
    assert module.regularization(drawn, batch) is None  # its one term is of the render


def test_sky_prior_fades_the_gaussians_only_where_the_environment_draws_the_photo() -> None:
    """The prior's term of a step's render lowers the opacity where the sky's colour is the photo's, and leaves it
    where the photo shows something else."""
    module = Environment(Environment.Config(resolution=2, init=0.25, sky_prior=1.0), ["a"])
    cameras = Cameras(torch.eye(4)[None], K[None], 64, 48)
    photo = torch.full((1, 48, 64, 3), 0.25)  # the grey the environment starts as ...
    photo[:, 24:] = 0.9  # ... above, something else below
    batch = Batch(photo, cameras, torch.zeros(1, 3), ["a"])
    alpha = torch.full((1, 48, 64, 1), 0.5, requires_grad=True)
    out = RenderOutput(torch.zeros(1, 48, 64, 3), alpha, torch.zeros(1, 48, 64, 1), {})
    drawn = module.composite(out, cameras, torch.zeros(1, 3))
    assert module.adjust_image(drawn.image, batch, drawn) is drawn.image  # the prior is a term, not an adjustment
    term = module.regularization(drawn, batch)
    term.backward()
    assert term > 0 and (alpha.grad[:, :24] > 0).all()  # descent lowers the opacity in front of the sky
    assert alpha.grad[:, 24:].abs().max() < 1e-6 * alpha.grad[:, :24].min()  # and not in front of the rest
    assert torch.equal(module.regularization(drawn, batch), term.detach())  # the step's values given, nothing kept


def test_the_sky_term_of_a_step_is_its_render_term_and_its_prior_summed() -> None:
    module = Environment(Environment.Config(resolution=2, init=0.25, opacity_reg=0.5, sky_prior=1.0), ["a"])
    cameras = Cameras(torch.eye(4)[None], K[None], 64, 48)
    batch = Batch(torch.full((1, 48, 64, 3), 0.25), cameras, torch.zeros(1, 3), ["a"])
    alpha = torch.linspace(0.1, 0.9, 48 * 64).reshape(1, 48, 64, 1)
    views = ViewModules({"sky": module})
    render = RenderOutput(torch.zeros(1, 48, 64, 3), alpha, torch.zeros(1, 48, 64, 1), {})
    out, drawn = views.draw(render, batch)  # a training step's: the composite, and the term of the render
    assert list(drawn) == ["sky"] and torch.equal(out.image, views.composite(render, batch).image)
    assert torch.equal(drawn["sky"], module.render_term(render))
    terms = views.regularization(out, batch, drawn)
    assert list(terms) == ["sky"] and torch.equal(terms["sky"], drawn["sky"] + module.regularization(out, batch))


def test_horizon_draws_the_environment_above_it_and_the_background_below() -> None:
    up = torch.tensor([0.0, -1.0, 0.0])  # an upright camera's (identity pose: y down) up
    rays = torch.tensor([[0.0, -1.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, -0.02, 1.0]])
    torch.testing.assert_close(above_horizon(rays, up)[:, 0], torch.tensor([1.0, 0.0, 0.5, 0.7]), atol=1e-3, rtol=0)
    assert (above_horizon(rays, torch.zeros(3)) == 1.0).all()  # up unknown: everywhere
    module = Environment(Environment.Config(resolution=2, init=0.8, horizon=True), ["a"])
    module.up.copy_(up)
    cameras = Cameras(torch.eye(4)[None], K[None], 64, 48)
    background = torch.full((1, 48, 64, 3), 0.1)  # what the renderer drew where no Gaussian is
    out = RenderOutput(background, torch.zeros(1, 48, 64, 1), torch.zeros(1, 48, 64, 1), {})
    image = module.composite(out, cameras, torch.full((1, 3), 0.1)).image  # [1, 48, 64, 3]
    torch.testing.assert_close(image[0, :20], torch.full((20, 64, 3), 0.8))  # the sky above
    torch.testing.assert_close(image[0, 28:], torch.full((20, 64, 3), 0.1))  # the background below
    drawn = trained_sky(ViewModules({"sky": module}), torch.full((3,), 0.1))  # [6, 2, 2, 3] what a viewer shows
    assert drawn[2].max() < 0.2 and drawn[3].min() > 0.7  # the +y face (down) background, -y (up) the sky


def test_horizon_and_sky_prior_from_the_command_line(make_config, tmp_path: Path) -> None:
    views = {"sky": {"name": "environment", "resolution": 4, "horizon": True, "sky_prior": 0.1}}
    config = write_yaml(tmp_path / "h.yaml", make_config("h", views=views, max_steps=3, val_interval=3))
    assert main(["train", "--config", str(config)]) == 0
    up = load_checkpoint_file(tmp_path / "h" / "checkpoints" / "last.pt")["views"]["sky"]["module"]["up"]
    assert float(up.norm()) == pytest.approx(1.0)  # the training cameras' up, kept for eval, render and view
    assert main(["eval", "--exp-dir", str(tmp_path / "h"), "--device", "cpu"]) == 0


def test_without_modules_the_render_is_untouched() -> None:
    out = object()
    assert ViewModules({}).composite(out, None) is out  # a run without the module renders as before


def test_far_sphere_gaussians_draw_the_environment_from_its_centre() -> None:
    texture = torch.rand(6, 8, 8, 3, generator=torch.Generator().manual_seed(1))
    gaussians = far_sphere_gaussians(texture, torch.zeros(3), radius=50.0)
    assert gaussians["means"].shape == (6 * 64, 3)
    torch.testing.assert_close(gaussians["means"].norm(dim=-1), torch.full((384,), 50.0))
    renderer = RENDERER_REGISTRY.build({"name": "torch", "far_plane": 1e4})
    for angle in (0.0, 0.6):  # a face's centre, and across an edge between faces
        cameras = Cameras(_turned(angle)[None], K[None], 64, 48)
        with torch.no_grad():
            out = renderer.render(gaussians, cameras, 0)
        assert out.alpha.min() > 0.8
        # random texels 0.33 apart on average: the Gaussians blend neighbours about as the bilinear lookup does
        assert (out.image - cube_lookup(texture, camera_rays(cameras))).abs().mean() < 0.12


def test_the_street_sky_is_the_sky_where_rays_miss(synthetic_cache: Path) -> None:
    cfg = SyntheticConfig(layout="street", num_views=8, sky="gradient", supersample=1, cache_dir=str(synthetic_cache))
    viewmat = street_viewmats(cfg)[3]
    K_np = np.array([[68.6, 0.0, 32.0], [0.0, 68.6, 24.0], [0.0, 0.0, 1.0]])
    image = render_view(viewmat, K_np, cfg)
    plain = SyntheticConfig(layout="street", num_views=8, alpha=True, supersample=1)
    miss = render_view(viewmat, K_np, plain)[..., 3] == 0
    assert miss[:8].mean() > 0.5 and not miss[-8:, 24:40].any()  # sky above, street below
    assert image[miss].min() > 60 and (image[miss][:, 2] >= image[miss][:, 0]).all()  # pale to blue, never black
    with pytest.raises(ValueError, match="sky"):
        SyntheticConfig(sky="gradient", alpha=True)


def test_environment_from_the_command_line_trains_resumes_evaluates_and_exports(
    make_config, tmp_path: Path, capsys
) -> None:
    whole = write_yaml(tmp_path / "whole.yaml", make_config("whole", views=SKY))
    assert main(["train", "--config", str(whole)]) == 0
    exp_dir = tmp_path / "whole"
    assert "is not in it" in (exp_dir / "train.log").read_text()  # the PLY says it holds no sky
    step_3 = exp_dir / "checkpoints" / "step_000003.pt"
    resumed_yaml = write_yaml(tmp_path / "resumed.yaml", make_config("resumed", views=SKY, resume=str(step_3)))
    assert main(["train", "--config", str(resumed_yaml)]) == 0
    reference = load_checkpoint_file(exp_dir / "checkpoints" / "last.pt")
    resumed = load_checkpoint_file(tmp_path / "resumed" / "checkpoints" / "last.pt")
    assert resumed["step"] == 6 and resumed["views"]["sky"]["module"]["texels"].shape == (6, 4, 4, 3)
    for name, value in reference["params"].items():
        assert torch.equal(resumed["params"][name], value), name
    saved, restored = reference["views"]["sky"], resumed["views"]["sky"]
    assert torch.equal(restored["module"]["texels"], saved["module"]["texels"])
    saved, restored = saved["optimizer"]["state"][0], restored["optimizer"]["state"][0]
    assert all(torch.equal(saved[key], restored[key]) for key in saved)
    assert main(["eval", "--exp-dir", str(exp_dir), "--device", "cpu"]) == 0
    out = tmp_path / "sky.ply"
    capsys.readouterr()
    assert main(["export", "--exp-dir", str(exp_dir), "--format", "ply", "--out", str(out)]) == 0
    assert "is not in it" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("views", "data", "key"),
    [
        ({"sky": {"name": "environment", "resolution": 0}}, {}, "views.sky"),
        ({"sky": {"name": "environment", "resolution": 10**7}}, {}, "views.sky"),
        ({"sky": {"name": "environment", "lr": float("nan")}}, {}, "views.sky"),
        ({"sky": {"name": "environment", "lr": -1.0}}, {}, "views.sky"),
        ({"sky": {"name": "environment", "init": 1.5}}, {}, "views.sky"),
        ({"sky": {"name": "environment", "opacity_reg": float("nan")}}, {}, "views.sky"),
        ({"sky": {"name": "environment", "sky_prior": -0.1}}, {}, "views.sky"),
        ({"sky": {"name": "environment", "sky_match": 0.0}}, {}, "views.sky"),
        (SKY, {"background": "random"}, "views.sky"),
    ],
)
def test_bad_environment_options_name_the_key(make_config, tmp_path: Path, capsys, views, data, key) -> None:
    cfg = make_config("bad", views=views)
    cfg["data"].update(data)
    assert main(["train", "--config", str(write_yaml(tmp_path / "bad.yaml", cfg))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0]


def _trained_sky_module(cls: type[Environment] = Environment) -> Environment:
    """A horizon sky of random texels, its up an upright camera's, as a run trains it."""
    module = cls(cls.Config(resolution=3, horizon=True), ["a"])
    with torch.no_grad():
        module.texels.copy_(torch.randn(6, 3, 3, 3, generator=torch.Generator().manual_seed(2)))
    module.up.copy_(torch.tensor([0.0, -1.0, 0.0]))
    return module


def test_the_viewers_baked_sky_is_the_modules_drawing_at_its_texels_as_it_was() -> None:
    """One drawing: the baked cube map (the viewer's, the far sphere's) is :meth:`Sky.draw` at the texels' centres,
    the colours it had when it was its own formula (each texel weighed by its centre's share above the horizon),
    and the module's composite draws the same function along each pixel's ray."""
    module = _trained_sky_module()
    background = torch.tensor([0.1, 0.2, 0.3])
    baked = trained_sky(ViewModules({"sky": module}), background)  # [6, 3, 3, 3]
    colors = module.colors().detach()
    share = above_horizon(texel_directions(3), module.up)  # [6, 3, 3, 1]
    torch.testing.assert_close(baked, share * colors + (1.0 - share) * background, rtol=0, atol=1e-6)
    assert share.min() == 0.0 and share.max() == 1.0  # both sides of the horizon are among the texels
    cameras = Cameras(_turned(0.3)[None], K[None], 64, 48)
    drawn = background.expand(1, 48, 64, 3)  # what the renderer drew where no Gaussian is
    out = RenderOutput(drawn, torch.zeros(1, 48, 64, 1), torch.zeros(1, 48, 64, 1), {})
    with torch.no_grad():
        image = module.composite(out, cameras, background[None]).image[0]
    torch.testing.assert_close(image, module.sky().draw(camera_rays(cameras), background)[0].detach())
    sphere = far_sphere_gaussians(baked, torch.zeros(3), 10.0)
    torch.testing.assert_close(sh_to_rgb(sphere["sh0"][:, 0]), baked.reshape(-1, 3), rtol=0, atol=1e-6)


def test_the_sky_is_read_from_a_checkpoint_without_the_runs_data_or_a_renderer(make_config, tmp_path: Path) -> None:
    """``export --format lod``'s sky: the checkpoint's cube map and horizon, for a run whose capture is not there."""
    module = _trained_sky_module()
    views = {"sky": {"name": "environment", "resolution": 3, "horizon": True}}
    raw = make_config(views=views, data={"dataset": "colmap", "path": str(tmp_path / "no_capture")})
    state = ViewModules({"sky": module}).state_dict()
    sky = stored_sky({"views": views}, state)
    assert torch.equal(sky.colors, module.colors().detach()) and torch.equal(sky.up, module.up)
    assert not sky.colors.requires_grad
    scene = TrainedScene(parse_structured(RunConfig, raw), {}, 6, "ckpt.pt", state)
    region = CameraRegion((0.0, 0.0, 0.0), 1.0)
    gaussians = sky_gaussians(scene, region, 4.0, Logger())
    torch.testing.assert_close(gaussians["means"].norm(dim=-1), torch.full((54,), 4.0))
    baked = sky.baked(torch.zeros(3))  # below the horizon, the run's black background
    torch.testing.assert_close(sh_to_rgb(gaussians["sh0"][:, 0]), baked.reshape(-1, 3), rtol=0, atol=1e-6)
    assert stored_sky({"views": {}}, {}) is None


def test_a_plugins_subclass_of_the_sky_is_found_alike_in_a_config_and_among_built_modules(make_config) -> None:
    """The lod export looked the sky up by registry name (missing a plugin's subclass), the merge by class."""

    @VIEW_REGISTRY.register("painted_sky")
    class PaintedSky(Environment):
        pass

    module = _trained_sky_module(PaintedSky)
    resolved = {"views": {"backdrop": {"name": "painted_sky", "resolution": 3, "horizon": True}, "pose": None}}
    assert sky_key(resolved) == "backdrop"
    assert environment_module(ViewModules({"backdrop": module})) == ("backdrop", module)
    sky = stored_sky(resolved, ViewModules({"backdrop": module}).state_dict())
    assert torch.equal(sky.colors, module.colors().detach())
    raw = make_config(views={"backdrop": {"name": "painted_sky", "resolution": 3, "horizon": True}})
    scene = TrainedScene(
        parse_structured(RunConfig, raw), {}, 6, "ckpt.pt", ViewModules({"backdrop": module}).state_dict()
    )
    assert len(sky_gaussians(scene, CameraRegion((0.0, 0.0, 0.0), 1.0), 4.0, Logger())["means"]) == 54  # lod has it
    assert sky_key({"views": {"sky": {"name": "none"}}}) is None and environment_module(ViewModules({})) is None


def test_a_sky_without_a_horizon_is_drawn_everywhere() -> None:
    colors = torch.rand(6, 2, 2, 3, generator=torch.Generator().manual_seed(3))
    rays = torch.nn.functional.normalize(torch.randn(10, 3, generator=torch.Generator().manual_seed(4)), dim=-1)
    sky = Sky(colors)
    assert sky.above(rays) is None
    assert torch.equal(sky.draw(rays, torch.ones(3)), cube_lookup(colors, rays))
