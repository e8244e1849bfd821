"""Mesh quality: the mesh export against the synthetic scene's analytic surfaces and a capture's SfM points.

    nice -n 5 python scripts/bench_mesh.py --out /tmp/mesh_syn --seeds 0,1,2 \\
        --scene "synthetic=configs/synthetic.yaml" \\
        --variant "plain=" --variant "flatten=loss.flatten={}" --variant "surface=loss.flatten={} loss.depth_normal={}"
    nice -n 5 python scripts/bench_mesh.py --out /tmp/mesh_sta --seeds 0,1,2 \\
        --scene "statuette=configs/statuette.yaml data.path=../shared/data/statuette_colmap" --variant "plain=" ...
    nice -n 5 python scripts/bench_mesh.py --out /tmp/mesh_mem --memory 1000000

Each (scene, variant, seed) trains with ``bench_quality.run`` (one thread, only a recorder hook; test PSNR at the
end), then exports the mesh twice, fusing the median and the expected depth (``gsrecon export --format mesh``
defaults otherwise), and scores each mesh:

- on the synthetic scene, against its analytic surfaces (ground disc, spheres, cube, pillar): accuracy (mean
  distance from 200k points sampled on the mesh to the surfaces), completeness (mean distance from 50k points on
  the surfaces the cameras see to the mesh), Chamfer distance (their mean), also in % of the scene's size (the
  ground disc's diameter, 6 m), and normal consistency (mean |cos| between the mesh's and the surface's normals);
- on a capture, the distance from its SfM points to the mesh (median, mean, and the share within 1 % of the size
  of the SfM points' bounding box).

A row is appended to ``<out>/runs.csv`` as each run ends (runs already there are skipped); the trained Gaussians
stay in ``<out>/<scene>/<variant>/<seed>/params.pt``. ``--memory N`` instead
exports a mesh of N random Gaussians (`bench_memory.random_params`) through ``gsrecon export`` on the synthetic
scene's cameras, in a subprocess, and prints its wall time and peak RSS.
"""

from __future__ import annotations

import argparse
import csv
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.spatial import cKDTree

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_memory import measure, random_params
from bench_quality import load_average, run

from gsrecon.data.readers import synthetic
from gsrecon.export import ExportContext, export_gaussians
from gsrecon.model.ply import save_ply
from gsrecon.registry import RENDERER_REGISTRY

ROOT = Path(__file__).resolve().parents[1]
SYNTHETIC_SIZE = 6.0  # m, the ground disc's diameter
FIELDS = (
    "scene", "variant", "seed", "depth", "psnr", "gaussians", "vertices", "accuracy", "completeness", "chamfer",
    "chamfer_pct", "normal_consistency", "sfm_median", "sfm_mean", "sfm_within_1pct", "export_seconds", "load1",
)  # fmt: skip


