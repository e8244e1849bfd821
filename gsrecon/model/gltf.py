"""Gaussian scenes as glTF ``KHR_gaussian_splatting`` splats (the glTF container itself: `gsrecon.io.gltf`).

A file holds one ``POINTS`` primitive with the float attributes ``POSITION`` (with its min and max),
``KHR_gaussian_splatting:ROTATION`` (unit quaternion x, y, z, w), ``:SCALE`` (``exp`` of gsrecon's log scales),
``:OPACITY`` (the sigmoid of its logits), ``:SH_DEGREE_l_COEF_n`` (RGB, every coefficient of degrees 0..D), and
``COLOR_0`` (linear RGB of the degree-0 colour and the opacity, normalised bytes) for viewers that draw points;
the extension object says ``kernel: "ellipse"``, ``colorSpace: "srgb_rec709_display"`` and the defaults of the
optional ``sortingMethod`` and ``projection``.

Axes: the file holds the scene turned 180 degrees about z, ``(x, y, z) -> (-x, -y, z)``, the turn PlayCanvas's
splat-transform applies between a 3DGS PLY and its glb: a capture in OpenCV axes (y down, z forward, as COLMAP's
and gsrecon's) stands upright in glTF's y-up frame. The turn moves positions, rotations (``q -> r q``, with ``r``
the half-turn) and SH coefficients (those of odd order m change sign); each is exact in float32, and the
reader turns the scene back.

The standard attributes cannot give back gsrecon's parameters bit for bit (the quaternion is normalised and
``exp``, the sigmoid and their inverses round in float32), so a file written with ``exact`` also holds them as
written by training, in the application-specific attributes ``_GSRECON_ROTATION`` (turned, not normalised),
``_GSRECON_LOG_SCALE`` and ``_GSRECON_LOGIT_OPACITY`` (32 bytes per Gaussian); the reader uses them for each
Gaussian whose standard attributes still match them, and the standard attributes otherwise. The render mode is
recorded as ``asset.extras.antialiased``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor

from gsrecon.errors import InputError
from gsrecon.io.gltf import Attribute, PointPrimitive, describe, read_points, write_points
from gsrecon.model.ply import cpu_params
from gsrecon.params import check_params
from gsrecon.sh import MAX_SH_DEGREE, SH_C0, axis_flip_sh_signs

EXTENSION = "KHR_gaussian_splatting"
KERNEL, COLOR_SPACE = "ellipse", "srgb_rec709_display"
_DEFAULTS = {"sortingMethod": "cameraDistance", "projection": "perspective"}  # optional; written as PlayCanvas does
TURN = torch.tensor([-1.0, -1.0, 1.0])  # 180 degrees about z between gsrecon's axes and the file's; its own inverse
EXACT = {"quats": "_GSRECON_ROTATION", "scales": "_GSRECON_LOG_SCALE", "opacities": "_GSRECON_LOGIT_OPACITY"}
_FLOAT = {5126: False}  # component type float, not normalised
_ROTATION_TYPES = {5126: False, 5120: True, 5122: True}  # float, normalised signed byte or short
_SCALE_TYPES = {5126: False, 5121: None, 5123: None}  # float, unsigned byte or short (normalised or not)
_OPACITY_TYPES = {5126: False, 5121: True, 5123: True}  # float, normalised unsigned byte or short
_TINY = float(np.finfo(np.float32).tiny)  # a scale or opacity of 0 is read as this, so that its log is finite
_BELOW_ONE = 1.0 - 2.0**-24  # an opacity of 1 is read as this, the float32 just below it


def attribute(name: str) -> str:
    """The semantic of the extension's attribute ``name``, e.g. ``KHR_gaussian_splatting:SCALE``."""
    return f"{EXTENSION}:{name}"


def sh_semantics(degree: int) -> list[str]:
    """The semantics of degree ``degree``'s SH coefficients, ``SH_DEGREE_{degree}_COEF_0 .. 2 degree``."""
    return [attribute(f"SH_DEGREE_{degree}_COEF_{n}") for n in range(2 * degree + 1)]


def to_file_quats(quats: Tensor) -> Tensor:
    """gsrecon quaternions (w, x, y, z) [M, 4] turned into the file's axes, in glTF's order (x, y, z, w)."""
    w, x, y, z = quats.unbind(-1)
    return torch.stack([-y, x, w, -z], dim=-1)  # the half-turn r = (0, 0, 0, 1) times q


def from_file_quats(quats: Tensor) -> Tensor:
    """The inverse of :func:`to_file_quats`."""
    x, y, z, w = quats.unbind(-1)
    return torch.stack([z, y, -x, -w], dim=-1)


