"""Which training photos' colours differ from the others': measured where several photos saw the same SfM points.

A point seen by several photos has one colour in the scene; a photo that saw it brighter, darker or tinted (its
exposure, white balance or tone curve changed) shows that at its keypoint. Each photo's colour difference is the
median, over the points it saw that at least :data:`MIN_OBSERVERS` photos saw, of the log ratio of its colour there
to the geometric mean of the colours the other photos saw, per channel. The median over hundreds of points is
robust to view-dependent colour (a highlight) and to keypoints a pixel off.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from gsrecon.data.scene import Frame, SfmPoints

MIN_OBSERVERS = 3  # points seen by fewer photos are left out: one other photo's colour is too noisy a reference
MIN_SAMPLES = 16  # a photo needs this many such points for its difference to be measured (else NaN)
DARK = 0.04  # colours below this (of 1) are left out: their ratios are noise and a black level's
BLUR_PX = 3  # colours are read from the image box-filtered over this many pixels (a keypoint is a pixel off)


def keypoint_colours(frame: Frame, keypoints: Tensor) -> Tensor:
    """The colours [P, 3] in [0, 1] of ``frame``'s image at ``keypoints`` [P, 2] (frame pixels, centres at +0.5),
    interpolated from the image box-filtered over :data:`BLUR_PX` pixels."""
    image = frame.image[..., :3].cpu().float().div(255.0).permute(2, 0, 1)[None]  # [1, 3, H, W]
    blurred = F.avg_pool2d(image, BLUR_PX, stride=1, padding=BLUR_PX // 2, count_include_pad=False)
    height, width = image.shape[-2:]
    size = torch.tensor([width, height], dtype=torch.float32)
    where = (keypoints.float().cpu() / size) * 2 - 1  # [P, 2] in grid_sample's [-1, 1] (align_corners=False)
    sampled = F.grid_sample(blurred, where[None, None], mode="bilinear", padding_mode="border", align_corners=False)
    return sampled[0, :, 0].T  # [P, 3]


def colour_differences(frames: list[Frame], sfm: SfmPoints) -> Tensor:
    """[N, 3] each of ``frames``' colour difference from the other photos per channel (the median log ratio at its
    SfM points, see the module's docstring); NaN where it saw fewer than :data:`MIN_SAMPLES` points that
    :data:`MIN_OBSERVERS` photos saw (or has no keypoints)."""
    samples: list[tuple[int, Tensor, Tensor]] = []  # (frame row, point rows [P_i], log colours [P_i, 3])
    for row, frame in enumerate(frames):
        if frame.name in sfm.keypoints and frame.camera_model.kind == "pinhole":
            colours = keypoint_colours(frame, sfm.keypoints[frame.name])
            samples.append((row, sfm.observed[frame.name].cpu(), colours.clamp_min(DARK).log()))
    differences = torch.full((len(frames), 3), math.nan)
    if not samples:
        return differences
    sightings, log_sums = torch.zeros(len(sfm.points)), torch.zeros(len(sfm.points), 3)  # [P], [P, 3]
    for _, rows, logs in samples:
        sightings.index_add_(0, rows, torch.ones(len(rows)))
        log_sums.index_add_(0, rows, logs)
    for row, rows, logs in samples:
        others = sightings[rows, None] - 1  # [P_i, 1]
        ratio = logs - (log_sums[rows] - logs) / others.clamp_min(1)  # [P_i, 3]: log(own / the others' mean)
        usable = (others[:, 0] >= MIN_OBSERVERS - 1) & (logs > math.log(DARK)).all(-1)  # [P_i]
        if int(usable.sum()) >= MIN_SAMPLES:
            differences[row] = ratio[usable].median(0).values
    return differences
