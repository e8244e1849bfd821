"""Sky and far background: an environment behind the Gaussians, trained with the scene (``views: {sky: {name:
environment}}``).

A capture with an open sky shows colours at infinity that 3DGS can only explain with Gaussians: a cloud of them near
the cameras, painting the sky in every photo from where that photo stood (floaters across every novel view, a depth
map whose sky is a few metres away). ``environment`` learns a cube map (:mod:`gsrecon.render.environment`: six faces
of ``resolution`` x ``resolution`` texels, colours through a sigmoid) looked up along each pixel's ray, through the
camera's lens, and draws it where the Gaussians' accumulated opacity leaves room: ``image + (1 - alpha) env(d)``,
in place of ``data.background``. The gradient reaching ``alpha`` there pulls Gaussians in front of the sky toward
transparency (the sky is no reason to grow them), and the environment's own gradient fits the sky. One cube map
serves every view (its parameters are not per view: every texel steps each step), every renderer (torch, cpu and
gsplat all return ``alpha``) and test views alike.

Two options for real photos: ``horizon`` draws it only above the training cameras' mean horizon (the ground, seen
in one direction with one colour from every photo, is otherwise drawn through the Gaussians), and ``sky_prior``
adds the Gaussians' opacity where the environment already draws the photo (a Gaussian of the sky's colour explains
the sky as well as the environment does: nothing else makes it give way).

The module draws its :class:`~gsrecon.render.environment.Sky` (:meth:`Environment.sky`), the one drawing that
training, eval, render, the viewer, lod and the merge share; :func:`stored_sky` reads a trained one from a checkpoint
without the run's data or a renderer. The environment is found by its class, a plugin's subclass too
(:func:`sky_key` in a config, :func:`environment_module` among built modules). PLY and the other per-Gaussian
formats hold the Gaussians without it (the export says so);
:func:`~gsrecon.render.environment.far_sphere_gaussians` turns it into Gaussians on a far sphere for a format that
can carry them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from gsrecon.cameras.paths import mean_up
from gsrecon.cameras.rays import camera_rays
from gsrecon.component import RunFacts, RunSetup
from gsrecon.data.prefetch import host_memory_room
from gsrecon.model.views.base import ViewModule, ViewModules, build_views, view_entries
from gsrecon.registry import VIEW_REGISTRY
from gsrecon.render.environment import Sky, composite

if TYPE_CHECKING:
    from gsrecon.cameras import Cameras
    from gsrecon.data.pipeline import Batch
    from gsrecon.render.base import RenderOutput

_BYTES_PER_TEXEL = 6 * 3 * 4 * 4  # six faces x RGB x float32 x (value, gradient, two Adam moments)


@VIEW_REGISTRY.register("environment")
class Environment(ViewModule):
    """A cube map of colours by viewing direction, drawn behind the Gaussians (see the module docstring)."""

    kind = ""  # a views: entry (views: {sky: {name: environment}})
    export_note = "the environment (the sky behind the Gaussians) is not in it: the format holds only Gaussians"

    @dataclass
    class Config(ViewModule.Config):
        lr: float = 0.02  # Adam learning rate of the texels (pre-sigmoid)
        resolution: int = 16  # texels along each face's side (6 R^2 texels; 16: about 6 degrees each)
        init: float = 0.5  # every texel's colour at the start, in (0, 1)
        # Weight of the mean binary entropy of the Gaussians' accumulated opacity in training renders: pushes each
        # pixel to be drawn by the Gaussians or by the environment, not half by each. 0: off
        opacity_reg: float = 0.0
        # Weight of the mean, over training pixels, of the Gaussians' accumulated opacity where the environment
        # already draws the photo (weighted by exp(-(colour difference / sky_match)^2), a colour difference of 0
        # to 1 per channel, RMS): breaks the tie between a Gaussian of the sky's colour and the sky itself. 0: off
        sky_prior: float = 0.0
        sky_match: float = 0.1
        # Draw the environment only above the horizon (the training cameras' mean up): a sky, not the ground, which
        # a capture's photos also see in one direction with one colour, so that the cube map would draw it through
        # the Gaussians there. Below it, data.background
        horizon: bool = False

        def __post_init__(self) -> None:
            super().__post_init__()
            if isinstance(self.resolution, bool) or not isinstance(self.resolution, int) or self.resolution < 1:
                raise ValueError(f"resolution must be an integer >= 1 (texels per face side), got {self.resolution!r}")
            free, bound = host_memory_room()
            need = _BYTES_PER_TEXEL * self.resolution**2
            if need > free:
                raise ValueError(
                    f"resolution={self.resolution} needs {need / 2**30:.3g} GiB for the cube map and its optimiser, "
                    f"more than the {free / 2**30:.3g} GiB free ({bound}); a sky needs 16-64"
                )
            if not (math.isfinite(self.init) and 0.0 < self.init < 1.0):
                raise ValueError(f"init must be a colour in (0, 1), got {self.init!r}")
            for name in ("opacity_reg", "sky_prior"):
                if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0.0):
                    raise ValueError(f"{name} must be a finite number >= 0, got {getattr(self, name)!r}")
            if not (math.isfinite(self.sky_match) and self.sky_match > 0.0):
                raise ValueError(f"sky_match must be a finite number > 0, got {self.sky_match!r}")

    def __init__(self, cfg: Config, train_names: list[str]) -> None:
        super().__init__(cfg, train_names)
        logit = math.log(cfg.init / (1.0 - cfg.init))
        res = cfg.resolution
        self.texels = torch.nn.Parameter(torch.full((6, res, res, 3), logit))  # [6, R, R, 3] pre-sigmoid
        if cfg.horizon:  # [3] world-space up, the training cameras' mean (setup); zero: not yet known
            self.register_buffer("up", torch.zeros(3))

    def check(self, run: RunFacts) -> None:
        if run.config["data"]["background"] == "random":
            raise ValueError(
                "the environment is drawn where the Gaussians leave room, which data.background=random (a new "
                "background each step, to learn transparency) would fight; use data.background=black or white"
            )

    def setup(self, run: RunSetup) -> None:
        if self.cfg.horizon and run.data is not None:
            viewmats = run.data.scene.train_cameras.viewmats  # [F, 4, 4]
            self.up.copy_(mean_up(viewmats.double()).to(self.up))

    def colors(self) -> Tensor:
        """[6, R, R, 3] the cube map's colours in [0, 1]."""
        return torch.sigmoid(self.texels)

    def sky(self) -> Sky:
        """What the module draws (differentiable in its texels): its colours, above its horizon where it has one."""
        return Sky(self.colors(), self.up if self.cfg.horizon else None)

    def trained_rows(self, names: list[str], device: torch.device) -> Tensor | None:
        return None  # one cube map for every view

    def composite(self, out: RenderOutput, cameras: Cameras, backgrounds: Tensor) -> RenderOutput:
        environment = self.sky().draw(camera_rays(cameras), backgrounds[:, None, None, :])  # [C, H, W, 3]
        return composite(out, environment, backgrounds)

    def render_term(self, out: RenderOutput) -> Tensor | None:
        if self.cfg.opacity_reg == 0.0:
            return None
        alpha = out.alpha.clamp(1e-6, 1.0 - 1e-6)  # [C, H, W, 1]
        return self.cfg.opacity_reg * -(alpha * alpha.log() + (1.0 - alpha) * (1.0 - alpha).log()).mean()

    def regularization(self, out: RenderOutput, batch: Batch) -> Tensor | None:
        if self.cfg.sky_prior == 0.0:
            return None
        with torch.no_grad():
            rays, sky = camera_rays(batch.cameras), self.sky()  # [C, H, W, 3]
            environment = sky.draw(rays, batch.backgrounds[:, None, None, :])  # [C, H, W, 3]
            above = sky.above(rays)  # [C, H, W, 1] or None: drawn everywhere
        difference = (environment - batch.images[..., :3]).square().mean(dim=-1, keepdim=True)  # [C, H, W, 1]
        match = torch.exp(-difference / self.cfg.sky_match**2)
        return self.cfg.sky_prior * (out.alpha * (match if above is None else match * above)).mean()


