"""The photometric loss of a CPU training step, timed: 0.8 L1 + 0.2 (1 - SSIM) of a render against its photo, value
and gradient (forward and backward) as the `cpu` renderer's runs compute them (the compiled terms), at each image
size and thread count asked::

    python scripts/bench_loss.py --sizes 125x82,250x165,960x540 --threads 1,2 --repeats 50

Prints one line per (size, threads): the median and the minimum of the repeats, wall-clock milliseconds.
Thread counts alternate within each size, so a busy machine slows every column alike; note the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from types import ModuleType

import torch

from gsrecon.kernels.build import load_kernels
from gsrecon.losses.l1 import l1_loss
from gsrecon.losses.ssim import ssim


def images(width: int, height: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A smooth photo ([1, H, W, 3], a few blobs of colour) and a render near it, as in training."""
    generator = torch.Generator().manual_seed(0)
    coarse = torch.rand(1, 3, max(height // 8, 2), max(width // 8, 2), generator=generator)
    photo = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear").permute(0, 2, 3, 1)
    render = (photo + 0.05 * torch.randn(photo.shape, generator=generator)).clamp(0, 1)
    return render.contiguous(), photo.contiguous()


def step_ms(render: torch.Tensor, photo: torch.Tensor, repeats: int, kernels: ModuleType) -> list[float]:
    """Wall milliseconds of the loss's value and gradient on the ``kernels``, ``repeats`` times."""
    times = []
    for _ in range(repeats):
        pred = render.clone().requires_grad_()
        start = time.perf_counter()
        loss = 0.8 * l1_loss(pred, photo, kernels=kernels) + 0.2 * (1.0 - ssim(pred, photo, kernels=kernels))
        loss.backward()
        times.append(1000 * (time.perf_counter() - start))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="125x82,250x165", help="comma-separated WIDTHxHEIGHT")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    kernels = load_kernels()
    print(f"# torch {torch.__version__}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    for size in args.sizes.split(","):
        width, height = (int(v) for v in size.split("x"))
        render, photo = images(width, height)
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            step_ms(render, photo, 3, kernels)  # warm-up
            times = step_ms(render, photo, args.repeats, kernels)
            median = statistics.median(times)
            print(f"{width}x{height} threads {threads}: median {median:.3f} ms, min {min(times):.3f} ms")


if __name__ == "__main__":
    main()
