"""Peak memory of writing a streamed SOG site (``gsrecon export --format lod``'s writer) for a synthetic scene.

    python scripts/bench_lod_memory.py --gaussians 1000000 --sh-degree 3 --out /tmp/lod_mem

Makes N random Gaussians (level 0) and its levels 1 and 2 (halved by moment matching), saves each as a torch file,
then, in a fresh process, writes the site with each level loaded from its file when the writer asks for it, and
prints the scene's size (level 0's float32 parameters), the process's resident memory before writing (imports
done) and its peak while writing, and the CPU seconds of the write.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from gsrecon.export.lod.merge import halve
from gsrecon.export.lod.site import CameraRegion, LodSiteConfig, write_lod_site
from gsrecon.heap import unmap_large_blocks
from gsrecon.sh import num_sh_bases


def _status_mib(field: str) -> float:
    """A memory ``field`` of /proc/self/status (VmRSS: resident now; VmHWM: its peak), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def make_levels(n: int, degree: int, folder: Path) -> int:
    """Write levels 0, 1, 2 of N random Gaussians in clusters to ``folder``; return level 0's size in bytes."""
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(max(1, n // 1000), 3, generator=g) * 20
    params = {
        "means": centres[torch.randint(len(centres), (n,), generator=g)] + torch.randn(n, 3, generator=g),
        "scales": torch.rand(n, 3, generator=g) * 2 - 5,
        "quats": torch.randn(n, 4, generator=g),
        "opacities": torch.randn(n, generator=g),
        "sh0": torch.randn(n, 1, 3, generator=g),
        "shN": torch.randn(n, num_sh_bases(degree) - 1, 3, generator=g) * 0.1,
    }
    size = sum(v.numel() * v.element_size() for v in params.values())
    folder.mkdir(parents=True, exist_ok=True)
    for level in range(3):
        torch.save(params, folder / f"level_{level}.pt")
        if level < 2:
            params = halve(params)
    return size


def write_site(folder: Path, chunk_count: int) -> dict[str, float]:
    """Write the site of the levels in ``folder`` (this process's memory is what is measured)."""
    levels = [lambda k=k: torch.load(folder / f"level_{k}.pt", mmap=True) for k in range(3)]
    before = _status_mib("VmRSS")
    start = time.process_time()
    cfg, region = LodSiteConfig(chunk_count=chunk_count), CameraRegion((0, 0, 0), 30.0)
    meta = write_lod_site(folder / "site" / "lod-meta.json", levels, cfg, region, overwrite=True)
    # Not ru_maxrss: it keeps the parent's peak across the fork and exec that started this process.
    peak = _status_mib("VmHWM")
    return {"rss_before_mib": before, "peak_rss_mib": peak, "cpu_seconds": time.process_time() - start,
            "counts": meta["counts"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gaussians", type=int, default=1_000_000)
    parser.add_argument("--sh-degree", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--chunk-count", type=int, default=LodSiteConfig.chunk_count, help="lod.chunk_count")
    parser.add_argument("--write-only", action="store_true", help=argparse.SUPPRESS)  # the measured child process
    args = parser.parse_args()
    if args.write_only:
        unmap_large_blocks()  # as the gsrecon command does (gsrecon.heap)
        print(json.dumps(write_site(args.out, args.chunk_count)))
        return
    size = make_levels(args.gaussians, args.sh_degree, args.out)
    command = [sys.executable, __file__, "--out", str(args.out), "--chunk-count", str(args.chunk_count), "--write-only"]
    child = subprocess.run(command, capture_output=True, text=True, check=True)
    result = json.loads(child.stdout.strip().splitlines()[-1])
    scene_mib = size / 2**20
    grown = result["peak_rss_mib"] - result["rss_before_mib"]
    print(json.dumps({"gaussians": args.gaussians, "sh_degree": args.sh_degree, "chunk_count": args.chunk_count,
                      "scene_mib": scene_mib, **result,
                      "peak_over_scene": grown / scene_mib}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
