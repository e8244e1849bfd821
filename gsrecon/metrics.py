"""Image quality metrics for evaluation: PSNR, SSIM and LPIPS.

The protocol is gsplat's: SSIM with an 11x11 Gaussian window (sigma 1.5), LPIPS v0.1 with the
AlexNet backbone by default. The reference 3DGS code reports LPIPS with VGG: set
``metrics.lpips_net: vgg`` to compare with its numbers.
"""

from __future__ import annotations

import importlib.metadata
import math
import pickle
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from gsrecon.component import RunSetup
from gsrecon.errors import InputError
from gsrecon.losses.compiled import run_kernels
from gsrecon.losses.ssim import ssim
from gsrecon.lpips_net import LPIPS, lpips_linear_weights_path
from gsrecon.lpips_weights import LPIPS_NETS, lpips_backbone_path

_TORCHVISION_WEIGHTS = {  # torchvision's ImageNet weights files (its AlexNet/VGG16 IMAGENET1K_V1) in its hub cache
    "alex": "alexnet-owt-7be5be79.pth",
    "vgg": "vgg16-397923af.pth",
}
_warned_no_lpips = False
LPIPS_MIN_SIDE = {"alex": 31, "vgg": 16}  # the smallest image side each backbone's pooling layers accept (pixels)


MAX_PSNR = 100.0  # dB: the PSNR of images closer than an MSE of 1e-10 (identical images have no finite PSNR)


def psnr(pred: Tensor, gt: Tensor, mask: Tensor | None = None) -> float:
    """Peak signal-to-noise ratio in dB of ``pred`` against ``gt`` (same shape ``[..., C]``, data range 1), over
    the pixels ``mask`` (``[..., 1]``, 1 kept, 0 ignored; None: all) keeps.

    Identical images give :data:`MAX_PSNR`; NaN pixels give NaN.

    Raises:
        ValueError: ``mask`` keeps no pixel.
    """
    squared = (pred.double() - gt.double()) ** 2
    if mask is None:
        mse = torch.mean(squared).item()
    else:
        kept = mask.sum().item()
        if kept == 0:
            raise ValueError("the mask keeps no pixel to score")
        mse = ((squared * mask).sum() / (kept * pred.shape[-1])).item()
    if math.isnan(mse):
        return math.nan
    return MAX_PSNR if mse <= 10.0 ** (-MAX_PSNR / 10.0) else -10.0 * math.log10(mse)


def fit_colours(render: Tensor, photo: Tensor, fit_mask: Tensor | None = None) -> Tensor:
    """``render`` [H, W, 3] through the gain and bias per channel that bring it nearest ``photo`` [H, W, 3] (least
    squares) over the pixels ``fit_mask`` ([H, W, 1], 1 kept; None: all) keeps, clamped to [0, 1]."""
    x, y = render.reshape(-1, 3).double(), photo.reshape(-1, 3).double()  # [P, 3]
    w = torch.ones_like(x[:, :1]) if fit_mask is None else fit_mask.reshape(-1, 1).double()  # [P, 1]
    count = w.sum().clamp_min(1e-12)
    x_mean, y_mean = (x * w).sum(0) / count, (y * w).sum(0) / count  # [3]
    gain = (w * (x - x_mean) * (y - y_mean)).sum(0) / (w * (x - x_mean).square()).sum(0).clamp_min(1e-12)  # [3]
    return ((x - x_mean) * gain + y_mean).clamp(0.0, 1.0).to(render.dtype).reshape(render.shape)


def colour_fit_psnr(render: Tensor, photo: Tensor, mask: Tensor | None = None) -> float | None:
    """PSNR of the right half of ``render`` [H, W, 3] against ``photo`` after a gain and a bias per channel fitted on
    the left half (:func:`fit_colours`), over the pixels ``mask`` ([H, W, 1]; None: all) keeps; None where either
    half keeps no pixel or the value is not finite."""
    half = render.shape[1] // 2
    left = torch.zeros_like(render[..., :1])  # [H, W, 1]
    left[:, :half] = 1.0
    keep = torch.ones_like(left) if mask is None else mask.to(left)
    fitted = fit_colours(render, photo, left * keep)
    right = keep[:, half:]  # [H, W - half, 1]
    if (left * keep).sum() == 0 or right.sum() == 0:
        return None
    value = psnr(fitted[:, half:], photo[:, half:], right)
    return value if math.isfinite(value) else None


