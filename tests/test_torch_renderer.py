"""The pure-PyTorch renderer: projection, compositing rules, culling, tiling, gradients, SH."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from gsrecon.cameras import Cameras
from gsrecon.geometry import quat_scale_to_factor
from gsrecon.render import torch_renderer
from gsrecon.render.base import RendererConfig, RenderOutput
from gsrecon.render.torch_renderer import (
    ALPHA_MIN,
    TRANSMITTANCE_MIN,
    TorchRenderer,
    project_gaussians,
)
from gsrecon.sh import (
    num_sh_bases,
    rgb_to_sh,
    sh_basis,
    sh_to_color,
    sh_to_rgb,
    spherical_harmonics,
)

torch.set_num_threads(1)

PARAMS = ("means", "scales", "quats", "opacities", "sh0", "shN")


def _cameras(
    width: int,
    height: int,
    focal: float,
    n_cams: int = 1,
    dtype=torch.float64,
    cx: float | None = None,
    cy: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Camera 0 at the origin looking down +z; camera c > 0 turned about y and shifted in x."""
    K = torch.tensor(
        [
            [focal, 0.0, width / 2 if cx is None else cx],
            [0.0, focal, height / 2 if cy is None else cy],
            [0.0, 0.0, 1.0],
        ],
        dtype=dtype,
    )
    viewmats = torch.eye(4, dtype=dtype).repeat(n_cams, 1, 1)
    for c in range(1, n_cams):
        a = 0.15 * c
        viewmats[c, :3, :3] = torch.tensor(
            [[math.cos(a), 0.0, math.sin(a)], [0.0, 1.0, 0.0], [-math.sin(a), 0.0, math.cos(a)]], dtype=dtype
        )
        viewmats[c, 0, 3] = 0.2 * c
    return viewmats, K.repeat(n_cams, 1, 1)


def _gaussians(means, sigmas, opacities, rgb, sh_degree: int = 0, dtype=torch.float64) -> dict[str, Tensor]:
    """Pre-activation parameters of isotropic, axis-aligned Gaussians with view-independent colour."""
    means = torch.as_tensor(means, dtype=dtype)
    n = means.shape[0]
    sigmas = torch.as_tensor(sigmas, dtype=dtype).reshape(n, 1).expand(n, 3)
    return {
        "means": means,
        "scales": torch.log(sigmas).clone(),
        "quats": torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=dtype).repeat(n, 1),
        "opacities": torch.logit(torch.as_tensor(opacities, dtype=dtype)),
        "sh0": rgb_to_sh(torch.as_tensor(rgb, dtype=dtype)).reshape(n, 1, 3),
        "shN": torch.zeros(n, num_sh_bases(sh_degree) - 1, 3, dtype=dtype),
    }


def _random_scene(
    n: int,
    width: int,
    height: int,
    focal: float,
    seed: int,
    opacity_logits: tuple[float, float],
    sh_degree: int = 2,
    dtype=torch.float64,
) -> dict[str, Tensor]:
    """Random Gaussians spread over (and a little beyond) the view, 1-3 px wide on screen."""
    g = torch.Generator().manual_seed(seed)
    depth = 2.0 + 3.0 * torch.rand(n, generator=g, dtype=dtype)
    pix = torch.rand(n, 2, generator=g, dtype=dtype) * 1.2 - 0.1  # fraction of the image
    x = (pix[:, 0] * width - width / 2) / focal * depth
    y = (pix[:, 1] * height - height / 2) / focal * depth
    lo, hi = opacity_logits
    return {
        "means": torch.stack([x, y, depth], dim=-1),
        "scales": torch.log((1.0 + 2.0 * torch.rand(n, 3, generator=g, dtype=dtype)) * depth[:, None] / focal),
        "quats": torch.randn(n, 4, generator=g, dtype=dtype),
        "opacities": lo + (hi - lo) * torch.rand(n, generator=g, dtype=dtype),
        "sh0": rgb_to_sh(torch.rand(n, 1, 3, generator=g, dtype=dtype)),
        "shN": 0.2 * torch.randn(n, num_sh_bases(sh_degree) - 1, 3, generator=g, dtype=dtype),
    }


def _requiring_grad(params: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}