def save_gltf(
    path: str | os.PathLike, params: Mapping[str, Tensor], *, antialiased: bool = False, exact: bool = True
) -> None:
    """Write Gaussians as ``KHR_gaussian_splatting`` (layout and axes in the module docstring), ``.glb`` or
    ``.gltf`` with a ``.bin`` beside it, atomically.

    Raises InputError, before writing, naming ``path`` and the first Gaussian the file cannot hold: a zero
    quaternion (no rotation) or a log scale whose ``exp`` is infinite in float32 (above 88.72; glTF holds finite
    floats, and no finite value stands for it), and for parameters `check_params` refuses.
    """
    p = cpu_params(params)
    check_params(p)
    _check_writable(path, p)
    n = p["means"].shape[0]
    turned = p["means"] * TURN  # [N, 3]
    signs = axis_flip_sh_signs(TURN, p["shN"].shape[1])[:, None]  # [K, 1]
    bounds = (turned.amin(0).tolist(), turned.amax(0).tolist())
    attributes = [
        Attribute("POSITION", "<f4", 3, lambda a, b: turned[a:b].numpy(), bounds=bounds),
        Attribute("COLOR_0", "u1", 4, lambda a, b: _fallback_colors(p["sh0"][a:b, 0], p["opacities"][a:b]), True),
        Attribute(attribute("ROTATION"), "<f4", 4, lambda a, b: _unit(to_file_quats(p["quats"][a:b])).numpy()),
        Attribute(attribute("SCALE"), "<f4", 3, lambda a, b: _activated_scales(p["scales"][a:b]).numpy()),
        Attribute(attribute("OPACITY"), "<f4", 1, lambda a, b: _activated_opacities(p["opacities"][a:b]).numpy()),
        Attribute(attribute("SH_DEGREE_0_COEF_0"), "<f4", 3, lambda a, b: p["sh0"][a:b, 0].numpy()),
    ]
    for k in range(p["shN"].shape[1]):
        semantic = _rest_semantic(k)
        attributes.append(Attribute(semantic, "<f4", 3, lambda a, b, k=k: (p["shN"][a:b, k] * signs[k]).numpy()))
    if exact:
        attributes += [
            Attribute(EXACT["quats"], "<f4", 4, lambda a, b: to_file_quats(p["quats"][a:b]).numpy()),
            Attribute(EXACT["scales"], "<f4", 3, lambda a, b: p["scales"][a:b].numpy()),
            Attribute(EXACT["opacities"], "<f4", 1, lambda a, b: p["opacities"][a:b, None].numpy()),
        ]
    extension = {EXTENSION: {"kernel": KERNEL, "colorSpace": COLOR_SPACE, **_DEFAULTS}}
    write_points(path, n, attributes, extension, {"antialiased": antialiased})


def load_gltf(path: str | os.PathLike) -> dict[str, Tensor]:
    """Read Gaussian parameters from a ``KHR_gaussian_splatting`` ``.glb`` or ``.gltf`` (any writer's): the float
    and quantised component types the extension allows, SH of degree 0 to 3. Returns float32 tensors keyed
    ``means, scales, quats, opacities, sh0, shN``, in gsrecon's axes.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        InputError: naming the file and what is wrong: not glTF 2.0; a JSON member of another type than glTF's
            (by its JSON path); an extension required that gsrecon does not implement; not exactly one splat
            primitive, or one the scene moves with a transform or draws twice; a kernel or colour space gsrecon does
            not train; an attribute missing, of another type or count, holding NaN or
            inf, a negative scale or an opacity outside [0, 1]; SH degrees given in part.
    """
    points = read_points(path, EXTENSION)
    _check_extension(points)
    degree = _sh_degree(points)

    def read(semantic: str, width: int, component_types: Mapping[int, bool | None] = _FLOAT) -> Tensor:
        return torch.from_numpy(points.finite(semantic, points.read(semantic, width, component_types)))

    stored = {  # the file's standard values, [N, W]
        "quats": read(attribute("ROTATION"), 4, _ROTATION_TYPES),
        "scales": read(attribute("SCALE"), 3, _SCALE_TYPES),
        "opacities": read(attribute("OPACITY"), 1, _OPACITY_TYPES),
    }
    _check_range(points, attribute("SCALE"), stored["scales"], 0.0, np.inf)
    _check_range(points, attribute("OPACITY"), stored["opacities"], 0.0, 1.0)
    values = {  # gsrecon's parameters, quaternions still in the file's axes and order
        "quats": stored["quats"],
        "scales": stored["scales"].double().clamp_min(_TINY).log().float(),
        "opacities": torch.logit(stored["opacities"].double().clamp(_TINY, _BELOW_ONE)).float(),
    }
    for key, semantic in EXACT.items():  # the exact values where the standard ones still match them
        if semantic in points.semantics:
            exact = read(semantic, stored[key].shape[1])
            same = torch.isclose(_ACTIVATIONS[key](exact), stored[key], rtol=1e-6, atol=0.0).all(dim=1, keepdim=True)
            values[key] = torch.where(same, exact, values[key])
    semantics = [semantic for d in range(1, degree + 1) for semantic in sh_semantics(d)]  # K, in shN's order
    signs = axis_flip_sh_signs(TURN, len(semantics))  # [K]
    shN = torch.empty(points.count, len(semantics), 3)  # [N, K, 3], filled a coefficient at a time
    for k, semantic in enumerate(semantics):
        shN[:, k] = read(semantic, 3) * signs[k]
    return {
        "means": read("POSITION", 3) * TURN,
        "scales": values["scales"],
        "quats": from_file_quats(values["quats"]),
        "opacities": values["opacities"][:, 0],
        "sh0": read(attribute("SH_DEGREE_0_COEF_0"), 3)[:, None, :],
        "shN": shN,
    }


