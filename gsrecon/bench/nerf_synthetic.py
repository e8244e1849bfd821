"""NeRF-synthetic (Mildenhall et al. 2020): transforms_train.json to train, transforms_test.json to test, over white."""

from __future__ import annotations

from gsrecon.bench.protocol import TRANSFORMS, Reference, Scene, Suite

SCENES = ("chair", "drums", "ficus", "hotdog", "lego", "materials", "mic", "ship")
INRIA_PAPER = "3DGS paper (Kerbl et al. 2023) per-scene, via nerfbaselines methods/gaussian_splatting_spec.py (cde53bd)"
_INRIA_PSNR = {
    "mic": 35.36, "chair": 35.83, "ship": 30.80, "materials": 30.00, "lego": 35.78, "drums": 26.15, "ficus": 34.87,
    "hotdog": 37.72,
}  # fmt: skip

SUITE = Suite(
    name="nerf-synthetic",
    layout=TRANSFORMS,
    config="blender_lego.yaml",
    eval_split="dataset",
    background="white",
    scenes=tuple(Scene(name) for name in SCENES),
    references=tuple(Reference("3DGS paper-30k", 30000, INRIA_PAPER, psnr, scene=n) for n, psnr in _INRIA_PSNR.items()),
    metrics_note="PSNR on [0, 1] images over white (the 3DGS paper gives PSNR only for this dataset)",
    missing=("the 3DGS paper's SSIM / LPIPS on NeRF-synthetic: it reports PSNR only",),
)
