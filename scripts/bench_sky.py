"""The sky module (``views: {sky: {name: environment}}``) measured: test PSNR, Gaussians in front of the sky, the
Gaussians' opacity over the sky and a depth picture, with and without it (issue 52, BENCHMARKS.md).

Each run is ``gsrecon train`` (one thread, the CPU seconds of the process recorded), the arms alternated per seed;
afterwards the final checkpoint's Gaussians are rendered alone (no environment) from the test views:

- ``sky_alpha`` / ``scene_alpha``: their mean accumulated opacity over the test views' sky pixels / the others
  (the sky of the synthetic street: where the scene's rays miss everything, from the generator; lund's: bright blue
  or white pixels connected to the top row, a colour rule checked by eye, :func:`lund_sky`);
- ``sky_gaussians``: Gaussians (opacity above 0.05) whose centre some training view sees on a sky pixel (nothing is
  there but sky: a floater painting it), the same masks on the training views; ``sky_gaussians_most``: those whose
  centre lies on the sky in most of the training views that see it (not a skyline's edge seen past in one view);
- ``sky_gaussians_inside``: those whose centre some training view sees at least :data:`INSIDE` pixels inside its sky
  (not on a skyline the sky mask's edge clips); ``sky_opacity``: the sum of the opacities of ``sky_gaussians``
  (a Gaussian half-faded counts half);
- ``far_gaussians``: Gaussians farther from every camera than twice the largest distance between two cameras (the
  cameras' region).

    python scripts/bench_sky.py --scene street --seeds 0 1 2 --steps 1000 --out bench_sky_street.jsonl
    python scripts/bench_sky.py --scene lund --seeds 0 1 2 --steps 1000 --out bench_sky_lund.jsonl --picture docs/x.png
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

SCENES = {
    "street": ["--config", "configs/street.yaml", "data.synthetic.sky=gradient"],
    "lund": ["--data", "/work/shared/data/lund", "data.factor=4"],
    "statuette": ["--config", "configs/statuette.yaml", "data.path=/work/shared/data/statuette_colmap"],
}
ENV = "views={sky: {name: environment}}"
INSIDE = 4  # px: how far inside a view's sky a centre lies to count in sky_gaussians_inside


def train(scene: str, seed: int, steps: int, env: bool, exp_dir: Path, extra: list[str]) -> float:
    """Run ``gsrecon train``; returns the CPU seconds (user + sys) it took."""
    args = [*SCENES[scene], f"exp_dir={exp_dir}", f"seed={seed}", f"max_steps={steps}", f"val_interval={steps}"]
    args += ["num_threads=1", "hooks.CheckPointHook.interval=100000", *([ENV] if env else []), *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cmd = ["nice", "-n", "5", sys.executable, "-m", "gsrecon", "train", "--overwrite", *args]
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def lund_sky(image: np.ndarray) -> np.ndarray:
    """[H, W] bool: lund's sky in ``image`` [H, W, 3] (floats in [0, 1]): blue pixels (blue above red by 0.08, above
    0.45) or bright grey ones (every channel above 0.78, a cloud), connected to the top row."""
    from scipy import ndimage

    r, b = image[..., 0], image[..., 2]
    blue = (b > r + 0.08) & (b > 0.45)
    cloud = (image.min(-1) > 0.78) & (image.max(-1) - image.min(-1) < 0.15)
    labels, _ = ndimage.label(blue | cloud)
    top = np.unique(labels[0][labels[0] > 0])
    return np.isin(labels, top)


def sky_masks(scene: str, pipeline, batches) -> list[np.ndarray]:
    """[H, W] bool sky mask of each one-view batch."""
    if scene == "street":
        from gsrecon.data.readers.synthetic import SyntheticConfig, render_view

        plain = SyntheticConfig(**{**pipeline.cfg.reader, "sky": "none", "alpha": True})
        views = [(b.cameras.viewmats[0].double().numpy(), b.cameras.Ks[0].double().numpy()) for b in batches]
        return [render_view(viewmat, K, plain)[..., 3] == 0 for viewmat, K in views]
    if scene == "lund":
        return [lund_sky(b.images[0].numpy()) for b in batches]
    return [np.zeros(b.images.shape[1:3], bool) for b in batches]


def analyse(scene: str, exp_dir: Path) -> tuple[dict, dict]:
    """The run's figures, and what the picture needs of its first test view."""
    from scipy import ndimage

    from gsrecon.cameras.lens import project_points
    from gsrecon.engine.build import build_datapipeline
    from gsrecon.engine.inference import batch_renderer, load_trained_scene, scene_run
    from gsrecon.logging.console import Logger
    from gsrecon.render.torch_renderer import TorchRenderer

    trained = load_trained_scene(exp_dir=str(exp_dir))
    pipeline = build_datapipeline(trained.cfg.data, torch.device("cpu"), trained.cfg.seed, trained.source)
    params = trained.params
    renderer = TorchRenderer(TorchRenderer.Config(far_plane=1e6))
    test, train_batches = list(pipeline.val_batches()), list(pipeline.train_batches())
    test_masks, train_masks = sky_masks(scene, pipeline, test), sky_masks(scene, pipeline, train_batches)
    alphas, scene_alphas, picture = [], [], {}
    with torch.no_grad():
        for batch, mask in zip(test, test_masks):
            out = renderer.render(params, batch.cameras, trained.sh_degree)
            alpha = out.alpha[0, ..., 0].numpy()
            if mask.any():
                alphas.append(float(alpha[mask].mean()))
            if not mask.all():
                scene_alphas.append(float(alpha[~mask].mean()))
            if not picture:
                run = scene_run(trained, "cpu", Logger())
                final = batch_renderer(trained, run.renderer, run.device, run.views)
                picture = {"alpha": alpha, "depth": out.depth[0, ..., 0].numpy(), "gt": batch.images[0].numpy()}
                picture["final"] = final(batch).image[0].numpy()  # as the run renders it: the sky where on
        opacity = torch.sigmoid(params["opacities"])
        means = params["means"]
        on_sky = torch.zeros(len(means), dtype=torch.bool)
        inside_sky = torch.zeros(len(means), dtype=torch.bool)
        sky_views, seen_views = torch.zeros(len(means)), torch.zeros(len(means))  # [N] each
        for batch, mask in zip(train_batches, train_masks):
            cams = batch.cameras
            model = cams.model if cams.model.coeffs is None else type(cams.model)(cams.model.kind, cams.model.coeffs[0])
            pixels, seen = project_points(means, cams.viewmats[0], cams.Ks[0], model)
            x, y = pixels[:, 0].floor().long(), pixels[:, 1].floor().long()
            inside = seen & (x >= 0) & (x < cams.width) & (y >= 0) & (y < cams.height)
            hit = torch.zeros_like(inside)
            hit[inside] = torch.from_numpy(mask)[y[inside], x[inside]]
            on_sky |= hit
            deep = torch.from_numpy(ndimage.binary_erosion(mask, iterations=INSIDE))  # [H, W]
            inside_sky[inside] |= deep[y[inside], x[inside]]
            sky_views += hit.float()
            seen_views += inside.float()
        centres = torch.stack([torch.linalg.inv(b.cameras.viewmats[0])[:3, 3] for b in train_batches])  # [F, 3]
        region = torch.cdist(centres, centres).max()
        far = torch.cdist(means, centres).min(dim=1).values > 2.0 * region
    metrics = json.loads((exp_dir / "metrics.json").read_text())
    figures = {
        "psnr": metrics["mean"]["psnr"],
        "num_gaussians": len(means),
        "sky_alpha": float(np.mean(alphas)) if alphas else None,
        "scene_alpha": float(np.mean(scene_alphas)),
        "sky_gaussians": int((on_sky & (opacity > 0.05)).sum()),
        "sky_gaussians_most": int(((sky_views > 0.5 * seen_views) & (opacity > 0.05)).sum()),
        "sky_gaussians_inside": int((inside_sky & (opacity > 0.05)).sum()),
        "sky_opacity": float(opacity[on_sky & (opacity > 0.05)].sum()),
        "far_gaussians": int(far.sum()),
    }
    return figures, picture


