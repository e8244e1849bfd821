"""Benchmark the pure-PyTorch renderer: forward, forward+backward, and one full training step; or, with
``--compare``, a training step of several renderers side by side (runs alternated, case by case).

Scenes are random Gaussian clouds in front of a pinhole camera whose footprints are a few pixels
wide (screen-space sigma 0.5-4 px), with SH degree 3; or, with ``--exp-dir``, a trained run's
Gaussians seen from its first training views. Prints a markdown table (median ms) for each
``--tile-size`` given.

    python scripts/bench_render.py --threads 1 --device cpu --repeats 20
    python scripts/bench_render.py --exp-dir outputs/synthetic --tile-size 4,8,16 --views 4
    python scripts/bench_render.py --compare torch,cpu --steps 64x48:5000,125x82:20000 --threads 1
    python scripts/bench_render.py --compare cpu --steps 125x82:20000 --clock cpu   # CPU time: a loaded machine
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from gsrecon.cameras import Cameras
from gsrecon.component import RunSetup
from gsrecon.engine.build import build_datapipeline
from gsrecon.engine.inference import load_trained_scene
from gsrecon.engine.resolve import resolve_renderer_entry
from gsrecon.logging.console import Logger
from gsrecon.model.optim import FUSED_ADAM_DEVICES
from gsrecon.registry import RENDERER_REGISTRY
from gsrecon.render.base import Renderer
from gsrecon.render.torch_renderer import TorchRenderer
from gsrecon.sh import rgb_to_sh

SIZES = [(64, 48, 2_000), (128, 96, 10_000), (256, 192, 50_000)]
STEP_SIZE = (159, 89, 5_000)
SH_DEGREE = 3


def make_scene(n: int, width: int, height: int, device: torch.device, seed: int = 0):
    """Random Gaussians filling the view frustum at depths 2-6, and one camera looking at them."""
    g = torch.Generator().manual_seed(seed)
    focal = 0.8 * max(width, height)
    depth = 2.0 + 4.0 * torch.rand(n, generator=g)
    px = torch.rand(n, generator=g) * width
    py = torch.rand(n, generator=g) * height
    means = torch.stack([(px - width / 2) / focal * depth, (py - height / 2) / focal * depth, depth], dim=-1)
    sigma_px = 0.5 + 3.5 * torch.rand(n, 3, generator=g)
    params = {
        "means": means,
        "scales": torch.log(sigma_px * depth[:, None] / focal),
        "quats": torch.randn(n, 4, generator=g),
        "opacities": torch.empty(n).uniform_(-2.0, 4.0, generator=g),
        "sh0": rgb_to_sh(torch.rand(n, 1, 3, generator=g)),
        "shN": 0.05 * torch.randn(n, (SH_DEGREE + 1) ** 2 - 1, 3, generator=g),
    }
    params = {k: v.to(device).requires_grad_(True) for k, v in params.items()}
    K = torch.tensor([[focal, 0.0, width / 2], [0.0, focal, height / 2], [0.0, 0.0, 1.0]])
    return params, torch.eye(4, device=device)[None], K.to(device)[None]


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # cpu: the process's CPU time, all its threads
clock = CLOCKS["wall"]


def median_ms(fn: Callable[[], None], repeats: int, device: torch.device) -> float:
    """Median time of ``fn`` in ms by ``clock`` after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = clock()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((clock() - start) * 1e3)
    return statistics.median(times)


def bench_render(renderer: TorchRenderer, size, device: torch.device, repeats: int) -> tuple[float, float]:
    width, height, n = size
    params, viewmats, Ks = make_scene(n, width, height, device)
    bg = torch.zeros(1, 3, device=device)

    def forward() -> None:
        with torch.no_grad():
            renderer.render(params, Cameras(viewmats, Ks, width, height), SH_DEGREE, bg)

    def forward_backward() -> None:
        out = renderer.render(params, Cameras(viewmats, Ks, width, height), SH_DEGREE, bg)
        out.image.sum().backward()

    return median_ms(forward, repeats, device), median_ms(forward_backward, repeats, device)


def bench_step(renderer: Renderer, device: torch.device, repeats: int, size: tuple[int, int, int] = STEP_SIZE) -> float:
    """Render + L1 loss + backward + Adam step over all parameters (3DGS learning rates; fused where the trainer
    fuses it, as a training step runs)."""
    width, height, n = size
    params, viewmats, Ks = make_scene(n, width, height, device)
    target = torch.rand(1, height, width, 3, device=device)
    bg = torch.zeros(1, 3, device=device)
    lrs = {"means": 1.6e-4, "scales": 5e-3, "quats": 1e-3, "opacities": 5e-2, "sh0": 2.5e-3, "shN": 1.25e-4}
    fused = device.type in FUSED_ADAM_DEVICES
    optimizer = torch.optim.Adam([{"params": [params[k]], "lr": lr} for k, lr in lrs.items()], eps=1e-15, fused=fused)

    def step() -> None:
        out = renderer.render(params, Cameras(viewmats, Ks, width, height), SH_DEGREE, bg)
        loss = (out.image - target).abs().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return median_ms(step, repeats, device)