METRIC_NAMES = ("psnr", "ssim", "lpips")  # what ImageMetrics reports per view, in this order
LOWER_IS_BETTER = ("lpips",)  # the metrics of METRIC_NAMES for which a smaller value is better


def depth_errors(rendered: Tensor, target: Tensor, mask: Tensor | None = None) -> dict[str, float]:
    """Errors of the ``rendered`` depth [H, W, 1] against a depth map ``target`` [H, W, 1] (0: no depth) over the
    pixels where it has a depth and ``mask`` ([H, W, 1], 1 kept; None: all) keeps, a pixel rendered empty counting
    as depth 0: ``depth_abs_rel`` (mean |rendered - target| / target) and ``depth_rmse`` (in the target's units).
    Empty where no pixel is left."""
    valid = target > 0
    if mask is not None:
        valid = valid & (mask > 0)
    if not valid.any():
        return {}
    rendered, target = rendered[valid].double(), target[valid].double()
    error = rendered - target
    return {
        "depth_abs_rel": (error.abs() / target).mean().item(),
        "depth_rmse": error.square().mean().sqrt().item(),
    }


@dataclass
class MetricsConfig:
    lpips_net: str = "alex"  # alex | vgg | none
    # Also score each test view after a gain and a bias per colour channel fitted to its photo on the left half, on
    # the right half (``psnr_colour_fit``): the in-the-wild protocol, for any run, with or without per-view modules.
    colour_fit: bool = False


class ImageMetrics:
    """PSNR, SSIM and LPIPS of a rendered image against its ground truth.

    SSIM is the training loss's (Gaussian window 11, sigma 1.5, data range 1). LPIPS is ``lpips`` v0.1 with
    the ``lpips_net`` backbone (its numbers, from the layers it uses only: :mod:`gsrecon.lpips_net`); its ImageNet
    backbone comes from the gsrecon cache (see
    ``gsrecon weights lpips``) or else from torchvision's own download cache. With neither, LPIPS is
    reported as None and a warning (once per process) says how to get the weights.
    ``lpips_net="none"`` turns LPIPS off (reported as None, no warning); so is LPIPS of an image whose
    height or width is below :data:`LPIPS_MIN_SIDE` for its backbone (the network cannot take it). SSIM takes the
    compiled kernels where the run does (:meth:`setup`).
    """

    def __init__(self, lpips_net: str = "alex", device: str | torch.device = "cpu", colour_fit: bool = False) -> None:
        if lpips_net not in (*LPIPS_NETS, "none"):
            raise InputError(f"LPIPS network must be one of {(*LPIPS_NETS, 'none')}, got {lpips_net!r}")
        self.device = torch.device(device)
        self._lpips_net = lpips_net
        self.colour_fit = colour_fit  # whether colour_fitted adds psnr_colour_fit
        self._lpips, self._lpips_weights = (None, None) if lpips_net == "none" else _build_lpips(lpips_net)
        if self._lpips is not None:
            self._lpips.to(self.device)
        self._kernels: ModuleType | None = None  # the run's compiled kernels (setup); None: SSIM's torch code

    def setup(self, run: RunSetup) -> None:
        """Take SSIM's compiled path where ``run`` does (:attr:`~gsrecon.component.RunSetup.compiled`)."""
        self._kernels = run_kernels(run)

    @property
    def lpips_info(self) -> dict[str, str | None]:
        """Where the LPIPS numbers come from: network, ``lpips`` version, backbone weights file (None if absent)."""
        return {
            "net": self._lpips_net,
            "lpips_version": importlib.metadata.version("lpips"),
            "weights": self._lpips_weights,
        }

    @torch.no_grad()
    def __call__(self, pred: Tensor, gt: Tensor, mask: Tensor | None = None) -> dict[str, float | None]:
        """Metrics of ``pred`` against ``gt``, both float ``[H, W, 3]`` images in [0, 1] (values are clamped).

        With ``mask`` (``[H, W, 1]``, 1 where a pixel counts, 0 where it is ignored), PSNR and SSIM are means over
        the kept pixels and LPIPS compares the images with their ignored pixels blacked out in both.
        Returns ``{"psnr": dB, "ssim": ..., "lpips": ...}``, each None where it has no finite value (a render
        with NaN pixels; LPIPS off or not possible), so that no metric is ever NaN or infinite.
        """
        if pred.shape != gt.shape or pred.ndim != 3 or pred.shape[-1] != 3:
            raise ValueError(
                f"expected two [H, W, 3] images of the same shape, got {tuple(pred.shape)} and {tuple(gt.shape)}"
            )
        pred = pred.to(self.device, torch.float32).clamp(0, 1)[None]  # [1, H, W, 3]
        gt = gt.to(self.device, torch.float32).clamp(0, 1)[None]  # [1, H, W, 3]
        if mask is not None:
            mask = mask.to(self.device, torch.float32)[None]  # [1, H, W, 1]
        lpips_value = None
        if self._lpips is not None and min(pred.shape[1:3]) >= LPIPS_MIN_SIDE[self._lpips_net]:
            seen_pred, seen_gt = (pred, gt) if mask is None else (pred * mask, gt * mask)
            lpips_value = self._lpips(seen_pred.permute(0, 3, 1, 2) * 2 - 1, seen_gt.permute(0, 3, 1, 2) * 2 - 1).item()
        values = {
            "psnr": psnr(pred, gt, mask),
            "ssim": float(ssim(pred, gt, mask, self._kernels)),
            "lpips": lpips_value,
        }
        return {name: value if value is None or math.isfinite(value) else None for name, value in values.items()}

    @torch.no_grad()
    def colour_fitted(self, render: Tensor, gt: Tensor, mask: Tensor | None = None) -> dict[str, float | None]:
        """``{"psnr_colour_fit": dB}`` of the whole ``render`` [H, W, 3] as rendered against ``gt``
        (:func:`colour_fit_psnr`, ``mask`` [H, W, 1] or None); empty where ``colour_fit`` is off."""
        if not self.colour_fit:
            return {}
        return {"psnr_colour_fit": colour_fit_psnr(render.float().clamp(0, 1), gt.float(), mask)}


