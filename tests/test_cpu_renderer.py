"""The compiled CPU renderer against the torch renderer: images, gradients, 2D-gradient info, determinism."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from gsrecon.data.scene import CameraModel
from gsrecon.render.cpu.kernels import KernelsUnavailableError, load_kernels
from gsrecon.render.cpu.renderer import CpuRenderer
from gsrecon.render.torch_renderer import TorchRenderer

try:
    load_kernels()
except KernelsUnavailableError as exc:
    pytest.skip(f"no CPU kernels here: {exc}", allow_module_level=True)

PARAMS = ("means", "scales", "quats", "opacities", "sh0", "shN")
WIDTH, HEIGHT = 64, 48


def _scene(n: int = 5000, sh_degree: int = 3, seed: int = 0) -> dict[str, Tensor]:
    """``n`` random Gaussians in front of two cameras, all SH bands non-zero."""
    g = torch.Generator().manual_seed(seed)
    n_rest = (sh_degree + 1) ** 2 - 1
    means = torch.randn(n, 3, generator=g) * torch.tensor([1.2, 0.9, 0.8]) + torch.tensor([0.0, 0.0, 4.0])
    return {
        "means": means,
        "scales": math.log(0.04) + 0.5 * torch.randn(n, 3, generator=g),
        "quats": torch.randn(n, 4, generator=g),
        "opacities": torch.randn(n, generator=g),
        "sh0": 0.6 * torch.randn(n, 1, 3, generator=g),
        "shN": 0.2 * torch.randn(n, n_rest, 3, generator=g),
    }


def _cameras(n_cams: int = 2) -> tuple[Tensor, Tensor]:
    """Camera 0 at the origin looking down +z; camera 1 turned about y and shifted."""
    viewmats = torch.eye(4).repeat(n_cams, 1, 1)
    for c in range(1, n_cams):
        a = 0.2 * c
        viewmats[c, :3, :3] = torch.tensor([[math.cos(a), 0, math.sin(a)], [0, 1, 0], [-math.sin(a), 0, math.cos(a)]])
        viewmats[c, 0, 3] = 0.3 * c
    K = torch.tensor([[60.0, 0, WIDTH / 2], [0, 60.0, HEIGHT / 2], [0, 0, 1]])
    return viewmats, K.repeat(n_cams, 1, 1)


def _render(
    renderer,
    params: dict[str, Tensor],
    sh_degree: int = 3,
    camera_model: CameraModel | None = None,
    viewmats: Tensor | None = None,
    Ks: Tensor | None = None,
):
    """Render two cameras, backpropagate a fixed random functional of image, alpha and depth; returns the output
    and the parameters' gradients."""
    leaves = {k: v.clone().requires_grad_() for k, v in params.items()}
    if viewmats is None:
        viewmats, Ks = _cameras()
    backgrounds = torch.tensor([[0.1, 0.2, 0.3]]).repeat(len(viewmats), 1)
    kwargs = {} if camera_model is None else {"camera_model": camera_model}
    out = renderer.render(leaves, viewmats, Ks, WIDTH, HEIGHT, sh_degree, backgrounds, **kwargs)
    g = torch.Generator().manual_seed(1)
    weights = [torch.rand(t.shape, generator=g) for t in (out.image, out.alpha, out.depth)]
    loss = sum((w * t).sum() for w, t in zip(weights, (out.image, out.alpha, out.depth)))
    out.info["means2d"].retain_grad()
    loss.backward()
    return out, {k: v.grad for k, v in leaves.items()}


def _psnr(a: Tensor, b: Tensor) -> float:
    return float(10 * torch.log10(1.0 / ((a.detach() - b.detach()) ** 2).mean()))


def _cosine(a: Tensor, b: Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0))


@pytest.mark.parametrize("antialiased", [False, True])
def test_images_and_gradients_match_the_torch_renderer(antialiased: bool):
    params = _scene()
    ref, ref_grads = _render(TorchRenderer(TorchRenderer.Config(antialiased=antialiased)), params)
    out, grads = _render(CpuRenderer(CpuRenderer.Config(antialiased=antialiased)), params)
    assert _psnr(out.image, ref.image) >= 40.0
    assert _psnr(out.alpha, ref.alpha) >= 40.0
    assert _psnr(out.depth / 8.0, ref.depth / 8.0) >= 40.0
    assert torch.equal(out.info["radii"], ref.info["radii"])
    for key in PARAMS:
        assert _cosine(grads[key], ref_grads[key]) >= 0.99, key
    assert _cosine(out.info["means2d"].grad, ref.info["means2d"].grad) >= 0.99
