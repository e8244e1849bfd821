"""The protocol of every component a run builds (model, renderer, strategy, loss terms, per-view modules, hooks): each
may refuse the run it is part of through one method, :meth:`RunChecked.check`, given the :class:`RunFacts`
(the builders turn a refusal into one line naming the component's key and the config file), and, once every
component accepted the run, prepares for it through one method, :meth:`RunChecked.setup`, given the
:class:`RunSetup`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

    from gsrecon.data.pipeline import Batch, DataPipeline


@dataclass(frozen=True)
class RunFacts:
    """What a component checks a run against, once its scene is read and its model built."""

    config: Mapping[str, Any]  # the resolved run config (what <exp_dir>/config.yaml holds)
    num_gaussians: int  # the Gaussians the model starts with
    sfm_tracks: bool  # whether the scene knows which SfM points each training photo observed
    depth_maps: bool  # whether a training photo has a depth map


@dataclass(frozen=True)
class RunSetup:
    """What a component prepares for a run from (:meth:`RunChecked.setup`)."""

    log: Callable[[str], None]  # takes lines for the run's log (a slow preparation's progress, what it went without)
    # The run's scene (points, SfM tracks, extent) and training frames; None where a renderer is set up only to draw
    # (a trained scene, a benchmark): training always gives it.
    data: DataPipeline | None = None
    # Draws a batch as the loss of a training step sees it: draw(params, batch, step) -> image [B, H, W, 3] (the
    # renderer at the step's SH degree, behind the per-view modules); None where the run does not train.
    draw: Callable[[Mapping[str, Tensor], Batch, int], Tensor] | None = None
    # Whether the run takes the compiled path (its renderer draws with gsrecon's compiled CPU kernels, renderer cpu):
    # then the terms and metrics that have a compiled form use the kernels too; False: their torch code.
    compiled: bool = False
    # The run's renderer's render(params, cameras, sh_degree, backgrounds) -> RenderOutput, for a component that draws
    # Gaussians of its own (per-view distractors); None where the run does not train. (A callable, not the Renderer:
    # this floor is below render/.)
    render: Callable[..., Any] | None = None


class RunChecked:
    """A registry class whose objects may refuse the run they are part of, and prepare for it once accepted."""

    def check(self, run: RunFacts) -> None:
        """Refuse a run this component cannot work with: raise ValueError with one line saying what to change
        (``build_run`` names the component's key and the file). The default accepts every run."""

    def setup(self, run: RunSetup) -> None:
        """Prepare, once every component of the run accepted it (:meth:`check`) and before its first step, what
        this component needs from it (kernels built, data read). The default needs nothing."""
