"""The rules between two components of a resolved run config, each refused before anything is built with one
ConfigError naming both keys: what gsplat cannot do through a fisheye lens (:func:`check_rules`), and the strategy's
``absgrad`` deciding the renderer's (:func:`with_strategy_absgrad`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gsrecon.config import ConfigError
from gsrecon.model.views.base import VIEW_SECTIONS, view_entries
from gsrecon.registry import EXPORT_REGISTRY, STRATEGY_REGISTRY, VIEW_REGISTRY


def check_rules(resolved: dict[str, Any], source: str, written: Callable[[str], str]) -> None:
    """Refuse a resolved run config that breaks a rule between two of its components, before anything is built: one
    ConfigError naming both keys (the strategy's ``absgrad`` and the renderer: :func:`with_strategy_absgrad`).

    gsplat renders a fisheye lens (``data.fisheye: lens``) through its unscented transform, which has no packed
    mode, no median depth, and no gradients of the Gaussians' screen-space centres or of the camera poses. A
    per-view module is named by the key its config wrote it under (``written(key)``).
    """
    if resolved["renderer"]["name"] != "gsplat" or resolved["data"]["fisheye"] != "lens":
        return
    lens = "gsplat renders a fisheye lens (data.fisheye: lens) through its unscented transform, which has"
    instead = "data.fisheye=undistort or renderer.name=torch"
    for key, what in (("packed", "no packed mode"), ("median_depth", "no median depth")):
        if resolved["renderer"].get(key):
            raise ConfigError(f"{source}: key 'renderer.{key}': {lens} {what}: set renderer.{key}=false, {instead}")
    strategy = resolved["strategy"]["name"]
    if STRATEGY_REGISTRY.get(strategy).screen_gradients:
        raise ConfigError(
            f"{source}: key 'strategy.name': '{strategy}' densifies from the screen-space gradients of the Gaussians' "
            f"centres; {lens} none (renderer.name: gsplat): use strategy.name=mcmc, {instead}"
        )
    for key, entry in (resolved.get("hooks") or {}).items():
        name = entry.get("name", key) if entry is not None else None
        fmt = entry.get("format") if name == "ExportHook" else None
        if fmt in EXPORT_REGISTRY and "render" in EXPORT_REGISTRY.get(fmt).needs:
            raise ConfigError(
                f"{source}: key 'hooks.{key}.format': '{fmt}' is made from renders with the median depth; {lens} "
                f"none (renderer.name: gsplat): use hooks.{key}.format=ply, {instead}"
            )
    for key, entry in view_entries(resolved).items():
        if VIEW_REGISTRY.get(entry["name"]).moves_cameras:
            where = written(key)
            off = f"{where}.name=none" if key in VIEW_SECTIONS else f"{where}=null"
            raise ConfigError(
                f"{source}: key '{where}': needs gradients of the camera poses, which gsplat does not give through "
                f"a fisheye lens (data.fisheye: lens): use data.fisheye=undistort, renderer.name=torch or {off}"
            )


def with_strategy_absgrad(
    renderer: dict[str, Any], strategy: dict[str, Any], written: dict[str, Any], source: str
) -> dict[str, Any]:
    """The resolved ``renderer`` entry computing the absolute screen-space gradients (AbsGS) exactly when the
    resolved ``strategy`` entry's ``absgrad`` reads them: the strategy's option is the one place that decides.

    ``written`` is the renderer entry as the config wrote it: an ``absgrad`` there that the strategy contradicts,
    or a strategy asking for gradients a renderer without that option cannot give, is a ConfigError.
    """
    absgrad = bool(strategy.get("absgrad", False))
    if "absgrad" in written and written["absgrad"] != absgrad:
        raise ConfigError(
            f"{source}: key 'renderer.absgrad': follows strategy.absgrad (the strategy reads the gradients; "
            f"{str(absgrad).lower()} here); remove it"
        )
    if "absgrad" in renderer:
        return {**renderer, "absgrad": absgrad}
    if absgrad:
        raise ConfigError(
            f"{source}: key 'strategy.absgrad': renderer '{renderer['name']}' gives no absolute screen-space "
            f"gradients; use renderer.name=gsplat (CUDA) or cpu, or strategy.absgrad=false"
        )
    return renderer
