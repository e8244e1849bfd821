"""An example renderer: gsrecon's torch renderer that also reports how many Gaussians each view drew.

Used by custom_renderer.yaml (``imports: [tile_count_renderer.py]``); copy it as a starting point. A renderer
subclasses :class:`gsrecon.render.base.Renderer` (here the torch one) and implements ``_render``, which gets the
inputs :meth:`Renderer.render` has checked: the parameters, the :class:`~gsrecon.cameras.Cameras` (poses,
intrinsics, size and camera model), the SH degree and the backgrounds. Kernels to build or load belong in
``setup(run)``, called before the first render (``run.log`` takes progress lines).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import Tensor

from gsrecon.cameras import Cameras
from gsrecon.registry import RENDERER_REGISTRY
from gsrecon.render.base import RenderOutput
from gsrecon.render.torch_renderer import TorchRenderer


@RENDERER_REGISTRY.register("torch_counting")
class CountingTorchRenderer(TorchRenderer):
    """The torch renderer; ``info["num_drawn"]`` [C] counts the Gaussians each camera drew (radius > 0), and
    ``drawn_total`` sums them over every render so far."""

    @dataclass
    class Config(TorchRenderer.Config):
        pass

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self.drawn_total = 0

    def _render(
        self, params: Mapping[str, Tensor], cameras: Cameras, sh_degree: int, backgrounds: Tensor
    ) -> RenderOutput:
        out = super()._render(params, cameras, sh_degree, backgrounds)
        drawn = (out.info["radii"] > 0).all(-1).sum(-1)  # [C]
        out.info["num_drawn"] = drawn
        self.drawn_total += int(drawn.sum())
        return out