def depth_rgb(depth: np.ndarray, alpha: np.ndarray, near: float, far: float) -> np.ndarray:
    """[H, W, 3] uint8: the Gaussians' depth on a log scale from ``near`` (blue) to ``far`` (red), the far colour
    where their opacity leaves room (what lies behind them is at infinity: the sky or the background)."""
    from gsrecon.render.colormap import depth_to_rgb

    t = np.log(np.clip(depth, near, far) / near) / np.log(far / near)
    ramp = depth_to_rgb(np.concatenate([t, [[0.0] * t.shape[1], [1.0] * t.shape[1]]]))[:-2].astype(float)
    far_rgb = depth_to_rgb(np.array([[0.0, 1.0]]))[0, 1].astype(float)
    a = alpha[..., None]
    return np.round(ramp * a + far_rgb * (1.0 - a)).astype(np.uint8)


def save_picture(path: Path, off: dict, on: dict) -> None:
    """Photo | render without | with the sky module (its Gaussians alone have the opacity shown in the depths) ||
    depth without | with, on one row."""
    from PIL import Image

    near = 0.3
    far = float(np.percentile(off["depth"][off["alpha"] > 0.5], 99)) * 4.0
    tiles = [
        np.round(np.clip(off["gt"], 0, 1) * 255).astype(np.uint8),
        np.round(np.clip(off["final"], 0, 1) * 255).astype(np.uint8),
        np.round(np.clip(on["final"], 0, 1) * 255).astype(np.uint8),
        depth_rgb(off["depth"], off["alpha"], near, far),
        depth_rgb(on["depth"], on["alpha"], near, far),
    ]
    row = np.concatenate(tiles, axis=1)
    scale = max(1, 300 // row.shape[0])
    Image.fromarray(row).resize((row.shape[1] * scale, row.shape[0] * scale), Image.NEAREST).save(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scene", choices=sorted(SCENES), required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=Path, default=Path("/tmp/bench_sky"))
    parser.add_argument("--picture", type=Path, default=None)
    parser.add_argument("--arms", choices=["both", "env", "off"], default="both", help="env / off: only those runs")
    parser.add_argument("--tag", default="", help="appended to the run folders' names")
    parser.add_argument("extra", nargs="*", help="key=value overrides (after the sky's entry, so views.sky.* apply)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for seed in args.seeds:
        pictures = {}
        arms = (False, True) if seed % 2 == 0 else (True, False)  # A/B, then B/A
        for env in arms if args.arms == "both" else (args.arms == "env",):
            exp_dir = args.runs / f"{args.scene}_s{seed}_{'env' if env else 'off'}_{args.steps}{args.tag}"
            load = open("/proc/loadavg").read().split()[0]
            cpu = train(args.scene, seed, args.steps, env, exp_dir, args.extra)
            figures, picture = analyse(args.scene, exp_dir)
            row = {"scene": args.scene, "seed": seed, "steps": args.steps, "env": env, "extra": args.extra}
            row["cpu_s"] = round(cpu, 1)
            row |= {"load": float(load), "threads": 1, **figures}
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
            if args.picture is not None and seed == args.seeds[0]:
                pictures[env] = picture
        if len(pictures) == 2:
            save_picture(args.picture, pictures[False], pictures[True])


if __name__ == "__main__":
    main()
