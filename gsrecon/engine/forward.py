"""A training step's forward pass: the render of its batch, what the per-view modules draw and adjust, and the loss
terms of that render; where the ``cpu`` renderer computes the run's whole loss itself (its L1 and SSIM terms, no
per-view module), its two compiled calls instead (`gsrecon.render.cpu.step`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from gsrecon.data.pipeline import Batch, DataPipeline
from gsrecon.losses.base import Loss, LossInputs
from gsrecon.losses.l1 import L1Term
from gsrecon.losses.ssim import C1, C2, SSIMTerm, gaussian_window
from gsrecon.model.views.base import ViewModules
from gsrecon.render.base import Renderer, RenderOutput
from gsrecon.render.cpu.renderer import CpuRenderer
from gsrecon.render.cpu.step import FusedStep, StepTerms


@dataclass
class Forward:
    """What a training step's forward gives its backward and its hooks."""

    out: RenderOutput  # the render after the per-view modules' composite (its info: what the strategy reads)
    losses: dict[str, Tensor]  # {key: weighted term}: the loss's terms, then the per-view modules'


class TrainingForward:
    """The forward of a training step (:meth:`__call__`), for one run's renderer, per-view modules and loss."""

    def __init__(self, renderer: Renderer, views: ViewModules, loss: Loss, data: DataPipeline) -> None:
        self.renderer, self.views, self.loss, self.data = renderer, views, loss, data
        self.fused = fused_step(renderer, views, loss)

    def __call__(self, params: Mapping[str, Tensor], batch: Batch, sh_degree: int) -> Forward:
        """The render of ``batch`` (cameras already adjusted by the per-view modules) at ``sh_degree`` and its loss
        terms, differentiable in ``params`` and the modules' parameters."""
        if self.fused is not None and self.fused.applies(params, batch):
            return Forward(*self.fused(params, batch, sh_degree))
        out, drawn = self.views.draw(self.renderer.render_batch(params, batch, sh_degree), batch)
        image = self.views.adjust_image(out.image, batch, out)  # [B, H, W, 3]
        losses = self.loss(LossInputs(image, out, batch, self.data, params, self.renderer))
        losses.update(self.views.regularization(out, batch, drawn))
        return Forward(out, losses)


def fused_step(renderer: Renderer, views: ViewModules, loss: Loss) -> FusedStep | None:
    """The ``cpu`` renderer's fused step where it computes the run's whole loss: the renderer's ``fused_step`` on, no
    median depth, no per-view module, and terms that are gsrecon's L1 and SSIM (one of each at most) on the
    compiled kernels; None otherwise."""
    if not isinstance(renderer, CpuRenderer) or not renderer.cfg.fused_step or renderer.cfg.median_depth or views:
        return None
    found: dict[type, tuple[str, float]] = {}
    for key, term in loss.terms.items():
        kind = type(term)
        if kind not in (L1Term, SSIMTerm) or kind in found or term.kernels is None:
            return None
        found[kind] = (key, term.cfg.weight)
    if not found:
        return None
    order = list(found)
    terms = StepTerms(
        l1=found.get(L1Term), ssim=found.get(SSIMTerm), window=gaussian_window(torch.float32, torch.device("cpu")),
        c1=C1, c2=C2, l1_first=order[0] is L1Term,
    )  # fmt: skip
    return FusedStep(renderer, terms)