def bench_trained(
    exp_dir: str, tile_sizes: list[int], views: int, device: torch.device, repeats: int
) -> list[tuple[float, float]]:
    """Per tile size, median ms per view of forward and forward+backward (of the L1 loss) over a run's first
    training views (the run and its views are loaded once)."""
    scene = load_trained_scene(exp_dir=exp_dir)
    params = {k: v.to(device).requires_grad_(True) for k, v in scene.params.items()}
    pipeline = build_datapipeline(scene.cfg.data, device, scene.cfg.seed, scene.source)
    batches = [pipeline.next_train(step) for step in range(views)]
    results = []
    for tile_size in tile_sizes:
        renderer_cfg = dict(scene.cfg.renderer, name="torch", tile_size=tile_size)
        renderer = RENDERER_REGISTRY.build(resolve_renderer_entry(renderer_cfg, device, exp_dir))

        def render(batch, renderer=renderer) -> torch.Tensor:
            return renderer.render_batch(params, batch, scene.sh_degree).image

        def forward() -> None:
            with torch.no_grad():
                for batch in batches:
                    render(batch)

        def forward_backward() -> None:
            for batch in batches:
                (render(batch) - batch.images).abs().mean().backward()

        results.append(
            (median_ms(forward, repeats, device) / views, median_ms(forward_backward, repeats, device) / views)
        )
    return results


def compare_steps(names: list[str], sizes: list[tuple[int, int, int]], device: torch.device, repeats: int) -> None:
    """Print a table of training-step times of the renderers ``names`` (default settings), alternated per case."""
    renderers = [RENDERER_REGISTRY.build(resolve_renderer_entry({"name": name}, device, "--compare")) for name in names]
    for renderer in renderers:
        renderer.setup(RunSetup(Logger().info))
    print(f"| case | {' | '.join(f'{name} step ms' for name in names)} | {names[0]} / {names[-1]} |")
    print(f"|---|{'---:|' * len(names)}---:|")
    for size in sizes:
        times = [bench_step(renderer, device, repeats, size) for renderer in renderers]
        row = " | ".join(f"{t:.1f}" for t in times)
        print(f"| {size[0]}x{size[1]}, {size[2]} Gaussians | {row} | {times[0] / times[-1]:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--repeats", type=int, default=10, help="timed repetitions per case")
    parser.add_argument("--tile-size", default=str(TorchRenderer.Config.tile_size), help="comma-separated: 4,8,16")
    parser.add_argument("--exp-dir", help="a trained run: render its Gaussians from its training views instead")
    parser.add_argument("--views", type=int, default=4, help="training views per timed call (with --exp-dir)")
    parser.add_argument("--compare", help="comma-separated renderers: time their training steps side by side")
    parser.add_argument(
        "--steps", default="64x48:5000,125x82:20000", help="with --compare: WxH:gaussians cases, comma-separated"
    )
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="cpu: the process's CPU time")
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    tile_sizes = [int(size) for size in args.tile_size.split(",")]
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {device}, median of {args.repeats} "
        f"({args.clock} time), "
        f"{f'{args.exp_dir}, first {args.views} training views' if args.exp_dir else f'SH degree {SH_DEGREE}'}\n"
    )
    if args.compare:
        sizes = []
        for case in args.steps.split(","):
            resolution, n = case.split(":")
            width, height = resolution.split("x")
            sizes.append((int(width), int(height), int(n)))
        compare_steps(args.compare.split(","), sizes, device, args.repeats)
        return
    if args.exp_dir:
        print("| tile | forward ms/view | forward+backward ms/view |")
        print("|---:|---:|---:|")
        timings = bench_trained(args.exp_dir, tile_sizes, args.views, device, args.repeats)
        for tile_size, (fwd, fwd_bwd) in zip(tile_sizes, timings):
            print(f"| {tile_size} | {fwd:.1f} | {fwd_bwd:.1f} |")
        return
    for tile_size in tile_sizes:
        renderer = TorchRenderer(TorchRenderer.Config(tile_size=tile_size))
        print(f"tile {tile_size}\n\n| case | forward ms | forward+backward ms |")
        print("|---|---:|---:|")
        for size in SIZES:
            fwd, fwd_bwd = bench_render(renderer, size, device, args.repeats)
            print(f"| {size[0]}x{size[1]}, {size[2]} Gaussians | {fwd:.1f} | {fwd_bwd:.1f} |")
        step = bench_step(renderer, device, args.repeats)
        w, h, n = STEP_SIZE
        print(f"\nfull step (render + L1 + backward + Adam), {w}x{h}, {n} Gaussians: {step:.1f} ms\n")


if __name__ == "__main__":
    main()
