"""The Gaussian point-cloud model: parameters, initialisation and the SH-degree schedule.

Parameters are stored pre-activation, as in 3DGS and gsplat's ``simple_trainer``:
``means [N, 3]``, ``scales [N, 3]`` (log), ``quats [N, 4]`` (w, x, y, z; unnormalised),
``opacities [N]`` (logit), ``sh0 [N, 1, 3]`` and ``shN [N, (D+1)^2 - 1, 3]`` (D = ``sh_degree``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from gsrecon.cameras.paths import focus_point
from gsrecon.component import RunChecked
from gsrecon.config import per_device, run_steps
from gsrecon.data.scene import Scene
from gsrecon.errors import InputError
from gsrecon.params import PARAM_NAMES, check_params
from gsrecon.registry import MODEL_REGISTRY
from gsrecon.sh import MAX_SH_DEGREE, num_sh_bases, rgb_to_sh

INITS = ("auto", "sfm", "random", "ply")


@MODEL_REGISTRY.register("gaussians")
class GaussianModel(torch.nn.Module, RunChecked):
    """A set of 3D Gaussians held in ``self.params`` (a ParameterDict keyed by :data:`PARAM_NAMES`).

    Models registered in ``MODEL_REGISTRY`` provide ``from_scene(cfg, scene, seed)``, ``params``,
    ``num_gaussians`` and ``active_sh_degree(step)``, and may name in ``structural_keys`` the
    config keys that decide the parameters' shapes (a checkpoint resumes only if they match).
    """

    structural_keys = ("sh_degree",)

    @dataclass
    class Config:
        sh_degree: int = 3  # maximum SH degree (0..3)
        sh_degree_interval: int = run_steps(1000)  # the active degree grows by one every this many steps
        init: str = "auto"  # auto (sfm when the dataset has points, else random) | sfm | random | ply (init_path)
        init_path: str = ""  # .ply or KHR_gaussian_splatting .glb / .gltf for init: ply
        init_num_points: int = per_device(cpu=10_000, gpu=100_000)  # for init: random (BENCHMARKS.md: CPU)
        init_extent: float = 3.0  # random points: a cube of half-size init_extent × extent where the cameras look
        init_opacity: float = 0.1
        init_scale: float = 1.0  # multiplier on the initial scales (mean distance to the 3 nearest points)

        def __post_init__(self) -> None:
            if not 0 <= self.sh_degree <= MAX_SH_DEGREE:
                raise ValueError(f"model.sh_degree must be between 0 and {MAX_SH_DEGREE}, got {self.sh_degree}")
            if self.sh_degree_interval < 1:
                raise ValueError(f"model.sh_degree_interval must be >= 1, got {self.sh_degree_interval}")
            if self.init not in INITS:
                raise ValueError(f"model.init must be one of {', '.join(INITS)}; got '{self.init}'")
            if self.init == "ply" and not self.init_path:
                raise ValueError("model.init is 'ply' but model.init_path is empty; set it to a .ply or .glb file")

    def __init__(self, cfg: Config, params: dict[str, Tensor], start_sh_degree: int = 0, start: str = "") -> None:
        """``start_sh_degree``: the active SH degree at step 0 (Gaussians from a trained PLY start at its degree);
        ``start``: what the parameters were made from (``sfm``, ``random`` or ``ply``; said in the first log line)."""
        super().__init__()
        if not 0 <= start_sh_degree <= cfg.sh_degree:
            raise InputError(f"start_sh_degree={start_sh_degree} is not between 0 and model.sh_degree={cfg.sh_degree}")
        self.cfg = cfg
        self.start_sh_degree = start_sh_degree
        self.start = start
        self.params = torch.nn.ParameterDict({k: torch.nn.Parameter(params[k]) for k in PARAM_NAMES})

    @classmethod
    def from_scene(cls, cfg: Config, scene: Scene, seed: int = 0) -> GaussianModel:
        """Initialise from the scene's point cloud, random points in its bounds, or a PLY (``cfg.init``)."""
        generator = torch.Generator().manual_seed(seed)
        if cfg.init == "ply":
            from gsrecon.model.scene_file import load_gaussians

            params = load_gaussians(cfg.init_path)
            start = min(check_params(params), cfg.sh_degree)
            return cls(cfg, _with_sh_degree(params, cfg.sh_degree), start_sh_degree=start, start="ply")
        init = cfg.init if cfg.init != "auto" else ("sfm" if scene.points.shape[0] > 0 else "random")
        if init == "sfm":
            if scene.points.shape[0] == 0:
                raise InputError("model.init is 'sfm' but the dataset has no points; use model.init=random")
            points, colors = scene.points.float(), scene.colors.float()
        else:
            if cfg.init_num_points < 1:
                raise InputError(f"model.init_num_points must be >= 1, got {cfg.init_num_points}")
            center = random_start_center(scene)
            half = cfg.init_extent * scene.extent
            points = center + (torch.rand(cfg.init_num_points, 3, generator=generator) * 2 - 1) * half
            colors = torch.rand(cfg.init_num_points, 3, generator=generator)
        return cls(cfg, init_params(points, colors, cfg.sh_degree, cfg.init_opacity, cfg.init_scale), start=init)

    @property
    def num_gaussians(self) -> int:
        return int(self.params["means"].shape[0])

    def active_sh_degree(self, step: int) -> int:
        """SH degree in use at training ``step``: ``start_sh_degree``, one more every ``sh_degree_interval`` steps."""
        return min(self.start_sh_degree + step // self.cfg.sh_degree_interval, self.cfg.sh_degree)


def random_start_center(scene: Scene) -> Tensor:
    """Centre of the random starting cloud, [3]: the point the training cameras look at.

    That is the object of a forward-facing capture, where the cameras' mean position lies well in front
    of it; for captures whose optical axes are parallel (no such point) it is the mean camera position.
    """
    try:
        return focus_point(scene.train_cameras.viewmats).float()
    except ValueError:
        return scene.center


def init_params(points: Tensor, colors: Tensor, sh_degree: int, opacity: float, scale_mult: float) -> dict[str, Tensor]:
    """Pre-activation parameters for Gaussians at ``points`` [N, 3] with ``colors`` [N, 3] in [0, 1].

    Scales are isotropic: the mean distance to the 3 nearest neighbours; rotations are identity.
    """
    n = points.shape[0]
    dist = nearest_neighbor_distance(points, k=3).clamp_min(1e-7)  # [N]
    num_rest = num_sh_bases(sh_degree) - 1
    return {
        "means": points.clone(),
        "scales": torch.log(dist * scale_mult)[:, None].repeat(1, 3),
        "quats": torch.tensor([1.0, 0.0, 0.0, 0.0]).repeat(n, 1),
        "opacities": torch.logit(torch.full((n,), opacity)),
        "sh0": rgb_to_sh(colors)[:, None, :],
        "shN": torch.zeros(n, num_rest, 3),
    }


def nearest_neighbor_distance(points: Tensor, k: int = 3) -> Tensor:
    """Mean Euclidean distance of each point [N, 3] to its ``k`` nearest other points, [N]."""
    n = points.shape[0]
    if n < 2:
        return torch.ones(n)
    from scipy.spatial import cKDTree  # here: only a run initialised from points needs scipy (0.2 s of a start)

    k = min(k, n - 1)
    pts = points.detach().cpu().double().numpy()
    dist, _ = cKDTree(pts).query(pts, k=k + 1)  # the first neighbour is the point itself
    return torch.from_numpy(np.asarray(dist)[:, 1:].mean(axis=1)).float()


def _with_sh_degree(params: dict[str, Tensor], sh_degree: int) -> dict[str, Tensor]:
    """Pad or truncate ``shN`` to the configured SH degree."""
    num_rest = num_sh_bases(sh_degree) - 1
    shN = params["shN"]
    if shN.shape[1] >= num_rest:
        shN = shN[:, :num_rest]
    else:
        shN = torch.cat([shN, shN.new_zeros(shN.shape[0], num_rest - shN.shape[1], 3)], dim=1)
    return {**params, "shN": shN.contiguous()}