def sky_key(resolved: Mapping[str, Any]) -> str | None:
    """The key of the environment among the per-view modules a resolved run config turns on: the entry whose
    registered class is :class:`Environment` or a subclass (a plugin's); None where the run has none."""
    entries = view_entries(dict(resolved)).items()
    return next((key for key, entry in entries if issubclass(VIEW_REGISTRY.get(entry["name"]), Environment)), None)


def environment_module(views: ViewModules | None) -> tuple[str, Environment] | None:
    """The key and the module of the environment (:class:`Environment` or a subclass) among a run's per-view
    modules ``views``; None where the run has none."""
    for key, module in views.modules.items() if views else ():
        if isinstance(module, Environment):
            return key, module
    return None


def stored_sky(resolved: Mapping[str, Any], state: Mapping[str, Any], source: str = "config") -> Sky | None:
    """The sky (detached) of a run of the resolved config ``resolved`` (:func:`sky_key`) as its checkpoint's
    per-view modules' ``state`` holds it (:meth:`~gsrecon.model.views.base.ViewModules.state_dict`; a run with none
    there, a PLY's, gets the untrained cube map), built without the run's data or a renderer; None where the run has
    no sky. Raises ConfigError for a bad entry, InputError for a stored cube map of another shape."""
    key = sky_key(resolved)
    if key is None:
        return None
    views = build_views({"views": {key: resolved["views"][key]}}, [], torch.device("cpu"), source)
    views.load_state_dict({key: state[key]} if key in state else {})
    return views.modules[key].sky().detach()


def trained_sky(views: ViewModules | None, background: Tensor | None = None) -> Tensor | None:
    """[6, R, R, 3] the cube-map colours (in [0, 1], detached) of the environment among a run's per-view modules
    ``views`` (:func:`environment_module`); None where the run has none. With a ``background`` [3], as the run draws
    them: baked with its horizon (:meth:`~gsrecon.render.environment.Sky.baked`)."""
    found = environment_module(views)
    if found is None:
        return None
    sky = found[1].sky().detach()
    return sky.colors if background is None else sky.baked(background)


def merge_skies(colors: list[Tensor], coverages: list[Tensor]) -> Tensor:
    """[6, R, R, 3] one cube map from several runs' ``colors`` ([6, R, R, 3] each, in [0, 1]): each texel the mean
    of theirs weighted by how much each run's training views read it (``coverages`` [6, R, R] each,
    :func:`~gsrecon.render.environment.texel_coverage`); a texel no run read, their plain mean."""
    stacked = torch.stack(colors)  # [B, 6, R, R, 3]
    weights = torch.stack(coverages)[..., None]  # [B, 6, R, R, 1]
    total = weights.sum(dim=0)  # [6, R, R, 1]
    weighted = (stacked * weights).sum(dim=0) / total.clamp_min(1e-12)
    return torch.where(total > 0.0, weighted, stacked.mean(dim=0))


def set_sky(module: Environment, colors: Tensor) -> None:
    """Make the cube map of ``module`` hold ``colors`` [6, R, R, 3] (in [0, 1])."""
    with torch.no_grad():
        module.texels.copy_(torch.logit(colors.clamp(1e-6, 1.0 - 1e-6)))
