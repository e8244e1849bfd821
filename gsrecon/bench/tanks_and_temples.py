"""Tanks and Temples (Knapitsch et al. 2017) as the 3DGS paper trains it: its tandt/ folders (train, truck), images/
as given, every 8th photo a test view."""

from __future__ import annotations

from gsrecon.bench.protocol import COLMAP, Scene, Suite

SUITE = Suite(
    name="tanks-and-temples",
    layout=COLMAP,
    config="mipnerf360.yaml",
    eval_split="every_8",
    background="black",
    scenes=(Scene("train"), Scene("truck")),
    metrics_note="PSNR on [0, 1] images; the 3DGS paper: its own SSIM (Gaussian window 11) and LPIPS with VGG",
    missing=(
        "3DGS paper Table 1 (Tanks&Temples, 7k and 30k): the paper's table could not be read here",
        "FastGS Table 1: the paper's table could not be read here",
    ),
)
