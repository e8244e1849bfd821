"""Benchmark plugin: distractors pasted into some training photos, as passers-by and cars cross a capture.

Imported by a run (``imports=[scripts/paste_distractors.py]``), it registers the hook ``PasteDistractors``: before the
run, ``fraction`` of the training photos (drawn from ``seed``) each get one opaque distractor covering U(``min_area``,
``max_area``) of the frame at a place of its own: a rectangle cut out of another training photo, or an ellipse of one
random colour (``kind``: ``mixed`` draws one in two of each, ``cutout`` or ``shape`` only that one). Test views keep
their pixels, on which they are scored. It changes the pixels the data pipeline holds (``data.cache: device`` or
``cpu``).

    python scripts/bench_sweep.py ... --variant "distractors=imports=[scripts/paste_distractors.py] \\
        hooks.PasteDistractors.seed=0 views.transients.name=transients"
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gsrecon.engine.hook import Hook
from gsrecon.registry import HOOK_REGISTRY

if TYPE_CHECKING:
    from gsrecon.engine.hook import TrainerView


def uniform(generator: torch.Generator, low: float = 0.0, high: float = 1.0) -> float:
    return low + (high - low) * torch.rand(1, generator=generator).item()


def paste_distractor(pixels: Tensor, other: Tensor, generator: torch.Generator, area: float, kind: str) -> Tensor:
    """[H, W] bool where one opaque distractor covering about ``area`` of the frame was pasted into uint8 ``pixels``
    [H, W, 3] (in place): a rectangle cut out of ``other`` [H', W', 3] (where it is large enough) or an ellipse of one
    colour, drawn from ``generator`` (``kind`` mixed) or the one ``kind`` names (cutout, shape)."""
    height, width = pixels.shape[:2]
    aspect = math.exp(uniform(generator, -0.7, 0.7))  # width / height of the distractor
    h = min(height, max(2, round(math.sqrt(area * height * width / aspect))))
    w = min(width, max(2, round(area * height * width / h)))
    top, left = int(uniform(generator) * (height - h + 1)), int(uniform(generator) * (width - w + 1))
    cutout = {"mixed": uniform(generator) < 0.5, "cutout": True, "shape": False}[kind]
    if cutout and other.shape[0] >= h and other.shape[1] >= w:
        y, x = int(uniform(generator) * (other.shape[0] - h + 1)), int(uniform(generator) * (other.shape[1] - w + 1))
        pixels[top : top + h, left : left + w] = other[y : y + h, x : x + w]
        covered = torch.zeros(height, width, dtype=torch.bool)
        covered[top : top + h, left : left + w] = True
        return covered
    ys = torch.arange(height, dtype=torch.float32)[:, None] + 0.5
    xs = torch.arange(width, dtype=torch.float32)[None, :] + 0.5
    # an ellipse of area pi/4 h w inside the h x w box: scaled by 2/sqrt(pi) per side to cover ``area``
    ry, rx = h / math.sqrt(math.pi), w / math.sqrt(math.pi)
    covered = ((ys - top - h / 2) / ry) ** 2 + ((xs - left - w / 2) / rx) ** 2 <= 1.0  # [H, W]
    colour = (torch.rand(3, generator=generator) * 255).round().to(torch.uint8)
    pixels[covered.to(pixels.device)] = colour.to(pixels.device)
    return covered


@HOOK_REGISTRY.register()
class PasteDistractors(Hook):
    """Pastes one seeded opaque distractor into ``fraction`` of the training photos the data pipeline holds."""

    @dataclass
    class Config:
        fraction: float = 0.3  # of the training photos given a distractor
        min_area: float = 0.05  # each covers U(min_area, max_area) of its frame
        max_area: float = 0.15
        seed: int = 0  # draws the photos, the distractors and their places
        kind: str = "mixed"  # mixed (one in two of each) | cutout | shape

        def __post_init__(self) -> None:
            if self.kind not in ("mixed", "cutout", "shape"):
                raise ValueError(f"kind must be mixed, cutout or shape, got {self.kind!r}")

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.covered: dict[str, Tensor] = {}  # training photo name -> [H, W] bool, where its distractor is

    def before_run(self, trainer: TrainerView) -> None:
        cfg = self.cfg
        generator = torch.Generator().manual_seed(cfg.seed)
        frames = trainer.datapipeline._train  # the decoded uint8 images training reads
        count = round(cfg.fraction * len(frames))
        chosen = torch.randperm(len(frames), generator=generator)[:count].tolist()
        for index in sorted(chosen):
            other = frames[(index + 1 + int(uniform(generator) * (len(frames) - 1))) % len(frames)]
            rgb = frames[index].pixels[..., :3]
            area = uniform(generator, cfg.min_area, cfg.max_area)
            self.covered[frames[index].name] = paste_distractor(
                rgb, other.pixels[..., :3].clone(), generator, area, cfg.kind
            )
