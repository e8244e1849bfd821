"""Benchmark plugin: training photos whose exposure, white balance and black level change from photo to photo.

Imported by a run (``imports=[scripts/perturb_colours.py]``), it registers the hook ``PerturbTrainingColours``: before
the run, each training photo gets its own exposure gain U(1 - ``gain``, 1 + ``gain``), white balance U(1 - ``balance``,
1 + ``balance``) per channel and black level U(-``black``, ``black``) per channel, drawn from ``seed`` in the order of
the training views, as phone photos under automatic exposure come. Test views keep their colours, on which they are
scored. It changes the pixels the data pipeline holds (``data.cache: device`` or ``cpu``).

    python scripts/bench_sweep.py ... --variant "colours=imports=[scripts/perturb_colours.py] \\
        hooks.PerturbTrainingColours.seed=0 views.appearance.name=affine"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gsrecon.engine.hook import Hook
from gsrecon.registry import HOOK_REGISTRY

if TYPE_CHECKING:
    from gsrecon.engine.hook import TrainerView


def with_camera_colours(
    pixels: Tensor, generator: torch.Generator, gain: float = 0.4, balance: float = 0.2, black: float = 0.05
) -> Tensor:
    """uint8 ``pixels`` [H, W, 3] with a random exposure gain U(1 - gain, 1 + gain), white balance
    U(1 - balance, 1 + balance) per channel and black level U(-black, black) per channel, drawn from ``generator``."""
    exposure = 1 - gain + 2 * gain * torch.rand(1, generator=generator)
    white = 1 - balance + 2 * balance * torch.rand(3, generator=generator)
    offset = 2 * black * torch.rand(3, generator=generator) - black
    changed = (pixels.float() / 255.0 * exposure * white + offset).clamp(0.0, 1.0)
    return (changed * 255.0).round().to(torch.uint8)


@HOOK_REGISTRY.register()
class PerturbTrainingColours(Hook):
    """Gives each training photo the data pipeline holds its own seeded exposure, white balance and black level."""

    @dataclass
    class Config:
        gain: float = 0.4  # exposure gain U(1 - gain, 1 + gain)
        balance: float = 0.2  # white balance U(1 - balance, 1 + balance) per channel
        black: float = 0.05  # black level U(-black, black) per channel
        seed: int = 0  # draws each photo's colours

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    def before_run(self, trainer: TrainerView) -> None:
        generator = torch.Generator().manual_seed(self.cfg.seed)
        cfg = self.cfg
        for frame in trainer.datapipeline._train:  # the decoded uint8 images training reads
            rgb = frame.pixels[..., :3]
            rgb.copy_(with_camera_colours(rgb.cpu(), generator, cfg.gain, cfg.balance, cfg.black))