def _dense_render(params, viewmats, Ks, width, height, sh_degree, backgrounds, cfg):
    """Brute-force reference: every visible Gaussian at every pixel, composited one at a time."""
    means = params["means"]
    factors = quat_scale_to_factor(params["quats"], params["scales"].exp())
    proj = project_gaussians(
        means, factors, F.logsigmoid(params["opacities"]), Cameras(viewmats, Ks, width, height), cfg
    )
    opacities = proj.log_opacities.exp()  # [C, N]
    centres = -(viewmats[:, :3, :3].transpose(1, 2) @ viewmats[:, :3, 3:]).squeeze(-1)
    dirs = torch.nn.functional.normalize(means[None] - centres[:, None], dim=-1)
    colors = sh_to_color(sh_degree, dirs, torch.cat([params["sh0"], params["shN"]], 1)[None])
    ys, xs = torch.meshgrid(
        torch.arange(height, dtype=means.dtype) + 0.5, torch.arange(width, dtype=means.dtype) + 0.5, indexing="ij"
    )
    images, alphas, depths = [], [], []
    for c in range(viewmats.shape[0]):
        ids = (proj.radii[c] > 0).any(-1).nonzero().squeeze(1)
        ids = ids[torch.argsort(proj.depths[c, ids], stable=True)]
        trans = torch.ones(height, width, dtype=means.dtype)
        done = torch.zeros(height, width, dtype=torch.bool)
        rgb = torch.zeros(height, width, 3, dtype=means.dtype)
        acc_depth = torch.zeros(height, width, dtype=means.dtype)
        for i in ids.tolist():
            dx, dy = xs - proj.means2d[c, i, 0], ys - proj.means2d[c, i, 1]
            a, b, cc = proj.conics[c, i]
            sigma = 0.5 * (a * dx * dx + cc * dy * dy) + b * dx * dy
            alpha = torch.clamp_max(opacities[c, i] * torch.exp(-sigma), cfg.alpha_max)
            next_trans = trans * (1.0 - alpha)
            used = (alpha >= ALPHA_MIN) & ~done
            stop = used & (next_trans <= TRANSMITTANCE_MIN)
            done, used = done | stop, used & ~stop
            weight = torch.where(used, alpha * trans, 0.0)
            rgb = rgb + weight[..., None] * colors[c, i]
            acc_depth = acc_depth + weight * proj.depths[c, i]
            trans = torch.where(used, next_trans, trans)
        alpha = 1.0 - trans
        images.append(rgb + trans[..., None] * backgrounds[c])
        alphas.append(alpha[..., None])
        depths.append(torch.where(alpha > 0, acc_depth / alpha.clamp_min(1e-10), 0.0)[..., None])
    return torch.stack(images), torch.stack(alphas), torch.stack(depths)


def _functional(out: RenderOutput | tuple[Tensor, Tensor, Tensor], weights: list[Tensor]) -> Tensor:
    image, alpha, depth = (out.image, out.alpha, out.depth) if isinstance(out, RenderOutput) else out
    return (image * weights[0]).sum() + (alpha * weights[1]).sum() + (depth * weights[2]).sum()


@pytest.mark.parametrize("opacity_logits", [(-2.0, 2.0), (2.0, 9.0)], ids=["translucent", "opaque"])
@pytest.mark.parametrize(
    "tile_size,max_chunk_elements,max_kept_elements,antialiased",
    [(8, 1 << 16, 1 << 24, False), (4, 1 << 16, 0, False), (5, 300, 1 << 24, True), (16, 1 << 16, 0, True)],
    ids=["tile8-kept", "tile4-recompute", "tile5-small-chunks-antialiased", "tile16-recompute-antialiased"],
)
def test_tiles_match_dense_reference(opacity_logits, tile_size, max_chunk_elements, max_kept_elements, antialiased):
    width, height, focal = 23, 17, 20.0
    params = _requiring_grad(_random_scene(70, width, height, focal, seed=1, opacity_logits=opacity_logits))
    viewmats, Ks = _cameras(width, height, focal, n_cams=2)
    backgrounds = torch.tensor([[0.1, 0.2, 0.3], [0.9, 0.5, 0.0]], dtype=torch.float64)
    cfg = TorchRenderer.Config(
        tile_size=tile_size,
        max_chunk_elements=max_chunk_elements,
        max_kept_elements=max_kept_elements,
        antialiased=antialiased,
    )
    out = TorchRenderer(cfg).render(params, Cameras(viewmats, Ks, width, height), 2, backgrounds)
    ref = _dense_render(params, viewmats, Ks, width, height, 2, backgrounds, cfg)
    for got, want in zip((out.image, out.alpha, out.depth), ref):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    if opacity_logits[0] > 0:  # the scene must exercise the transmittance cutoff
        assert (ref[1] > 1.0 - 2 * TRANSMITTANCE_MIN).any()

    g = torch.Generator().manual_seed(2)
    weights = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in ref]
    grads = torch.autograd.grad(_functional(out, weights), [params[k] for k in PARAMS])
    ref_grads = torch.autograd.grad(_functional(ref, weights), [params[k] for k in PARAMS])
    for key, got, want in zip(PARAMS, grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=lambda m, k=key: f"d/d{k}: {m}")


