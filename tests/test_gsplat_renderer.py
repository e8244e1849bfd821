"""The gsplat wrapper where no GPU is: its call fits the installed gsplat, its outputs are unpacked right.

The kernels themselves run in tests/test_gpu.py (``-m gpu``) on a CUDA machine.
"""

from __future__ import annotations

import inspect

import gsplat
import pytest
import torch

from gsrecon.cameras import Cameras
from gsrecon.component import RunSetup
from gsrecon.model.gaussians import init_params
from gsrecon.render.gsplat_renderer import GsplatRenderer, GsplatUnavailableError


def test_the_call_binds_to_gsplat_rasterization_and_outputs_are_unpacked() -> None:
    n, c, w, h = 50, 2, 16, 12
    params = init_params(torch.randn(n, 3), torch.rand(n, 3), sh_degree=2, opacity=0.5, scale_mult=1.0)
    signature = inspect.signature(gsplat.rasterization)
    calls = []

    def rasterization(**kwargs):
        signature.bind(**kwargs)  # raises TypeError on a name gsplat does not take
        calls.append(kwargs)
        colors = torch.arange(4.0).expand(c, h, w, 4)  # RGB+ED: r, g, b, expected depth
        return colors, torch.full((c, h, w, 1), 0.5), {"radii": torch.zeros(c, n, 2, dtype=torch.int32)}

    cfg = GsplatRenderer.Config(packed=True, sparse_grad=True, antialiased=True, absgrad=True, radius_clip=0.5)
    renderer = GsplatRenderer(cfg)
    renderer._rasterization = rasterization
    viewmats, Ks = torch.eye(4).expand(c, 4, 4), torch.eye(3).expand(c, 3, 3)
    out = renderer.render(params, Cameras(viewmats, Ks, w, h), 1, torch.zeros(c, 3))

    (kwargs,) = calls
    assert kwargs["colors"].shape == (n, 9, 3) and kwargs["sh_degree"] == 1
    assert torch.equal(kwargs["scales"], params["scales"].exp())
    assert torch.equal(kwargs["opacities"], params["opacities"].sigmoid())
    assert kwargs["render_mode"] == "RGB+ED" and kwargs["rasterize_mode"] == "antialiased"
    assert kwargs["packed"] and kwargs["sparse_grad"] and kwargs["absgrad"] and kwargs["radius_clip"] == 0.5
    assert torch.equal(out.image[0, 0, 0], torch.tensor([0.0, 1.0, 2.0])) and out.depth.shape == (c, h, w, 1)
    assert torch.all(out.depth == 3.0) and out.alpha.shape == (c, h, w, 1)
    assert renderer.sparse_grad


def test_config_errors_and_setup_without_cuda() -> None:
    with pytest.raises(ValueError, match="sparse_grad needs renderer.packed"):
        GsplatRenderer.Config(sparse_grad=True)
    with pytest.raises(ValueError, match="radius_clip=-1"):
        GsplatRenderer.Config(radius_clip=-1.0)
    with pytest.raises(ValueError, match="near_plane=0.0"):
        GsplatRenderer.Config(near_plane=0.0)
    if not torch.cuda.is_available():
        with pytest.raises(GsplatUnavailableError, match="renderer.name=torch"):
            GsplatRenderer(GsplatRenderer.Config()).setup(RunSetup(print))
