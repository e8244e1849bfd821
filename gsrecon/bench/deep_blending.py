"""Deep Blending (Hedman et al. 2018) as the 3DGS paper trains it: its db/ folders (drjohnson, playroom), images/ as
given, every 8th photo a test view."""

from __future__ import annotations

from gsrecon.bench.protocol import COLMAP, Scene, Suite

SUITE = Suite(
    name="deep-blending",
    layout=COLMAP,
    config="mipnerf360.yaml",
    eval_split="every_8",
    background="black",
    scenes=(Scene("drjohnson"), Scene("playroom")),
    metrics_note="PSNR on [0, 1] images; the 3DGS paper: its own SSIM (Gaussian window 11) and LPIPS with VGG",
    missing=(
        "3DGS paper Table 1 (Deep Blending, 7k and 30k): the paper's table could not be read here",
        "FastGS Table 1: the paper's table could not be read here",
    ),
)