def _check_extension(points: PointPrimitive) -> None:
    """Refuse an extension object whose kernel or colour space is not the one gsrecon trains."""
    for key, value in (("kernel", KERNEL), ("colorSpace", COLOR_SPACE)):
        if points.extension.get(key) != value:
            raise InputError(
                f"{points.path}: {EXTENSION} {key} is {describe(points.extension.get(key))}; gsrecon reads {value!r}"
            )


def _sh_degree(points: PointPrimitive) -> int:
    """The SH degree whose coefficients the primitive holds; refused when a degree is given in part or skipped."""
    degree = 0
    for d in range(1, MAX_SH_DEGREE + 1):
        missing = [s for s in sh_semantics(d) if s not in points.semantics]
        if len(missing) == 2 * d + 1:
            continue
        if missing or degree != d - 1:
            absent = missing or [sh_semantics(degree + 1)[0]]
            raise InputError(
                f"{points.path}: SH degree {d} is given but attribute '{absent[0]}' is missing; every coefficient "
                "of a degree and of the degrees below it must be there"
            )
        degree = d
    if attribute("SH_DEGREE_0_COEF_0") not in points.semantics:
        raise InputError(f"{points.path}: the splat primitive has no attribute '{attribute('SH_DEGREE_0_COEF_0')}'")
    return degree


def _check_range(points: PointPrimitive, semantic: str, values: Tensor, low: float, high: float) -> None:
    """Refuse values [N, W] of attribute ``semantic`` outside [low, high]."""
    bad = torch.nonzero(((values < low) | (values > high)).any(dim=1)).flatten()
    if bad.numel():
        raise InputError(
            f"{points.path}: attribute '{semantic}' has values outside [{low}, {high}] at {bad.numel()} points "
            f"(first at point {int(bad[0])}: {values[bad[0]].tolist()})"
        )


def _check_writable(path: str | os.PathLike, p: Mapping[str, Tensor]) -> None:
    """Refuse to write ``path``, naming the first such Gaussian, when a Gaussian has a zero quaternion or a log
    scale whose activation (:func:`_activated_scales`, as written) is infinite."""
    largest = p["scales"].amax(dim=1)  # [N]: exp grows with its argument, so the largest log scale decides
    refused = [  # [N] marks of the Gaussians, and what is wrong with Gaussian i
        (p["quats"].norm(dim=1) == 0, lambda i: "has a zero quaternion, which is no rotation"),
        (
            _activated_scales(largest).isinf(),
            lambda i: (
                f"has a log scale of {largest[i].item():.6g}, whose exp is infinite in float32 (above 88.72): "
                "glTF holds finite values only"
            ),
        ),
    ]
    for bad, what in refused:
        if bad.any():
            first = int(bad.long().argmax())
            raise InputError(
                f"{path}: not written: Gaussian {first} ({int(bad.sum())} of {len(bad)}) {what(first)}; remove "
                "those Gaussians first"
            )


def _rest_semantic(k: int) -> str:
    """The semantic of rest coefficient ``k`` (gsrecon's ``shN`` order: degree 1's three, then degree 2's five...)."""
    degree = int((k + 1) ** 0.5)
    return sh_semantics(degree)[k + 1 - degree**2]


def _unit(quats: Tensor) -> Tensor:
    """Quaternions [M, 4] divided by their norms in float64, as float32."""
    q = quats.double()
    return (q / q.norm(dim=-1, keepdim=True)).float()


def _activated_scales(log_scales: Tensor) -> Tensor:
    """``exp`` of log scales [M, 3] in float64, as float32."""
    return log_scales.double().exp().float()


def _activated_opacities(logits: Tensor) -> Tensor:
    """The sigmoid of opacity logits [M, ...] in float64, as float32."""
    return torch.sigmoid(logits.double()).float()


_ACTIVATIONS = {"quats": _unit, "scales": _activated_scales, "opacities": _activated_opacities}  # by EXACT key


def _fallback_colors(sh0: Tensor, logits: Tensor) -> np.ndarray:
    """``COLOR_0`` [M, 4] uint8: the degree-0 colour clamped to [0, 1] and decoded from sRGB to linear (glTF's
    vertex colours are linear), and the opacity."""
    srgb = (0.5 + SH_C0 * sh0.double()).clamp(0.0, 1.0)  # [M, 3]
    linear = torch.where(srgb <= 0.04045, srgb / 12.92, ((srgb + 0.055) / 1.055) ** 2.4)
    rgba = torch.cat([linear, torch.sigmoid(logits.double())[:, None]], dim=1)  # [M, 4]
    return torch.floor(rgba * 255 + 0.5).to(torch.uint8).numpy()