def mean_metrics(results: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per-metric means over per-view ``results`` (keys other than ``name``), each over the views that report it
    (depth errors: the views with a depth map); None if any of them gives None."""
    keys = dict.fromkeys(k for result in results for k in result if k != "name")
    means: dict[str, float | None] = {}
    for key in keys:
        values = [r[key] for r in results if key in r]
        means[key] = None if any(v is None for v in values) else float(sum(values) / len(values))
    return means


def describe_metrics(metrics: Mapping[str, float | None]) -> str:
    """``psnr 25.1234, ssim 0.8123`` of the metrics that have a value ("" for none)."""
    return ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if v is not None)


def _build_lpips(net: str) -> tuple[torch.nn.Module | None, str | None]:
    """:class:`~gsrecon.lpips_net.LPIPS` with ImageNet backbone weights found on disk, and their file; (None, None)
    if there are none."""
    global _warned_no_lpips
    path = lpips_backbone_path(net)
    if not path.is_file():
        path = Path(torch.hub.get_dir()) / "checkpoints" / _TORCHVISION_WEIGHTS[net]
    if not path.is_file():
        if not _warned_no_lpips:
            _warned_no_lpips = True
            warnings.warn(
                f"LPIPS is disabled: no ImageNet weights for its '{net}' backbone. "
                "Run `gsrecon weights lpips` once to fetch them.",
                stacklevel=3,
            )
        return None, None
    linear = torch.load(lpips_linear_weights_path(net), map_location="cpu", weights_only=True)
    try:
        model = LPIPS(net, torch.load(path, map_location="cpu", weights_only=True), linear)
    except (RuntimeError, KeyError, ValueError, EOFError, pickle.UnpicklingError) as e:
        raise InputError(
            f"{path}: not usable as LPIPS '{net}' backbone weights ({type(e).__name__}); "
            "delete it or run `gsrecon weights lpips --force`"
        ) from e
    return model.eval(), str(path)
