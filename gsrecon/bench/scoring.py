"""The metrics as each reference table computes them, from the 8-bit test renders ``gsrecon eval`` writes (as the 3DGS
paper's metrics.py reads its renders): SSIM and LPIPS as gsplat's simple_trainer.py computes them (torchmetrics), and
LPIPS with VGG as the 3DGS paper (lpips v0.1, :mod:`gsrecon.lpips_net`). gsrecon's own PSNR / SSIM / LPIPS (AlexNet)
come from the float renders, in ``gsrecon eval``'s metrics.json."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from gsrecon.bench.peers import bench_vs_gsplat
from gsrecon.data.formats.images import read_image
from gsrecon.lpips_weights import lpips_backbone_path
from gsrecon.metrics import _TORCHVISION_WEIGHTS, ImageMetrics, mean_metrics

REFERENCE_METRICS = ("ssim_torchmetrics", "lpips_alex_torchmetrics", "lpips_vgg")


def _as_batch(path: Path) -> torch.Tensor:
    """An 8-bit image file as [1, 3, H, W] floats in [0, 1]."""
    return torch.from_numpy(read_image(path)[..., :3].astype(np.float32) / 255.0).permute(2, 0, 1)[None]


def _offline_torchmetrics_lpips() -> torch.nn.Module:
    """torchmetrics' LPIPS (alex, normalize=True) built with torchvision's AlexNet made from gsrecon's LPIPS backbone
    (scripts/bench_vs_gsplat.py's offline_alexnet: the same convolutions), torchvision's loader restored after."""
    from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity
    from torchvision.models import _api

    original = _api.load_state_dict_from_url
    bench_vs_gsplat().offline_alexnet()
    try:
        return LearnedPerceptualImagePatchSimilarity(net_type="alex", normalize=True).eval()
    finally:
        _api.load_state_dict_from_url = original


def reference_scores(eval_dir: Path) -> tuple[dict[str, float | None], list[str]]:
    """The means over the test views of :data:`REFERENCE_METRICS` (``renders/test/<name>.png`` against
    ``gt/<name>.png`` in ``eval_dir``), and notes naming a column left empty and why."""
    from torchmetrics.image import StructuralSimilarityIndexMeasure
    from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity

    notes = []
    ssim = StructuralSimilarityIndexMeasure(data_range=1.0)
    alex = None
    if (Path(torch.hub.get_dir()) / "checkpoints" / _TORCHVISION_WEIGHTS["alex"]).is_file():
        alex = LearnedPerceptualImagePatchSimilarity(net_type="alex", normalize=True).eval()
    elif lpips_backbone_path("alex").is_file():
        alex = _offline_torchmetrics_lpips()
    else:
        notes.append(
            "lpips_alex_torchmetrics left out: no AlexNet weights in torch's hub cache nor gsrecon's (`gsrecon weights "
            "lpips` fetches them)"
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vgg = ImageMetrics(lpips_net="vgg")
    notes += [f"lpips_vgg left out: {w.message}" for w in caught]
    rows = []
    with torch.no_grad():
        for render_path in sorted((eval_dir / "renders" / "test").glob("*.png")):
            render, gt = _as_batch(render_path), _as_batch(eval_dir / "gt" / render_path.name)
            rows.append(
                {
                    "ssim_torchmetrics": float(ssim(render, gt)),
                    "lpips_alex_torchmetrics": None if alex is None else float(alex(render, gt)),
                    "lpips_vgg": vgg(render[0].permute(1, 2, 0), gt[0].permute(1, 2, 0))["lpips"],
                }
            )
    return mean_metrics(rows), notes
