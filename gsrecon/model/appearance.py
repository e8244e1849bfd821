"""Per-image appearance: a learned colour transform per training image, applied to the render before the loss.

Photos of one capture differ in exposure and white balance; without a per-image correction the
Gaussians absorb those differences as floaters and colour blotches. ``affine`` gives each training
image a 3x3 colour matrix and a bias (as the Inria code's exposure compensation and gsplat's
``--app_opt`` do in spirit), initialised to the identity, trained by its own Adam and pulled toward
the identity by a small penalty. Test views have no transform of their own: they are scored with the
identity (``eval: identity``), or with a transform fitted on the left half of the view and scored on
the right half (``eval: fit_left``, as NeRF-W and gsplat evaluate appearance codes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gsrecon.errors import InputError

APPEARANCE_MODES = ("none", "affine")
APPEARANCE_EVALS = ("identity", "fit_left")


@dataclass
class AppearanceConfig:
    """The ``appearance:`` section of a run (off by default). ValueError names the key."""

    mode: str = "none"  # none | affine (3x3 colour matrix + bias per training image)
    lr: float = 1e-3  # Adam learning rate of the transforms
    reg: float = 1e-2  # weight of the mean squared distance of the transforms from the identity
    eval: str = "identity"  # test views: identity | fit_left (fit on the left half, score the right half)
    eval_steps: int = 100  # fit_left: Adam steps fitting a test view's transform
    eval_lr: float = 1e-2  # fit_left: their learning rate

    def __post_init__(self) -> None:
        if self.mode not in APPEARANCE_MODES:
            raise ValueError(f"appearance.mode must be one of {', '.join(APPEARANCE_MODES)}, got '{self.mode}'")
        if self.eval not in APPEARANCE_EVALS:
            raise ValueError(f"appearance.eval must be one of {', '.join(APPEARANCE_EVALS)}, got '{self.eval}'")
        for key in ("lr", "reg", "eval_lr"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"appearance.{key} must be a finite number >= 0, got {value!r}")
        if self.eval_steps < 1:
            raise ValueError(f"appearance.eval_steps must be >= 1, got {self.eval_steps}")


def identity_affine(count: int, device: torch.device | str = "cpu") -> Tensor:
    """``count`` identity colour transforms [count, 3, 4] (3x3 matrix, then the bias column)."""
    return torch.eye(3, 4, device=device).repeat(count, 1, 1)


def apply_affine(images: Tensor, affine: Tensor) -> Tensor:
    """``images`` [B, H, W, 3] through per-image transforms ``affine`` [B, 3, 4]: ``M @ rgb + b``."""
    return torch.einsum("bij,bhwj->bhwi", affine[:, :, :3], images) + affine[:, None, None, :, 3]


class AffineAppearance(torch.nn.Module):
    """One colour transform per training image, looked up by image name.

    The transforms average to the identity (each is the identity plus its offset from the mean offset): the
    scene keeps the captures' average colours, which test views, having no transform, are rendered in.
    Otherwise a colour shift shared by all transforms, undone by the Gaussians, would cost the loss nothing.
    """

    def __init__(self, names: list[str], reg: float) -> None:
        super().__init__()
        self.index = {name: i for i, name in enumerate(names)}
        self.reg = reg
        self.offsets = torch.nn.Parameter(torch.zeros(len(names), 3, 4))  # [N, 3, 4]

    def transforms(self) -> Tensor:
        """Every training image's transform [N, 3, 4]; their mean is the identity."""
        return identity_affine(1, self.offsets.device) + self.offsets - self.offsets.mean(0, keepdim=True)

    def forward(self, images: Tensor, names: list[str]) -> Tensor:
        """The rendered ``images`` [B, H, W, 3] as the training images ``names`` saw them."""
        rows = torch.tensor([self.index[name] for name in names], device=self.offsets.device)
        return apply_affine(images, self.transforms()[rows])

    def regularization(self) -> Tensor:
        """``reg`` × the mean squared distance of the transforms from the identity."""
        return self.reg * (self.transforms() - identity_affine(1, self.offsets.device)).square().mean()


def build_appearance(cfg: AppearanceConfig, train_names: list[str], device: torch.device) -> AffineAppearance | None:
    """The appearance model of ``cfg`` for the training images ``train_names``; None when off."""
    if cfg.mode == "none":
        return None
    return AffineAppearance(train_names, cfg.reg).to(device)


def build_appearance_optimizer(module: AffineAppearance, cfg: AppearanceConfig) -> torch.optim.Adam:
    """The transforms' own Adam (constant learning rate ``cfg.lr``)."""
    return torch.optim.Adam([{"params": [module.offsets], "lr": cfg.lr, "name": "appearance"}], eps=1e-15)


def appearance_state(module: AffineAppearance, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The checkpoint entry of the transforms and their optimiser."""
    return {"offsets": module.offsets.detach().clone(), "optimizer": optimizer.state_dict()}


def load_appearance_state(module: AffineAppearance, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Restore :func:`appearance_state`; a different number of training images is refused."""
    if state["offsets"].shape != module.offsets.shape:
        raise InputError(
            f"the checkpoint's appearance transforms are for {state['offsets'].shape[0]} training images; "
            f"this run has {module.offsets.shape[0]}"
        )
    with torch.no_grad():
        module.offsets.copy_(state["offsets"])
    optimizer.load_state_dict(state["optimizer"])


def fit_left_half(render: Tensor, gt: Tensor, steps: int, lr: float) -> tuple[Tensor, Tensor]:
    """Fit a colour transform mapping ``render`` to ``gt`` ([H, W, 3]) on the left half of the view;
    returns the right halves ``(transformed render, gt)`` [H, W - W // 2, 3] to score."""
    half = render.shape[1] // 2
    left, right = render[None, :, :half].detach(), render[None, :, half:].detach()  # [1, H, W', 3]
    affine = torch.nn.Parameter(identity_affine(1, render.device))  # [1, 3, 4]
    optimizer = torch.optim.Adam([affine], lr=lr)
    with torch.enable_grad():
        for _ in range(steps):
            loss = (apply_affine(left, affine) - gt[None, :, :half]).abs().mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        return apply_affine(right, affine)[0].clamp(0.0, 1.0), gt[:, half:]
