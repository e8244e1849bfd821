"""Registers the built-in renderers under their YAML names (``renderer.name``)."""

from gsrecon.registry import RENDERER_REGISTRY
from gsrecon.render.gsplat_renderer import GsplatRenderer
from gsrecon.render.torch_renderer import TorchRenderer

RENDERER_REGISTRY.register("torch")(TorchRenderer)
RENDERER_REGISTRY.register("gsplat")(GsplatRenderer)
