"""Scoring rendered views against their ground truth: one loop for validation and ``gsrecon eval``."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

from gsrecon.component import RunSetup
from gsrecon.data.pipeline import Batch
from gsrecon.logging.console import Logger
from gsrecon.metrics import ImageMetrics, MetricsConfig, depth_errors
from gsrecon.render.base import RenderOutput


def build_metrics(cfg: MetricsConfig, device: torch.device, logger: Logger, compiled: bool) -> ImageMetrics:
    """PSNR/SSIM/LPIPS (and the colour-fitted PSNR where ``cfg.colour_fit``), built without touching the global RNG,
    set up for a run that takes the ``compiled`` path or not (:attr:`~gsrecon.component.RunSetup.compiled`); their
    warnings (e.g. missing LPIPS weights) go to ``logger`` once."""
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = ImageMetrics(lpips_net=cfg.lpips_net, device=device, colour_fit=cfg.colour_fit)
    for warning in caught:
        logger.warning(str(warning.message))
    metrics.setup(RunSetup(logger.info, compiled=compiled))
    return metrics


@torch.no_grad()
def evaluate_views(
    render: Callable[[Batch], RenderOutput],
    batches: Iterable[Batch],
    metrics: ImageMetrics,
    before_view: Callable[[int], None] | None = None,
    after_view: Callable[[int, dict[str, Any]], None] | None = None,
    adjust: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None,
    fit_cameras: Callable[[Batch, Callable[[Batch], RenderOutput]], Batch] | None = None,
) -> list[dict[str, Any]]:
    """Render and score each single-view batch; returns ``[{"name", "psnr", "ssim", "lpips"}]`` per view, plus
    ``depth_abs_rel`` and ``depth_rmse`` (:func:`~gsrecon.metrics.depth_errors`) for a view with a depth map, and
    ``psnr_colour_fit`` of the render as rendered (before ``adjust``) where ``metrics.colour_fit`` is on.

    ``before_view(index)`` runs before a view is rendered, ``after_view(index, outputs)`` after it is
    scored, with ``outputs``: ``name``, ``render`` / ``gt`` [H, W, 3] in [0, 1], ``depth`` / ``alpha``
    [H, W, 1] and ``metrics``. A view's mask (``batch.masks``) leaves its ignored pixels out of the metrics.
    ``adjust(render, gt)``, when given, returns the pair that is scored and passed
    on instead (e.g. a test view's appearance fitted on one half, the other half scored); a mask keeps the
    columns of the pair it returns, the right-most ones. ``fit_cameras(batch, render)``, when given, returns the
    batch whose cameras the view is rendered from (e.g. a test view's pose fitted to its photo).
    """
    results = []
    for index, batch in enumerate(batches):
        if before_view is not None:
            before_view(index)
        if fit_cameras is not None:
            batch = fit_cameras(batch, render)
        out = render(batch)
        image, gt = out.image[0].clamp(0.0, 1.0), batch.images[0]  # [H, W, 3]
        fitted = metrics.colour_fitted(image, gt, None if batch.masks is None else batch.masks[0])
        if adjust is not None:
            image, gt = adjust(image, gt)
        mask = None if batch.masks is None else batch.masks[0, :, batch.cameras.width - image.shape[1] :]  # [H, W', 1]
        scores = metrics(image, gt, mask) | fitted
        if batch.depths is not None:
            full_mask = None if batch.masks is None else batch.masks[0]
            scores |= depth_errors(out.depth[0], batch.depths[0], full_mask)
        if after_view is not None:
            outputs = {
                "name": batch.names[0],
                "render": image,
                "gt": gt,
                "depth": out.depth[0],
                "alpha": out.alpha[0],
                "metrics": scores,
            }
            after_view(index, outputs)
        results.append({"name": batch.names[0], **scores})
    return results
