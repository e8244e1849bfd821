"""Time the `cpu` renderer's four kernels one by one: projection, rasterization, and their backward passes.

The scenes are bench_render.py's (random Gaussians in front of one camera, SH degree 3); each kernel is called
directly with the previous one's outputs (the backward with a fixed random image gradient), so the table shows
the kernels alone, without autograd, the loss or the optimiser. Prints median ms per call.

    python scripts/bench_cpu_kernels.py --threads 2 --cases 125x82:20000,250x165:1000000
    python scripts/bench_cpu_kernels.py --threads 1 --clock cpu   # CPU time: a loaded machine
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from types import ModuleType

import torch
from bench_render import CLOCKS, SH_DEGREE, make_scene

from gsrecon.kernels.build import load_kernels
from gsrecon.render.base import RendererConfig

KERNELS = ("project_forward", "rasterize_forward", "rasterize_backward", "project_backward")
BINNING = ("offsets", "ids", "first", "slots", "last", "trans_final")


def kernel_calls(kernels: ModuleType, width: int, height: int, n: int) -> dict[str, Callable[[], object]]:
    """The four kernels as calls without arguments on one scene, in the order a training step runs them."""
    params, viewmats, Ks = make_scene(n, width, height, torch.device("cpu"))
    p = {key: value.detach().contiguous() for key, value in params.items()}
    cfg = RendererConfig()
    gaussians = {"means": p["means"], "quats": p["quats"], "log_scales": p["scales"], "logits": p["opacities"],
                 "sh0": p["sh0"], "shN": p["shN"]}  # fmt: skip
    project = {**gaussians, "viewmats": viewmats.contiguous(), "Ks": Ks.contiguous(), "width": width,
               "height": height, "sh_degree": SH_DEGREE, "near_plane": cfg.near_plane, "far_plane": cfg.far_plane,
               "eps2d": cfg.eps2d, "antialiased": cfg.antialiased}  # fmt: skip
    projection = kernels.project_forward(**project)
    splats = {key: projection[key] for key in ("means2d", "conics", "log_opacities", "colors", "depths", "radii")}
    raster = {"width": width, "height": height, "tile_size": 16, "alpha_max": 0.99}
    forward = kernels.rasterize_forward(**splats, **raster, median_depth=False)
    grad_image = torch.randn(forward["image"].shape, generator=torch.Generator().manual_seed(1))
    binning = {key: forward[key] for key in BINNING}
    splat_grads = kernels.rasterize_backward(**splats, **binning, grad_image=grad_image, **raster)
    v_splats = {f"v_{key}": splat_grads[key] for key in ("means2d", "conics", "depths", "log_opacities", "colors")}
    return {
        "project_forward": lambda: kernels.project_forward(**project),
        "rasterize_forward": lambda: kernels.rasterize_forward(**splats, **raster, median_depth=False),
        "rasterize_backward": lambda: kernels.rasterize_backward(**splats, **binning, grad_image=grad_image, **raster),
        "project_backward": lambda: kernels.project_backward(
            **project, radii=projection["radii"], **v_splats, pose_grad=False
        ),
    }


def median_ms(call: Callable[[], object], repeats: int, clock: Callable[[], float]) -> float:
    """Median ms of ``repeats`` calls, after one untimed call."""
    call()
    times = []
    for _ in range(repeats):
        start = clock()
        call()
        times.append(clock() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--repeats", type=int, default=15, help="timed calls per kernel and case")
    parser.add_argument("--cases", default="125x82:20000,250x165:200000,250x165:1000000", help="WxH:gaussians,...")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="cpu: the process's CPU time")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kernels = load_kernels()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, median of {args.repeats} ({args.clock})\n")
    print(f"| case | pairs | {' | '.join(f'{name} ms' for name in KERNELS)} |")
    print(f"|---|---:|{'---:|' * len(KERNELS)}")
    for case in args.cases.split(","):
        resolution, n = case.split(":")
        width, height = (int(size) for size in resolution.split("x"))
        calls = kernel_calls(kernels, width, height, int(n))
        pairs = calls["rasterize_forward"]()["ids"].numel()
        row = " | ".join(f"{median_ms(calls[name], args.repeats, CLOCKS[args.clock]):.2f}" for name in KERNELS)
        print(f"| {width}x{height}, {int(n)} Gaussians | {pairs} | {row} |")


if __name__ == "__main__":
    main()
