"""LLFF (Mildenhall et al. 2019), as NeRF and TensoRF score it: the photos at 1/8 (504x378), every 8th a test view."""

from __future__ import annotations

from gsrecon.bench.protocol import COLMAP, Reference, Scene, Suite

SCENES = ("fern", "flower", "fortress", "horns", "leaves", "orchids", "room", "trex")
SIZE = (504, 378)  # 1/8 of the 4032x3024 originals: images_8/, or images/ with the model at this size
TENSORF = "TensoRF paper (Chen et al. 2022) per-scene, via nerfbaselines methods/tensorf_spec.py (cde53bd)"
NERF = "NeRF paper (Mildenhall et al. 2020) per-scene LLFF table, as quoted by issue 58 and shared/data/horns"
# TensoRF's per-scene LLFF results: PSNR, SSIM, LPIPS (VGG)
_TENSORF = {
    "room": (32.35, 0.952, 0.167), "fern": (25.27, 0.814, 0.237), "leaves": (21.30, 0.752, 0.217),
    "fortress": (31.36, 0.897, 0.148), "orchids": (19.87, 0.649, 0.278), "flower": (28.60, 0.871, 0.169),
    "trex": (26.97, 0.900, 0.221), "horns": (28.14, 0.877, 0.196),
}  # fmt: skip

SUITE = Suite(
    name="llff",
    layout=COLMAP,
    config="mipnerf360.yaml",
    eval_split="every_8",
    background="black",
    scenes=tuple(Scene(name, "images_8", 8, SIZE) for name in SCENES),
    references=(
        Reference("NeRF", None, NERF, psnr=27.45, scene="horns"),
        *(Reference("TensoRF", None, TENSORF, p, s, lp, "vgg", scene=n) for n, (p, s, lp) in _TENSORF.items()),
    ),
    metrics_note="PSNR on [0, 1] images; NeRF's and TensoRF's SSIM (Gaussian window 11) and LPIPS with VGG",
    missing=("NeRF's SSIM and LPIPS on horns and its other scenes: not read here",),
)