def mesh_samples(path: Path, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` points area-uniformly on the mesh at ``path`` [P, 3] and their faces' normals [P, 3]."""
    import trimesh

    mesh = trimesh.load(path, force="mesh", process=False)
    points, faces = trimesh.sample.sample_surface(mesh, count, seed=0)
    return np.asarray(points), np.asarray(mesh.face_normals)[faces]


def synthetic_scores(path: Path) -> dict[str, float]:
    """Accuracy, completeness, Chamfer and normal consistency against the synthetic scene's surfaces."""
    points, normals = mesh_samples(path, 200_000)
    primitives = synthetic._primitives(synthetic.SyntheticConfig())
    distances = np.stack([prim.distance(points) for prim in primitives])  # [5, P]
    nearest = distances.argmin(0)
    true_normals = np.zeros_like(points)
    for i, prim in enumerate(primitives):
        true_normals[nearest == i] = prim.normal(points[nearest == i])
    true_normals /= np.linalg.norm(true_normals, axis=-1, keepdims=True)
    truth = synthetic.load_synthetic(synthetic.SyntheticConfig(num_points=50_000, point_noise=0.0)).points.numpy()
    completeness = cKDTree(points).query(truth)[0].mean()
    accuracy = distances.min(0).mean()
    chamfer = (accuracy + completeness) / 2
    return {
        "accuracy": accuracy,
        "completeness": completeness,
        "chamfer": chamfer,
        "chamfer_pct": 100 * chamfer / SYNTHETIC_SIZE,
        "normal_consistency": np.abs((normals * true_normals).sum(-1)).mean(),
    }


def sfm_scores(path: Path, sfm_points: np.ndarray) -> dict[str, float]:
    """Distances from SfM points to the mesh (nearest of 500k points on it)."""
    points, _ = mesh_samples(path, 500_000)
    distance = cKDTree(points).query(sfm_points)[0]
    size = float((np.percentile(sfm_points, 99, 0) - np.percentile(sfm_points, 1, 0)).max())
    return {
        "sfm_median": float(np.median(distance)),
        "sfm_mean": float(distance.mean()),
        "sfm_within_1pct": float((distance <= 0.01 * size).mean()),
    }


def export_meshes(trainer, out: Path) -> dict[str, tuple[Path, float]]:
    """The trained scene's mesh from the median and from the expected depth: {depth: (path, seconds)}."""
    renderer = RENDERER_REGISTRY.build({**trainer.resolved_config["renderer"], "median_depth": True})
    params, sh_degree = trainer.model.params, trainer.model.active_sh_degree(trainer.step)

    @torch.no_grad()
    def render(batch):
        return renderer.render_batch(params, batch, sh_degree)

    context = ExportContext(train_batches=trainer.datapipeline.train_batches, render=render)
    meshes = {}
    for depth in ("median", "expected"):
        start = time.perf_counter()
        path = export_gaussians(params, out / f"{depth}.ply", "mesh", context=context, options={"depth": depth})
        meshes[depth] = (path, time.perf_counter() - start)
    return meshes


def read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return [
            {k: (v if k in ("scene", "variant", "depth") else float(v or "nan")) for k, v in row.items()}
            for row in csv.DictReader(f)
        ]


def append_row(path: Path, row: dict) -> None:
    new = not path.is_file()
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            writer.writeheader()
        writer.writerow({k: row.get(k, "") for k in FIELDS})


def summary(rows: list[dict]) -> str:
    """Mean ± spread (half the range) over seeds, per scene, variant and depth."""
    columns = ("psnr", "chamfer", "chamfer_pct", "normal_consistency", "sfm_median", "sfm_within_1pct")
    lines = ["| scene | variant | depth | seeds | " + " | ".join(columns) + " | Gaussians | export s |"]
    lines.append("|---|---|---|---:|" + "---:|" * (len(columns) + 2))
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["scene"], row["variant"], row["depth"]), []).append(row)
    for (scene, variant, depth), group in groups.items():
        cells = []
        for column in columns:
            values = [r[column] for r in group if not np.isnan(r[column])]
            spread = (max(values) - min(values)) / 2 if values else 0.0
            cells.append(f"{statistics.mean(values):.4g} ± {spread:.2g}" if values else "-")
        gaussians = statistics.mean(r["gaussians"] for r in group)
        seconds = statistics.mean(r["export_seconds"] for r in group)
        lines.append(f"| {scene} | {variant} | {depth} | {len(group)} | " + " | ".join(cells)
                     + f" | {gaussians:.0f} | {seconds:.1f} |")  # fmt: skip
    return "\n".join(lines)


def memory(n: int, out: Path) -> None:
    """Export a mesh of ``n`` random Gaussians on the synthetic scene's cameras in a subprocess: time, peak RSS."""
    out.mkdir(parents=True, exist_ok=True)
    ply = out / f"random_{n}.ply"
    save_ply(ply, random_params(n, 3))
    cmd = [
        sys.executable, "-m", "gsrecon", "export", "--ply", str(ply), "--config", "configs/synthetic.yaml",
        "--format", "mesh", "--out", str(out / "mesh.ply"), "--device", "cpu", "num_threads=1", "renderer.name=torch",
        "model.sh_degree=3",
    ]  # fmt: skip
    wall, peak, code, last = measure(cmd)
    print(f"| {n} Gaussians | {wall:.1f} s | {peak:.2f} GB | exit {code} | load {load_average()[0]:.1f} | {last} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--scene", action="append", default=[], help="LABEL=CONFIG [key=value ...]")
    parser.add_argument("--variant", action="append", default=[], help="LABEL=[key=value ...]")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--memory", type=int, help="instead: export a mesh of this many random Gaussians")
    args = parser.parse_args()
    if args.memory:
        memory(args.memory, args.out)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    runs = args.out / "runs.csv"
    done = {(r["scene"], r["variant"], int(r["seed"])) for r in read_rows(runs)}
    for scene_spec in args.scene:
        scene, _, words = scene_spec.partition("=")
        config, *scene_overrides = shlex.split(words)
        for variant_spec in args.variant or ["plain="]:
            variant, _, variant_words = variant_spec.partition("=")
            for seed in (int(s) for s in args.seeds.split(",")):
                if (scene, variant, seed) in done:
                    continue
                work = args.out / scene / variant / str(seed)
                overrides = [*scene_overrides, *shlex.split(variant_words), f"seed={seed}", "device=cpu"]
                max_steps = int(next((o.split("=")[1] for o in overrides if o.startswith("max_steps=")), 0)) or None
                recorder = {"steps": [max_steps or _config_steps(config, overrides)], "seconds": [], "clock": "cpu"}
                trainer = run(config, overrides, recorder, args.threads, work)
                psnr = _psnr(trainer)
                torch.save({k: v.detach().cpu() for k, v in trainer.model.params.items()}, work / "params.pt")
                for depth, (path, seconds) in export_meshes(trainer, work).items():
                    if trainer.datapipeline.cfg.dataset == "synthetic":
                        scores = synthetic_scores(path)
                    else:
                        scores = sfm_scores(path, trainer.datapipeline.scene.points.numpy())
                    row = {"scene": scene, "variant": variant, "seed": seed, "depth": depth, "psnr": psnr,
                           "gaussians": trainer.model.num_gaussians, "vertices": _vertices(path),
                           "export_seconds": seconds, "load1": load_average()[0], **scores}  # fmt: skip
                    append_row(runs, row)
                    print({k: (round(v, 5) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    print(summary(read_rows(runs)))


def _config_steps(config: str, overrides: list[str]) -> int:
    from gsrecon.engine.resolve import load_run_config

    return load_run_config(config, overrides)[0].max_steps


def _psnr(trainer) -> float:
    return float(trainer.hooks["QualityRecorderHook"].rows[-1]["psnr"])


def _vertices(path: Path) -> int:
    from plyfile import PlyData

    return PlyData.read(str(path))["vertex"].count


if __name__ == "__main__":
    main()
