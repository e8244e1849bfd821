"""The ``lod`` export format (``gsrecon export --format lod``, ``ExportHook``): a run's levels of detail as a PlayCanvas
streamed SOG site, the levels built first where the run has none."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from gsrecon.data.blocks import cell_index, plan_cells
from gsrecon.data.pipeline import fixed_background
from gsrecon.engine.inference import TrainedScene
from gsrecon.engine.resolve import resolve_views_config
from gsrecon.errors import InputError
from gsrecon.export.base import ExportContext, ExportFormat
from gsrecon.export.lod.site import META_NAME, CameraRegion, CellOf, LodSiteConfig, check_site_path, write_lod_site
from gsrecon.lod.levels import LodConfig, build_levels, built_levels, camera_region, level_loaders
from gsrecon.logging.console import Logger
from gsrecon.model.views.environment import stored_sky
from gsrecon.partition.folder import PLAN_FILE, read_plan
from gsrecon.registry import EXPORT_REGISTRY
from gsrecon.render.environment import far_sphere_gaussians


@EXPORT_REGISTRY.register("lod")
class LodFormat(ExportFormat):
    """A run's levels of detail (gsrecon lod, built first where it has none) as PlayCanvas streamed SOG (--exp-dir)."""

    suffixes = (META_NAME,)
    needs = ("run",)
    Config = LodSiteConfig

    def __init__(self, cfg: LodSiteConfig | None = None) -> None:
        self.cfg = cfg if cfg is not None else LodSiteConfig()

    @classmethod
    def check_path(cls, path: Path) -> None:
        if path.name != META_NAME:
            raise ValueError(f"the lod format writes a site folder's {META_NAME}: the path must end in it, got {path}")

    def write(self, path: Path, params: Mapping[str, Tensor], *, antialiased: bool, context: ExportContext) -> None:
        run = context.run
        assert run is not None  # export_gaussians gives what `needs` names
        export_lod(run.scene, run.folder, path, self.cfg, context.overwrite, run.device, run.logger, run.held)


def export_lod(
    scene: TrainedScene,
    exp_dir: str | Path,
    out: str | Path,
    cfg: LodSiteConfig,
    overwrite: bool = False,
    device: str = "auto",
    logger: Logger | None = None,
    held: bool = False,
) -> Path:
    """Write the levels of the run in ``exp_dir`` (``scene``: its trained scene, level 0) as the site whose
    ``lod-meta.json`` is ``out``, with the site options ``cfg``; a run without levels gets them first
    (:class:`LodConfig`'s defaults, the run's lock taken unless the caller ``held`` it), saying so. Returns ``out``.

    Raises InputError for an ``out`` the site may not be written to (:func:`check_site_path`), before building
    anything."""
    logger = logger or Logger()
    out = check_site_path(out, overwrite)
    count = built_levels(exp_dir, scene.step)
    if count == 0:
        lod = LodConfig()
        logger.info(
            f"{exp_dir} has no levels of detail yet: building {lod.levels} first ({lod.steps} steps each; "
            f"gsrecon lod --exp-dir {exp_dir} builds them with other settings)"
        )
        outcome = build_levels(scene, exp_dir, lod, device, logger, held)
        if outcome.stop_reason:
            raise InputError(f"{outcome.stop_reason}; nothing was exported")
        count = len(outcome.records)
    loaders = level_loaders(scene, exp_dir, count)
    region = camera_region(exp_dir)
    sky = sky_gaussians(scene, region, 2.0 * max(cfg.env_threshold, 1.0), logger)
    write_lod_site(
        out,
        loaders,
        cfg,
        region,
        cells=block_cells(exp_dir),
        sky=sky,
        antialiased=scene.antialiased,
        overwrite=overwrite,
    )
    return out


def sky_gaussians(
    scene: TrainedScene, region: CameraRegion | None, radii: float, logger: Logger
) -> dict[str, Tensor] | None:
    """The run's trained environment (the ``environment`` per-view module, the sky, read from its checkpoint) as
    Gaussians on a sphere ``radii`` camera radii about the cameras' centre, for the site's environment; None where
    the run has none."""
    sky = stored_sky(resolve_views_config(scene.cfg, scene.source), scene.views, scene.source)
    if sky is None or region is None:
        return None
    if not math.isfinite(radii):
        logger.warning("lod.env_threshold=inf: the site has no environment, so the trained sky is left out of it")
        return None
    radius = radii * max(region.radius, 1e-3)
    colors = sky.baked(fixed_background(scene.cfg.data))  # [6, R, R, 3]
    gaussians = far_sphere_gaussians(colors, torch.tensor(region.center), radius)
    logger.info(f"the trained sky joins the environment as {len(gaussians['means'])} Gaussians {radius:.3g} away")
    return gaussians


def block_cells(exp_dir: str | Path) -> CellOf | None:
    """The cell of each centre among the blocks' cells of the block run in ``exp_dir`` (from its plan,
    ``partition.json``); None for a run that is not a block run."""
    if not (Path(exp_dir) / PLAN_FILE).is_file():
        return None
    ground, cells = plan_cells(read_plan(exp_dir))
    return lambda centres: cell_index(ground, cells, centres)
