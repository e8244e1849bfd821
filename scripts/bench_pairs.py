"""Count the `cpu` renderer's tile-Gaussian pairs against the tiles of 3.33-sigma and of opacity-aware boxes, and
the tile rows of those pairs that the 1/255 ellipse reaches, for bench_render's random scenes or a trained run's
first training views (16-px tiles). Prints a markdown table.

    python scripts/bench_pairs.py
    python scripts/bench_pairs.py --exp-dir outputs/statuette --views 4
"""

from __future__ import annotations

import argparse
import math

import torch
from bench_render import make_scene
from torch import Tensor

from gsrecon.cameras import Cameras
from gsrecon.engine.build import build_datapipeline
from gsrecon.engine.inference import load_trained_scene
from gsrecon.kernels.build import load_kernels
from gsrecon.render.base import RendererConfig
from gsrecon.render.cpu.functions import project_pinhole
from gsrecon.render.torch_renderer import ALPHA_MIN, BBOX_SIGMAS

TILE = 16
SIZES = [(64, 48, 5_000), (125, 82, 20_000), (250, 165, 200_000)]
COLUMNS = ("tiles of 3.33 sigma boxes", "tiles of opacity-aware boxes", "pairs", "rows of the pairs", "rows reached")


def _box_tiles(centres: Tensor, radii: Tensor, tiles_x: int, tiles_y: int) -> int:
    """Tiles overlapped by the boxes ``centres`` +- ``radii`` [V, 2] each."""
    lo = torch.floor((centres - radii) / TILE)
    hi = torch.ceil((centres + radii) / TILE)
    limit = torch.tensor([tiles_x, tiles_y], dtype=centres.dtype)
    return int((torch.minimum(hi, limit) - lo.clamp_min(0)).clamp_min(0).prod(-1).sum())


def count(params: dict[str, Tensor], cameras: Cameras, sh_degree: int) -> list[int]:
    """The COLUMNS' counts over ``cameras``, one at a time."""
    totals = [0] * len(COLUMNS)
    w, h = cameras.width, cameras.height
    tiles_x, tiles_y = -(-w // TILE), -(-h // TILE)
    for c in range(len(cameras)):
        with torch.no_grad():
            p = project_pinhole(
                params["means"], params["quats"], params["scales"], params["opacities"], params["sh0"],
                params["shN"], sh_degree, cameras[c : c + 1], RendererConfig(),
            )  # fmt: skip
        splats = {k: getattr(p, k).contiguous() for k in ("means2d", "conics", "log_opacities", "colors", "depths")}
        out = load_kernels().rasterize_forward(
            **splats, radii=p.radii, width=w, height=h, tile_size=TILE, alpha_max=0.99, median_depth=False
        )
        shown = (p.radii[0] > 0).any(-1)  # [N]
        a, b, cc = p.conics[0].unbind(-1)  # [N] each
        det = a * cc - b * b
        wide = torch.ceil(BBOX_SIGMAS * torch.stack([cc / det, a / det], -1).sqrt())  # [N, 2]
        centres = p.means2d[0][shown]
        totals[0] += _box_tiles(centres, wide[shown], tiles_x, tiles_y)
        totals[1] += _box_tiles(centres, p.radii[0][shown].float(), tiles_x, tiles_y)
        # The pairs' tiles and the rows of their boxes there, as rasterize.cpp's TileGaussians.load takes them.
        offsets, g = out["offsets"], out["ids"].long()
        tile = torch.repeat_interleave(torch.arange(len(offsets) - 1), offsets[1:] - offsets[:-1])
        totals[2] += len(g)
        base_x, base_y = (tile % tiles_x) * TILE, (tile // tiles_x) * TILE
        mx, my = p.means2d[0, g].unbind(-1)
        rx, ry = p.radii[0, g].float().unbind(-1)
        x0 = (torch.ceil(mx - rx - 0.5) - base_x).clamp_min(0)
        x1 = (torch.floor(mx + rx - 0.5) + 1 - base_x).clamp_max(TILE)
        y0 = (torch.ceil(my - ry - 0.5) - base_y).clamp_min(0)
        y1 = (torch.floor(my + ry - 0.5) + 1 - base_y).clamp_max(TILE)
        sigma_max = p.log_opacities[0, g] - math.log(ALPHA_MIN)
        for row in range(TILE):
            in_box = (row >= y0) & (row < y1)
            dy = base_y + row + 0.5 - my
            dx = torch.minimum(torch.maximum(-b[g] * dy / a[g], base_x + x0 + 0.5 - mx), base_x + x1 - 0.5 - mx)
            sigma = 0.5 * (a[g] * dx * dx + cc[g] * dy * dy) + b[g] * dx * dy  # least over the row's pixel centres
            totals[3] += int(in_box.sum())
            totals[4] += int((in_box & (sigma <= sigma_max)).sum())
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exp-dir", help="a trained run: count over its first training views")
    parser.add_argument("--views", type=int, default=4, help="training views (with --exp-dir)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| scene | " + " | ".join(COLUMNS) + " |\n|---|" + "---:|" * len(COLUMNS))
    if args.exp_dir:
        scene = load_trained_scene(exp_dir=args.exp_dir)
        pipeline = build_datapipeline(scene.cfg.data, torch.device("cpu"), scene.cfg.seed, scene.source)
        totals = [0] * len(COLUMNS)
        for step in range(args.views):
            counts = count(scene.params, pipeline.next_train(step).cameras, scene.sh_degree)
            totals = [t + c for t, c in zip(totals, counts)]
        rows = [(f"{args.exp_dir}, {len(scene.params['means'])} Gaussians, {args.views} views", totals)]
    else:
        rows = []
        for w, h, n in SIZES:
            params, viewmats, K = make_scene(n, w, h, torch.device("cpu"))
            rows.append((f"{w}x{h}, {n}", count(params, Cameras(viewmats, K, w, h), 3)))
    for name, counts in rows:
        print(f"| {name} | " + " | ".join(str(c) for c in counts) + " |")


if __name__ == "__main__":
    main()