@pytest.mark.parametrize("max_kept_elements", [1 << 24, 0], ids=["kept", "recompute"])
def test_a_pile_longer_than_a_chunk_is_composited_in_segments_up_to_where_it_is_opaque(max_kept_elements: int):
    """120 wide Gaussians on every pixel, 4x4 tiles, 64-entry chunks: each tile's list is composited 4 slots at a
    time and stops after the segment that makes all its pixels opaque; image and gradients are the dense ones."""
    width, height, focal, n = 16, 12, 20.0, 120
    depths = torch.linspace(2.0, 5.0, n, dtype=torch.float64)
    means = torch.stack([torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64), depths], dim=1)
    rgb = torch.rand(n, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    params = _requiring_grad(_gaussians(means, depths * 8.0 / focal, [0.9] * n, rgb))  # 8 px wide
    viewmats, Ks = _cameras(width, height, focal)
    background = torch.tensor([[0.2, 0.4, 0.6]], dtype=torch.float64)
    cfg = TorchRenderer.Config(tile_size=4, max_chunk_elements=64, max_kept_elements=max_kept_elements)
    out = TorchRenderer(cfg).render(params, Cameras(viewmats, Ks, width, height), 0, background)
    ref = _dense_render(params, viewmats, Ks, width, height, 0, background, cfg)
    for got, want in zip((out.image, out.alpha, out.depth), ref):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    assert (ref[1] > 0.999).all()  # every pixel is opaque, far in front of the last Gaussians

    g = torch.Generator().manual_seed(6)
    weights = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in ref]
    grads = torch.autograd.grad(_functional(out, weights), [params[k] for k in PARAMS[:5]])
    ref_grads = torch.autograd.grad(_functional(ref, weights), [params[k] for k in PARAMS[:5]])
    for key, got, want in zip(PARAMS, grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=lambda m, k=key: f"d/d{k}: {m}")
    assert (grads[0][n // 2 :] == 0).all()  # the back half lies behind opaque pixels


@pytest.mark.parametrize("antialiased", [False, True], ids=["classic", "antialiased"])
def test_gradients_match_finite_differences(antialiased: bool):
    width, height, focal = 16, 12, 14.0
    params = _random_scene(6, width, height, focal, seed=3, opacity_logits=(-1.0, 1.5), sh_degree=2)
    viewmats, Ks = _cameras(width, height, focal, n_cams=2)
    backgrounds = torch.tensor([[0.3, 0.6, 0.9], [0.0, 0.0, 0.0]], dtype=torch.float64)
    renderer = TorchRenderer(TorchRenderer.Config(antialiased=antialiased))
    g = torch.Generator().manual_seed(4)
    probes = [torch.randn(3, 2, height, width, ch, generator=g, dtype=torch.float64) for ch in (3, 1, 1)]

    def probe(*tensors: Tensor) -> Tensor:  # three random linear functionals of image, alpha, depth
        out = renderer.render(dict(zip(PARAMS, tensors)), Cameras(viewmats, Ks, width, height), 2, backgrounds)
        return torch.stack([_functional(out, [p[i] for p in probes]) for i in range(3)])

    inputs = tuple(params[k].clone().requires_grad_(True) for k in PARAMS)
    assert torch.autograd.gradcheck(probe, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


def test_isotropic_gaussian_renders_its_analytic_footprint():
    width, height, focal, z, sigma_world, opacity = 33, 25, 100.0, 2.0, 0.02, 0.8
    viewmats, Ks = _cameras(width, height, focal, cx=16.5, cy=12.5)  # centre on pixel (16, 12)
    params = _gaussians([[0.0, 0.0, z]], [sigma_world], [opacity], [[0.2, 0.4, 1.0]])
    background = torch.tensor([[1.0, 0.0, 0.5]], dtype=torch.float64)
    cfg = TorchRenderer.Config()
    out = TorchRenderer(cfg).render(params, Cameras(viewmats, Ks, width, height), 0, background)

    torch.testing.assert_close(out.info["means2d"][0, 0], torch.tensor([16.5, 12.5], dtype=torch.float64))
    var = (sigma_world * focal / z) ** 2 + cfg.eps2d  # sigma * f / z, dilated by eps2d
    ys, xs = torch.meshgrid(
        torch.arange(height, dtype=torch.float64) + 0.5, torch.arange(width, dtype=torch.float64) + 0.5, indexing="ij"
    )
    expected = opacity * torch.exp(-0.5 * ((xs - 16.5) ** 2 + (ys - 12.5) ** 2) / var)
    expected = torch.where(expected >= ALPHA_MIN, expected, 0.0)
    torch.testing.assert_close(out.alpha[0, ..., 0], expected, rtol=1e-12, atol=1e-12)
    assert out.alpha[0, 12, 16, 0].item() == pytest.approx(opacity, abs=1e-12)  # peak alpha = opacity

    extent = min(3.33, math.sqrt(2.0 * math.log(255.0 * opacity)))
    assert out.info["radii"][0, 0].tolist() == [math.ceil(extent * math.sqrt(var))] * 2
    assert out.info["radii"].dtype == torch.int32
    assert out.info["depths"][0, 0].item() == pytest.approx(z)
    torch.testing.assert_close(
        out.image,
        out.alpha * torch.tensor([0.2, 0.4, 1.0], dtype=torch.float64) + (1.0 - out.alpha) * background[:, None, None],
    )
    covered = out.alpha[..., 0] > 0
    torch.testing.assert_close(out.depth[..., 0][covered], torch.full_like(out.depth[..., 0][covered], z))
    assert (out.depth[..., 0][~covered] == 0).all()


def test_projection_covariance_and_jacobian_clamp():
    width, height, focal, z = 40, 30, 50.0, 4.0
    viewmats, Ks = _cameras(width, height, focal)
    angle = 0.6  # rotation about the camera z axis
    quats = torch.tensor([[math.cos(angle / 2), 0.0, 0.0, math.sin(angle / 2)]] * 3, dtype=torch.float64)
    scales = torch.tensor([[0.1, 0.03, 0.05]] * 3, dtype=torch.float64)
    limit = 1.3 * (width / 2) / focal  # 1.3 tan(fov_x / 2)
    means = torch.tensor([[0.0, 0.0, z], [3.0 * limit * z, 0.0, z], [0.5 * limit * z, 0.0, z]], dtype=torch.float64)
    args = (means, quat_scale_to_factor(quats, scales), torch.full((3,), math.log(0.5), dtype=torch.float64))
    cameras = Cameras(viewmats, Ks, width, height)
    proj = project_gaussians(*args, cameras, RendererConfig(near_plane=0.01, far_plane=1e10, eps2d=0.3))
    antialiased = project_gaussians(
        *args, cameras, RendererConfig(near_plane=0.01, far_plane=1e10, eps2d=0.3, antialiased=True)
    )
    rot = torch.tensor(
        [[math.cos(angle), -math.sin(angle), 0.0], [math.sin(angle), math.cos(angle), 0.0], [0.0, 0.0, 1.0]],
        dtype=torch.float64,
    )
    cov3d = rot @ torch.diag(scales[0] ** 2) @ rot.T
    for i, u in enumerate([0.0, limit, 0.5 * limit]):  # the off-screen one is evaluated at the clamp
        jac = torch.tensor([[focal / z, 0.0, -focal * u / z], [0.0, focal / z, 0.0]], dtype=torch.float64)
        cov2d = jac @ cov3d @ jac.T + 0.3 * torch.eye(2, dtype=torch.float64)
        inv = torch.linalg.inv(cov2d)
        torch.testing.assert_close(proj.conics[0, i], torch.stack([inv[0, 0], inv[0, 1], inv[1, 1]]))
        # antialiased: opacity x sqrt(det(cov2d without eps2d) / det(cov2d)), same conic
        compensation = torch.sqrt(torch.linalg.det(cov2d - 0.3 * torch.eye(2, dtype=torch.float64)) / cov2d.det())
        torch.testing.assert_close(antialiased.log_opacities[0, i].exp(), 0.5 * compensation)
        torch.testing.assert_close(antialiased.conics[0, i], proj.conics[0, i])
    assert torch.all(proj.log_opacities == math.log(0.5))
    torch.testing.assert_close(
        proj.means2d[0, 1], torch.tensor([20.0 + 3.0 * limit * focal, 15.0], dtype=torch.float64)
    )


def _stack_of_three(front_to_back: list[int]) -> dict[str, Tensor]:
    """Red (opaque), blue (half) and green (opaque) Gaussians on the optical axis at the given depth ranks."""
    depths = [2.0 + d for d in front_to_back]
    return _gaussians(
        [[0.0, 0.0, d] for d in depths],
        [0.1 * d for d in depths],  # 5 px on screen
        [1.0 - 5e-5, 0.5, 1.0 - 5e-5],
        [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]],
        dtype=torch.float32,
    )


def test_depth_order_alpha_clamp_and_transmittance_cutoff():
    width, height = 17, 13
    viewmats, Ks = _cameras(width, height, 50.0, dtype=torch.float32, cx=8.5, cy=6.5)  # centre pixel (8, 6)
    bg = torch.tensor([[0.25, 0.5, 0.75]])
    renderer = TorchRenderer()
    # Red in front: alpha clamps to 0.99, blue takes half of the remaining 0.01, and green would
    # take T to 0.005 * 0.01 <= 1e-4, so it is not composited at all.
    out = renderer.render(_stack_of_three([0, 1, 2]), Cameras(viewmats, Ks, width, height), 0, bg)
    centre = out.image[0, 6, 8]
    expected = 0.99 * torch.tensor([1.0, 0.0, 0.0]) + 0.005 * torch.tensor([0.0, 0.0, 1.0]) + 0.005 * bg[0]
    torch.testing.assert_close(centre, expected, rtol=0, atol=1e-6)
    assert out.alpha[0, 6, 8, 0].item() == pytest.approx(0.995, abs=1e-6)
    # Reversed depths: green in front, and now red is the one cut off.
    out = renderer.render(_stack_of_three([2, 1, 0]), Cameras(viewmats, Ks, width, height), 0, bg)
    expected = 0.99 * torch.tensor([0.0, 1.0, 0.0]) + 0.005 * torch.tensor([0.0, 0.0, 1.0]) + 0.005 * bg[0]
    torch.testing.assert_close(out.image[0, 6, 8], expected, rtol=0, atol=1e-6)
    # The order of the Gaussians in memory does not matter.
    permuted = {k: v[torch.tensor([2, 0, 1])] for k, v in _stack_of_three([2, 1, 0]).items()}
    torch.testing.assert_close(renderer.render(permuted, Cameras(viewmats, Ks, width, height), 0, bg).image, out.image)


def test_clamped_and_cut_off_gaussians_get_no_gradient_at_that_pixel():
    width, height = 17, 13
    viewmats, Ks = _cameras(width, height, 50.0, dtype=torch.float32, cx=8.5, cy=6.5)
    params = _requiring_grad(_stack_of_three([0, 1, 2]))
    out = TorchRenderer().render(params, Cameras(viewmats, Ks, width, height), 0, torch.tensor([[0.25, 0.5, 0.75]]))
    grads = dict(
        zip(PARAMS, torch.autograd.grad(out.image[0, 6, 8].sum() + out.alpha[0, 6, 8, 0], [params[k] for k in PARAMS]))
    )
    red, blue, green = 0, 1, 2
    assert all(torch.isfinite(g).all() for g in grads.values())
    assert grads["opacities"][red] == 0  # alpha clamped at 0.99: no gradient through it
    assert grads["sh0"][red].abs().sum() > 0  # but its colour still counts
    assert grads["opacities"][blue] != 0 and grads["means"][blue].abs().sum() == 0  # at its centre
    for key in PARAMS:  # green is past the transmittance cutoff at this pixel
        assert (grads[key][green] == 0).all(), key


def test_background_alpha_and_depth_where_nothing_is():
    width, height, focal = 40, 30, 40.0
    viewmats, Ks = _cameras(width, height, focal, n_cams=2, dtype=torch.float32)
    params = _gaussians([[-0.8, -0.6, 2.0]], [0.02], [0.9], [[1.0, 1.0, 1.0]], dtype=torch.float32)
    backgrounds = torch.tensor([[0.1, 0.2, 0.3], [0.7, 0.6, 0.5]])
    out = TorchRenderer().render(params, Cameras(viewmats, Ks, width, height), 0, backgrounds)
    assert (out.alpha[:, 15:, 20:] == 0).all() and (out.depth[:, 15:, 20:] == 0).all()
    for c in range(2):
        assert (out.image[c, 15:, 20:] == backgrounds[c]).all()
    assert out.alpha[0].max() > 0.5  # the Gaussian itself is drawn in camera 0


def test_culled_gaussians_get_zero_radii_and_no_gradient():
    width, height, focal = 24, 18, 20.0
    viewmats, Ks = _cameras(width, height, focal, dtype=torch.float32)
    means = [
        [0.0, 0.0, 3.0],  # visible
        [0.0, 0.0, -3.0],  # behind the camera
        [0.0, 0.0, 0.005],  # closer than the near plane
        [100.0, 0.0, 3.0],  # far outside the image
        [0.3, 0.2, 3.0],
    ]  # opacity below 1/255
    params = _requiring_grad(
        _gaussians(
            means, [0.1] * 5, [0.7, 0.7, 0.7, 0.7, 1e-3], [[0.5, 0.5, 0.5]] * 5, sh_degree=1, dtype=torch.float32
        )
    )
    out = TorchRenderer().render(params, Cameras(viewmats, Ks, width, height), 1, torch.zeros(1, 3))
    visible = (out.info["radii"][0] > 0).all(-1)
    assert visible.tolist() == [True, False, False, False, False]
    assert (out.info["radii"][0, 1:] == 0).all()
    out.image.sum().backward()
    for key in PARAMS:
        grad = params[key].grad
        assert torch.isfinite(grad).all(), key
        assert (grad[1:] == 0).all(), key
    assert params["means"].grad[0].abs().sum() > 0
    means2d_grad = out.info["means2d"].grad
    assert means2d_grad is not None and (means2d_grad[0, 1:] == 0).all()
    assert means2d_grad[0, 0].abs().sum() > 0

    with torch.no_grad():
        out = TorchRenderer().render(params, Cameras(viewmats, Ks, width, height), 1, torch.zeros(1, 3))
    assert out.info["means2d"].grad_fn is None


def test_nothing_visible_renders_background_and_backpropagates_zeros():
    viewmats, Ks = _cameras(8, 6, 8.0, dtype=torch.float32)
    params = _requiring_grad(
        _gaussians([[0.0, 0.0, -1.0]] * 3, [0.1] * 3, [0.5] * 3, [[1.0, 0.0, 0.0]] * 3, dtype=torch.float32)
    )
    bg = torch.tensor([[0.3, 0.2, 0.1]])
    out = TorchRenderer().render(params, Cameras(viewmats, Ks, 8, 6), 0, bg)
    assert (out.image == bg).all() and (out.alpha == 0).all() and (out.info["radii"] == 0).all()
    out.image.sum().backward()
    assert all((params[k].grad == 0).all() for k in PARAMS)


def test_batched_cameras_equal_single_renders():
    width, height, focal = 20, 14, 16.0
    params = _random_scene(40, width, height, focal, seed=5, opacity_logits=(-1.0, 4.0), dtype=torch.float32)
    viewmats, Ks = _cameras(width, height, focal, n_cams=3, dtype=torch.float32)
    backgrounds = torch.rand(3, 3, generator=torch.Generator().manual_seed(0))
    renderer = TorchRenderer()
    batch = renderer.render(params, Cameras(viewmats, Ks, width, height), 2, backgrounds)
    assert batch.image.shape == (3, height, width, 3) and batch.info["n_cameras"] == 3
    for c in range(3):
        single = renderer.render(
            params, Cameras(viewmats[c : c + 1], Ks[c : c + 1], width, height), 2, backgrounds[c : c + 1]
        )
        torch.testing.assert_close(batch.image[c : c + 1], single.image)
        torch.testing.assert_close(batch.depth[c : c + 1], single.depth)
        assert torch.equal(batch.info["radii"][c : c + 1], single.info["radii"])


def test_lower_active_sh_degree_ignores_higher_coefficients():
    width, height, focal = 20, 14, 16.0
    params = _random_scene(30, width, height, focal, seed=6, opacity_logits=(0.0, 3.0), sh_degree=3)
    viewmats, Ks = _cameras(width, height, focal)
    bg = torch.zeros(1, 3, dtype=torch.float64)
    renderer = TorchRenderer()
    full = renderer.render(params, Cameras(viewmats, Ks, width, height), 1, bg)
    truncated = dict(params, shN=params["shN"][:, :3].clone())
    torch.testing.assert_close(
        full.image, renderer.render(truncated, Cameras(viewmats, Ks, width, height), 1, bg).image
    )
    assert not torch.allclose(full.image, renderer.render(params, Cameras(viewmats, Ks, width, height), 3, bg).image)


def test_render_rejects_inconsistent_inputs():
    viewmats, Ks = _cameras(8, 6, 8.0)
    params = _gaussians([[0.0, 0.0, 2.0]], [0.1], [0.5], [[1.0, 0.0, 0.0]])
    renderer = TorchRenderer()
    bg = torch.zeros(1, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="scales"):
        renderer.render(dict(params, scales=params["scales"][:, :2]), Cameras(viewmats, Ks, 8, 6), 0, bg)
    with pytest.raises(ValueError, match="sh_degree=2"):
        renderer.render(params, Cameras(viewmats, Ks, 8, 6), 2, bg)
    with pytest.raises(ValueError, match="missing"):
        renderer.render({k: v for k, v in params.items() if k != "sh0"}, Cameras(viewmats, Ks, 8, 6), 0, bg)
    with pytest.raises(ValueError, match="backgrounds"):
        renderer.render(params, Cameras(viewmats, Ks, 8, 6), 0, torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="tile_size"):
        TorchRenderer.Config(tile_size=0)
    with pytest.raises(ValueError, match="alpha_max"):
        TorchRenderer.Config(alpha_max=1.0)


def _real_sh_reference(degree: int, dirs: Tensor) -> Tensor:
    """Real SH built from scipy's complex ones: sqrt2 Re / Y_l0 / sqrt2 Im (3DGS sign convention)."""
    special = pytest.importorskip("scipy.special")
    if not hasattr(special, "sph_harm_y"):
        pytest.skip("scipy >= 1.15 needed for sph_harm_y")
    x, y, z = dirs.double().unbind(-1)
    theta, phi = torch.arccos(z).numpy(), torch.atan2(y, x).numpy()
    columns = []
    for l in range(degree + 1):
        for m in range(-l, l + 1):
            value = special.sph_harm_y(l, abs(m), theta, phi)
            columns.append(math.sqrt(2) * value.imag if m < 0 else value.real * (1.0 if m == 0 else math.sqrt(2)))
    return torch.tensor(list(zip(*columns)), dtype=torch.float64)


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_sh_matches_real_spherical_harmonics(degree):
    dirs = torch.nn.functional.normalize(
        torch.randn(12, 3, generator=torch.Generator().manual_seed(degree), dtype=torch.float64), dim=-1
    )
    basis = sh_basis(degree, dirs)
    torch.testing.assert_close(basis, _real_sh_reference(degree, dirs), rtol=1e-12, atol=1e-12)
    coeffs = torch.randn(12, 16, 3, dtype=torch.float64)
    coeffs[:, num_sh_bases(degree) :] = float("nan")  # coefficients above the active degree are never read
    values = spherical_harmonics(degree, dirs, coeffs)
    torch.testing.assert_close(values, torch.einsum("nk,nkc->nc", basis, coeffs[:, : num_sh_bases(degree)]))


def test_sh_dc_colour_round_trip_and_errors():
    rgb = torch.rand(5, 3, dtype=torch.float64)
    torch.testing.assert_close(sh_to_rgb(rgb_to_sh(rgb)), rgb)
    dirs = torch.nn.functional.normalize(torch.randn(5, 3, dtype=torch.float64), dim=-1)
    torch.testing.assert_close(sh_to_color(0, dirs, rgb_to_sh(rgb)[:, None]), rgb)
    assert (sh_to_color(0, dirs, rgb_to_sh(torch.full((5, 1, 3), -1.0))) == 0).all()  # clamped at 0
    with pytest.raises(ValueError, match="degree"):
        sh_basis(4, dirs)
    with pytest.raises(ValueError, match="coefficients"):
        spherical_harmonics(2, dirs, torch.zeros(5, 4, 3))


def _culling_scene(width: int, height: int, focal: float) -> dict[str, torch.Tensor]:
    """300 Gaussians, many of them off-screen, behind the cameras or too transparent to draw."""
    params = _random_scene(300, width, height, focal, seed=11, opacity_logits=(-7.0, 3.0), sh_degree=3)
    params["means"][::3] *= torch.tensor([6.0, 6.0, 1.0], dtype=torch.float64)  # many far off-screen
    params["means"][1::7, 2] *= -1.0  # some behind the cameras
    return params


def _render_and_backward(
    params: dict[str, torch.Tensor], renderer: TorchRenderer, width: int, height: int, focal: float
) -> tuple[RenderOutput, dict[str, torch.Tensor]]:
    """Two cameras' render of ``params`` and the gradients of a fixed random function of its maps."""
    viewmats, Ks = _cameras(width, height, focal, n_cams=2)
    backgrounds = torch.rand(2, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    p = _requiring_grad(params)
    out = renderer.render(p, Cameras(viewmats, Ks, width, height), 3, backgrounds)
    maps = (out.image, out.alpha, out.depth)
    weights = [torch.rand(t.shape, generator=torch.Generator().manual_seed(2), dtype=t.dtype) for t in maps]
    _functional(out, weights).backward()
    return out, {k: p[k].grad for k in PARAMS}


def _assert_same_render(
    a: tuple[RenderOutput, dict[str, torch.Tensor]], b: tuple[RenderOutput, dict[str, torch.Tensor]]
) -> None:
    (first, first_grads), (second, second_grads) = a, b
    for key in ("image", "alpha", "depth"):
        torch.testing.assert_close(getattr(first, key), getattr(second, key), msg=key)
    assert torch.equal(first.info["radii"], second.info["radii"])
    torch.testing.assert_close(first.info["means2d"].grad, second.info["means2d"].grad)
    for key in PARAMS:
        torch.testing.assert_close(first_grads[key], second_grads[key], msg=key)


@pytest.mark.parametrize("antialiased", [False, True])
def test_culling_keeps_images_and_gradients(antialiased: bool):
    size = (24, 16, 18.0)  # width, height, focal
    params = _culling_scene(*size)
    full, culled = (
        _render_and_backward(params, TorchRenderer(TorchRenderer.Config(cull=cull, antialiased=antialiased)), *size)
        for cull in (False, True)
    )
    visible = (full[0].info["radii"] > 0).any(-1).any(0)
    assert 0 < int(visible.sum()) < 200  # the scene exercises culling
    _assert_same_render(full, culled)


@pytest.mark.parametrize("cull", [False, True])
def test_chunks_keep_images_and_gradients(cull: bool, monkeypatch):
    """Projection in chunks recomputed by backward, and tile lists built a few Gaussians at a time, change nothing."""
    size = (24, 16, 18.0)  # width, height, focal
    params = _culling_scene(*size)
    whole = _render_and_backward(params, TorchRenderer(TorchRenderer.Config(cull=cull)), *size)
    monkeypatch.setattr(torch_renderer, "INTERSECT_CHUNK", 5)
    chunked = TorchRenderer(TorchRenderer.Config(cull=cull, max_kept_gaussians=0, max_chunk_gaussians=7))
    _assert_same_render(whole, _render_and_backward(params, chunked, *size))


@pytest.mark.parametrize("max_chunk_elements", [1 << 16, 64], ids=["one-segment", "segments"])
def test_median_depth_is_the_depth_where_the_accumulated_opacity_crosses_one_half(max_chunk_elements: int):
    """Twelve Gaussians of opacity 0.1 on the axis: T falls 0.9 per Gaussian, from 0.531 to 0.478 across the 7th."""
    width, height, focal, n = 16, 12, 20.0, 12
    depths = torch.linspace(2.0, 4.2, n, dtype=torch.float64)
    means = torch.stack([torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64), depths], dim=1)
    params = _gaussians(means, depths * 8.0 / focal, [0.1] * n, [[0.5, 0.5, 0.5]] * n)
    viewmats, Ks = _cameras(width, height, focal, cx=8.0, cy=6.0)  # pixel (8, 6)'s centre lies off the axis
    cfg = TorchRenderer.Config(tile_size=4, max_chunk_elements=max_chunk_elements, median_depth=True)
    out = TorchRenderer(cfg).render(
        params, Cameras(viewmats, Ks, width, height), 0, torch.zeros(1, 3, dtype=torch.float64)
    )
    centre = (slice(None), slice(5, 7), slice(7, 9))  # the four pixels around the axis see each Gaussian alike
    variance = 8.0**2 + TorchRenderer.Config().eps2d  # px^2: 8 px wide on screen, dilated by eps2d
    alpha = 0.1 * math.exp(-0.5 * (0.5**2 + 0.5**2) / variance)  # half a pixel off the axis each way
    alphas = torch.full((n,), alpha, dtype=torch.float64)  # [n]
    trans = torch.cumprod(torch.cat([torch.ones(1, dtype=torch.float64), 1 - alphas]), 0)  # [n + 1]
    crossing = int(((trans[:-1] > 0.5) & (trans[1:] <= 0.5)).nonzero())
    assert crossing == 6
    torch.testing.assert_close(out.median_depth[centre], torch.full((1, 2, 2, 1), depths[crossing].item()).double())
    expected = (alphas * trans[:-1] * depths).sum() / (1 - trans[-1])
    torch.testing.assert_close(out.depth[centre], torch.full((1, 2, 2, 1), expected.item()).double())
    assert out.depth[centre].max() < depths[crossing] - 0.1  # the expected depth lies in front of that surface


def test_median_depth_is_zero_where_the_opacity_stays_below_one_half_and_takes_no_gradient():
    width, height = 17, 13
    viewmats, Ks = _cameras(width, height, 50.0, dtype=torch.float32, cx=8.5, cy=6.5)  # centre pixel (8, 6)
    bg = torch.zeros(1, 3)
    thin = _requiring_grad(_gaussians([[0.0, 0.0, 2.0], [0.0, 0.0, 3.0]], [0.2, 0.3], [0.3, 0.2], [[1.0] * 3] * 2,
                                      dtype=torch.float32))  # fmt: skip
    renderer = TorchRenderer(TorchRenderer.Config(median_depth=True))
    out = renderer.render(thin, Cameras(viewmats, Ks, width, height), 0, bg)
    assert out.alpha[0, 6, 8, 0].item() == pytest.approx(1 - 0.7 * 0.8, abs=1e-6)  # 0.44: no surface
    assert (out.median_depth == 0).all() and out.depth[0, 6, 8, 0] > 2.0
    assert not out.median_depth.requires_grad
    # The red, blue, green stack: red (alpha 0.99) is the surface whatever lies behind it.
    out = renderer.render(_stack_of_three([0, 1, 2]), Cameras(viewmats, Ks, width, height), 0, bg)
    assert out.median_depth[0, 6, 8, 0].item() == pytest.approx(2.0)
    out = renderer.render(_stack_of_three([2, 1, 0]), Cameras(viewmats, Ks, width, height), 0, bg)
    assert out.median_depth[0, 6, 8, 0].item() == pytest.approx(2.0)  # green, now in front, at depth 2
    # Asked for nothing, the renderer renders no median depth (it costs time) and the same image.
    plain = TorchRenderer().render(_stack_of_three([2, 1, 0]), Cameras(viewmats, Ks, width, height), 0, bg)
    assert plain.median_depth is None and torch.equal(plain.image, out.image) and torch.equal(plain.depth, out.depth)
