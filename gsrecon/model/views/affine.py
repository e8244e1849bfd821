"""Per-image appearance: a learned colour transform per training image, applied to the render before the loss.

Photos of one capture differ in exposure and white balance; without a per-image correction the
Gaussians absorb those differences as floaters and colour blotches. ``affine`` gives each training
image a gain and a bias per colour channel (``matrix: diagonal``, the default: exposure and white balance,
nothing that mixes channels) or a 3x3 colour matrix and a bias (``matrix: full``; as the Inria code's
exposure compensation and gsplat's ``--app_opt`` do in spirit), initialised to the identity, trained by its
own Adam and pulled toward the identity by a small penalty. Test views have no transform of their own: they
are scored with the identity (``eval: identity``), or with a transform fitted on the left half of the view and scored on
the right half (``eval: fit_left``, as NeRF-W and gsplat evaluate appearance codes).

Only photos whose colours the capture itself shows to differ are corrected. At the first step each training photo's
colours at its SfM keypoints are compared with the other photos' at the same points
(:func:`~gsrecon.model.views.colour_check.colour_differences`); a photo within ``trust`` of them keeps its colours
as shot (no correction learns for it), the others start from the gains measured there. A capture whose photos all
agree trains exactly as without the module: where nothing changes between photos, per-photo corrections only
learnt what the Gaussians should hold (BENCHMARKS.md, issue 38).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from gsrecon.component import RunSetup
from gsrecon.data.scene import Frame, SfmPoints
from gsrecon.errors import InputError
from gsrecon.model.views.base import EvalAdjust, ViewModule
from gsrecon.model.views.colour_check import colour_differences
from gsrecon.optim import Adam
from gsrecon.registry import VIEW_REGISTRY

if TYPE_CHECKING:
    from gsrecon.data.pipeline import Batch
    from gsrecon.render.base import RenderOutput

APPEARANCE_EVALS = ("identity", "fit_left")
AFFINE_MATRICES = ("full", "diagonal")
APPEARANCE_WITHOUT_KEYPOINTS = ("correct", "keep")


def identity_affine(count: int, device: torch.device | str = "cpu") -> Tensor:
    """``count`` identity colour transforms [count, 3, 4] (3x3 matrix, then the bias column)."""
    return torch.eye(3, 4, device=device).repeat(count, 1, 1)


def apply_affine(images: Tensor, affine: Tensor) -> Tensor:
    """``images`` [B, H, W, 3] through per-image transforms ``affine`` [B, 3, 4]: ``M @ rgb + b``."""
    return torch.einsum("bij,bhwj->bhwi", affine[:, :, :3], images) + affine[:, None, None, :, 3]


@dataclass
class AppearanceConfig(ViewModule.Config):
    """Options every appearance module has: its regularisation weight and its test-view policy."""

    reg: float = 1e-2  # weight of the module's regularisation
    neighbours: int = 0  # 0: the corrections average to the identity over all training views; k: over each view
    # and k on each side in name order (a capture's path: what changes smoothly along it is left to the Gaussians)
    eval: str = "identity"  # test views: identity | fit_left (fit on the left half, score the right half)
    eval_steps: int = 100  # fit_left: Adam steps fitting a test view's transform
    eval_lr: float = 1e-2  # fit_left: their learning rate
    matrix: str = "diagonal"  # diagonal: a gain per channel | full: a 3x3 colour matrix; a bias per channel both
    # A training photo whose colours at its SfM keypoints differ from the other photos' there by at most this (the
    # median log ratio, about a fraction, in every channel) keeps its colours as shot: no correction learns for it,
    # and where any photo keeps them they fix the scene's colours. 0 corrects every photo.
    trust: float = 0.05
    # Photos without keypoints to measure their colours at: correct (as every photo without the check) | keep
    without_keypoints: str = "correct"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.eval not in APPEARANCE_EVALS:
            raise ValueError(f"eval must be one of {', '.join(APPEARANCE_EVALS)}, got '{self.eval}'")
        if self.matrix not in AFFINE_MATRICES:
            raise ValueError(f"matrix must be one of {', '.join(AFFINE_MATRICES)}, got '{self.matrix}'")
        if self.without_keypoints not in APPEARANCE_WITHOUT_KEYPOINTS:
            raise ValueError(
                f"without_keypoints must be one of {', '.join(APPEARANCE_WITHOUT_KEYPOINTS)}, "
                f"got '{self.without_keypoints}'"
            )
        for key in ("reg", "eval_lr", "trust"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{key} must be a finite number >= 0, got {value!r}")
        if self.eval_steps < 1:
            raise ValueError(f"eval_steps must be >= 1, got {self.eval_steps}")
        if self.neighbours < 0:
            raise ValueError(f"neighbours must be >= 0 (0: all training views), got {self.neighbours}")


class AppearanceModule(ViewModule):
    """A per-view module changing the rendered colours of the training images with per-photo ``offsets`` [N, ...]
    from no change; test views follow ``cfg.eval``.

    The photos that keep their colours (within ``cfg.trust``) fix the scene's colours. Where every photo is corrected,
    the corrections average to the identity over all training views, or with ``cfg.neighbours`` over each view's
    neighbours along the capture. A test view has no correction of its own and is rendered as the Gaussians are, so the
    Gaussians should hold the colours its neighbours saw: corrections that drift along the capture (a slow exposure
    drift, or brightness that changes with the viewing direction, which the Gaussians' view-dependent colour could hold)
    move the Gaussians' colours away from the photos near a test view. Averaging over neighbours leaves such a drift to
    the Gaussians, at the cost of the part of independent per-photo changes that neighbouring photos share
    (BENCHMARKS.md, issue 29).
    """

    kind = "appearance"

    def __init__(self, cfg: AppearanceConfig, train_names: list[str]) -> None:
        super().__init__(cfg, train_names)
        # [N, 3] each training photo's colour difference from the others at its SfM keypoints (log ratio per channel);
        # NaN: no keypoints to measure it at. Measured at a run's first step, from the photos it trains on.
        self.differences = torch.full((len(train_names), 3), math.nan)
        self.measured = False
        self.frames: list[Frame] = []  # the training frames, row for row (setup)
        self.sfm: SfmPoints | None = None  # their SfM points and keypoints (setup)
        self.log: Callable[[str], None] = lambda line: None
        learnt = torch.ones(3, 4) if cfg.matrix == "full" else torch.cat([torch.eye(3), torch.ones(3, 1)], dim=1)
        self.register_buffer("learnt", learnt, persistent=False)  # [3, 4]: 1 where a transform's offset may move

    def masked(self, offsets: Tensor) -> Tensor:
        """``offsets`` [N, ...] with the entries ``matrix`` does not learn (those mixing channels, when diagonal)
        zero."""
        raise NotImplementedError

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """Restore the offsets; transforms that mix channels are refused where this module's are diagonal."""
        offsets = state_dict["offsets"]
        if not torch.equal(self.masked(offsets), offsets):
            raise InputError(
                "the checkpoint's appearance transforms mix colour channels: resume it with "
                "views.appearance.matrix=full"
            )
        return super().load_state_dict(state_dict, strict, assign)

    def setup(self, run: RunSetup) -> None:
        """Keep the training frames and their SfM points with keypoints (triangulated from the known poses for a
        capture whose points come from a file), to measure which photos' colours differ."""
        self.frames = self.frames_by_row(run.data)
        self.log = run.log
        if self.cfg.trust > 0:
            try:
                self.sfm = run.data.scene.sfm_tracks(run.log)
            except InputError as exc:
                run.log(f"appearance: no SfM keypoints to measure the photos' colours at ({exc})")

    def corrected(self) -> Tensor:
        """[N] bool: whether each training photo's colours are corrected (all of them until measured)."""
        if self.cfg.trust == 0 or not self.measured:
            return torch.ones(len(self.index), dtype=torch.bool)
        untracked = torch.isnan(self.differences).any(-1)
        beyond = ~(self.differences.abs() <= self.cfg.trust).all(-1)  # NaN (untracked) counts as beyond
        return beyond & ~untracked if self.cfg.without_keypoints == "keep" else beyond

    def measure_colours(self) -> None:
        """Measure each training photo's colour difference from the others (:func:`colour_differences`), start the
        corrected photos from the gains it shows (:meth:`start_from_gains`, where their offsets are still zero: not
        on resume) and log which photos are corrected."""
        self.measured = True
        if self.cfg.trust == 0:
            return
        if self.sfm is not None:
            self.differences = colour_differences(self.frames, self.sfm)
        corrected = self.corrected()
        measured = corrected & ~torch.isnan(self.differences).any(-1)
        rows = measured.nonzero().flatten()
        fresh = rows[(self.offsets.detach()[rows] == 0).flatten(1).all(-1).cpu()]  # a resumed run's keep their values
        with torch.no_grad():
            self.start_from_gains(fresh, self.differences[fresh].exp())
        untracked = torch.isnan(self.differences).any(-1)
        kept = ~corrected & ~untracked

        def count(rows: Tensor, what: str, sized: bool = True) -> list[str]:
            size = f" (a median {self.differences[rows].abs().amax(-1).median().item():.3f})" if sized else ""
            return [f"{int(rows.sum())} {what}{size}"] if rows.any() else []

        corrects = count(measured, "whose colours at SfM keypoints differ from the other photos'")
        corrects += count(corrected & untracked, "without SfM keypoints", sized=False)
        keeps = count(kept, "keep their colours as shot")
        keeps += count(~corrected & untracked, "without SfM keypoints keep theirs (without_keypoints: keep)", False)
        self.log(
            f"appearance: correcting {int(corrected.sum())} of {len(corrected)} training photos"
            + (f" ({', '.join(corrects)})" if corrects else "")
            + f"; within trust {self.cfg.trust:g}: {', '.join(keeps) or 'none'}"
        )

    def start_from_gains(self, rows: Tensor, gains: Tensor) -> None:
        """Start the corrections (``offsets`` [N, ...]) of the photos ``rows`` [R] as the gains ``gains`` [R, 3] per
        channel (a photo's colour per scene colour)."""
        raise NotImplementedError

    def centred(self, offsets: Tensor) -> Tensor:
        """``offsets`` [N, ...] of the training views as applied: zero for the photos that keep their colours; where
        some keep them, the others' as learnt; where every photo is corrected, each less their mean over its
        neighbourhood."""
        corrected = self.corrected().to(offsets.device)
        if corrected.all():
            return offsets - neighbourhood_mean(offsets, self.cfg.neighbours)
        return offsets * corrected.view(-1, *[1] * (offsets.ndim - 1))

    def trained_rows(self, names: list[str], device: torch.device) -> Tensor | None:
        """Every row, every step (Adam as torch has it; the photos that keep their colours have no gradient and stay
        the identity): moving only the batch's rows learnt half of affine's gain on the exposure capture and cost the
        grid 1.2 dB of its gain there and 0.25 dB on the statuette's transforms.json capture (BENCHMARKS.md, issue
        38)."""
        return None

    def corrects_any(self, batch: Batch) -> bool:
        """Whether the photos of ``batch`` are corrected: measures them at the first step."""
        if self.frames and not self.measured:
            self.measure_colours()
        corrected = self.corrected()
        return bool(corrected[[self.index[name] for name in batch.names]].any())

    def eval_adjust(self) -> EvalAdjust | None:
        if self.cfg.eval == "identity":
            return None
        return partial(fit_left_half, steps=self.cfg.eval_steps, lr=self.cfg.eval_lr)


@VIEW_REGISTRY.register("affine")
class AffineAppearance(AppearanceModule):
    """One colour transform per training image, looked up by image name.

    The photos that keep their colours fix the scene's; where every photo is corrected, the transforms average to the
    identity (each is the identity plus its offset from the mean offset of its neighbourhood): the scene keeps the
    captures' average colours, which test views, having no transform, are rendered in. Otherwise a colour shift shared
    by all transforms, undone by the Gaussians, would cost the loss nothing. They are diagonal by default (a gain and a
    bias per channel: exposure, white balance, black level): a full 3x3 matrix also learnt what the Gaussians should
    hold where the colours do not change (BENCHMARKS.md, issue 38).
    """

    @dataclass
    class Config(AppearanceConfig):
        lr: float = 3e-3  # Adam learning rate of the offsets (measured with diagonal transforms; full: 1e-3)
        reg: float = 1e-2  # weight of the mean squared distance of the transforms from the identity

    def __init__(self, cfg: Config, train_names: list[str]) -> None:
        super().__init__(cfg, train_names)
        self.offsets = torch.nn.Parameter(torch.zeros(len(train_names), 3, 4))  # [N, 3, 4]

    def masked(self, offsets: Tensor) -> Tensor:
        return offsets * self.learnt.to(offsets.device)

    def transforms(self) -> Tensor:
        """Every training image's transform [N, 3, 4]: the identity for the photos that keep their colours; where
        every photo is corrected, their mean over each neighbourhood is the identity."""
        return identity_affine(1, self.offsets.device) + self.centred(self.masked(self.offsets))

    def start_from_gains(self, rows: Tensor, gains: Tensor) -> None:
        channels = torch.arange(3)
        self.offsets[rows[:, None], channels, channels] = (gains - 1).to(self.offsets)

    def adjust_image(self, image: Tensor, batch: Batch, out: RenderOutput) -> Tensor:
        """The rendered ``image`` [B, H, W, 3] as the training images ``batch.names`` saw them."""
        if not self.corrects_any(batch):
            return image
        return apply_affine(image, self.transforms()[self.rows(batch.names, self.offsets.device)])

    def regularization(self, out: RenderOutput, batch: Batch) -> Tensor | None:
        """``reg`` × the mean squared distance of the transforms from the identity; None where no photo is corrected."""
        if not self.corrected().any():
            return None
        return self.cfg.reg * (self.transforms() - identity_affine(1, self.offsets.device)).square().mean()


def neighbourhood_mean(offsets: Tensor, neighbours: int) -> Tensor:
    """The mean [N, ...] of ``offsets`` [N, ...] over each row and ``neighbours`` rows on each side (fewer at the
    ends); over all rows where ``neighbours`` is 0 or every row's neighbourhood holds them all."""
    count = len(offsets)
    if neighbours == 0 or neighbours >= count - 1:
        return offsets.mean(0, keepdim=True)
    sums = torch.cat([torch.zeros_like(offsets[:1]), offsets.cumsum(0)])  # [N + 1, ...]: sums of the first rows
    rows = torch.arange(count, device=offsets.device)
    first, end = (rows - neighbours).clamp_min(0), (rows + neighbours + 1).clamp_max(count)  # [N] each
    sizes = (end - first).to(offsets.dtype).reshape(-1, *[1] * (offsets.ndim - 1))
    return (sums[end] - sums[first]) / sizes


def fit_left_half(render: Tensor, gt: Tensor, steps: int, lr: float) -> tuple[Tensor, Tensor]:
    """Fit a colour transform mapping ``render`` to ``gt`` ([H, W, 3]) on the left half of the view;
    returns the right halves ``(transformed render, gt)`` [H, W - W // 2, 3] to score."""
    half = render.shape[1] // 2
    left, right = render[None, :, :half].detach(), render[None, :, half:].detach()  # [1, H, W', 3]
    affine = torch.nn.Parameter(identity_affine(1, render.device))  # [1, 3, 4]
    optimizer = Adam([affine], lr=lr)
    with torch.enable_grad():
        for _ in range(steps):
            loss = (apply_affine(left, affine) - gt[None, :, :half]).abs().mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        return apply_affine(right, affine)[0].clamp(0.0, 1.0), gt[:, half:]
