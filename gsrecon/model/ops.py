"""The one place where the set of Gaussians gains, loses or replaces rows, or has its opacities reset.

Each operation changes, together: every parameter (row ``i`` of every tensor is Gaussian ``i``), each
parameter's optimiser state (Adam's moments: kept rows keep theirs, new and replaced rows start from zero;
the step count is shared by all rows and stays), and the entries of a strategy's state that hold one row per
Gaussian, which the strategy names (:attr:`gsrecon.strategy.base.Strategy.per_gaussian_state`; an entry still
None has no rows yet). Densification, pruning in front of the views and merging trained blocks go through here.

A strategy calls the functions with its own state; anything else that changes the Gaussians during training (a hook,
a plugin) goes through the trainer's one door, :class:`GaussianEditor` (``trainer.edit_gaussians()``), which holds
the run's parameters, optimisers and strategy state together, so that none of them can be left out. (Per-view
modules hold rows per training view, none per Gaussian: an edit leaves them as they are.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from gsrecon.optim import Optimizer

Params = torch.nn.ParameterDict  # pre-activation Gaussian parameters keyed by gsrecon.params.PARAM_NAMES
Optimizers = Mapping[str, Optimizer]  # one optimiser per parameter name


class GaussianEditor:
    """The one way to change the set of Gaussians of a training run from outside its strategy: remove, append or
    replace rows, or reset opacities, each keeping every parameter, its optimiser moments and the strategy state's
    per-Gaussian entries row-aligned (the functions of this module, on the run's own pieces)."""

    def __init__(self, params: Params, optimizers: Optimizers, state: dict[str, Any], per_gaussian: Iterable[str]):
        self.params, self.optimizers, self.state, self.per_gaussian = params, optimizers, state, tuple(per_gaussian)

    @property
    def num_gaussians(self) -> int:
        return len(self.params["means"])

    def remove(self, mask: Tensor) -> int:
        """Remove the Gaussians where ``mask`` [N] (bool) is True; the number removed."""
        if mask.shape != (self.num_gaussians,) or mask.dtype != torch.bool:
            raise ValueError(
                f"remove needs a bool mask of shape [{self.num_gaussians}], got {mask.dtype} {tuple(mask.shape)}"
            )
        count = int(mask.sum())
        if count:
            remove_rows(self.params, self.optimizers, self.state, self.per_gaussian, mask)
        return count

    def append(self, rows: Mapping[str, Tensor], state_rows: Mapping[str, Tensor] | None = None) -> None:
        """Append Gaussians (:func:`append_rows`)."""
        append_rows(self.params, self.optimizers, self.state, self.per_gaussian, rows, state_rows)

    def replace(self, index: Tensor, rows: Mapping[str, Tensor]) -> None:
        """Make the Gaussians at ``index`` new ones (:func:`replace_rows`)."""
        replace_rows(self.params, self.optimizers, self.state, self.per_gaussian, index, rows)

    def reset_opacities(self, value: float) -> None:
        """Lower every opacity above ``value`` to it (:func:`reset_opacities`)."""
        reset_opacities(self.params, self.optimizers, value)


def row_counts(
    params: Params, optimizers: Optimizers, state: Mapping[str, Any], per_gaussian: Iterable[str]
) -> dict[str, int]:
    """The number of rows of everything that holds one per Gaussian, by name (``means``, ``means.exp_avg``,
    ``state.grad2d``): all equal in a consistent run."""
    counts = {name: len(param) for name, param in params.items()}
    for name, param in params.items():
        optimizer = optimizers.get(name)
        for key, value in (optimizer.state.get(param, {}) if optimizer is not None else {}).items():
            if _is_moment(key, value):
                counts[f"{name}.{key}"] = len(value)
    counts.update({f"state.{key}": len(state[key]) for key in per_gaussian if state.get(key) is not None})
    return counts


@torch.no_grad()
def remove_rows(
    params: Params, optimizers: Optimizers, state: dict[str, Any], per_gaussian: Iterable[str], mask: Tensor
) -> None:
    """Remove the Gaussians where ``mask`` [N] (bool) is True."""
    keep = torch.where(~mask)[0]  # [K]
    keys = _per_gaussian_keys(params, state, per_gaussian)
    _replace_params(params, optimizers, lambda p, name: p[keep], lambda moment: moment[keep])
    for key in keys:
        state[key] = state[key][keep]


@torch.no_grad()
def append_rows(
    params: Params,
    optimizers: Optimizers,
    state: dict[str, Any],
    per_gaussian: Iterable[str],
    rows: Mapping[str, Tensor],
    state_rows: Mapping[str, Tensor] | None = None,
) -> None:
    """Append ``M`` Gaussians: ``rows[name]`` [M, ...] for every parameter. Their moments start at zero, and so do
    their rows of each per-Gaussian state entry unless ``state_rows[key]`` [M, ...] gives them."""
    missing = [name for name in params if name not in rows]
    if missing:
        raise ValueError(f"append_rows needs new rows for every parameter; missing {missing}")
    m = len(rows["means"])
    keys = _per_gaussian_keys(params, state, per_gaussian)

    def grow_moment(moment: Tensor) -> Tensor:
        return torch.cat([moment, moment.new_zeros((m, *moment.shape[1:]))])

    _replace_params(params, optimizers, lambda p, name: torch.cat([p, rows[name]]), grow_moment)
    for key in keys:
        value = state[key]
        new = (
            state_rows[key] if state_rows is not None and key in state_rows else value.new_zeros((m, *value.shape[1:]))
        )
        state[key] = torch.cat([value, new])


@torch.no_grad()
def replace_rows(
    params: Params,
    optimizers: Optimizers,
    state: dict[str, Any],
    per_gaussian: Iterable[str],
    index: Tensor,
    rows: Mapping[str, Tensor],
) -> None:
    """Make the Gaussians at ``index`` [M] new ones with the values ``rows[name]`` [M, ...] (an index listed twice
    gets the same values twice): their moments and their rows of each per-Gaussian state entry restart at zero."""
    keys = _per_gaussian_keys(params, state, per_gaussian)
    for name, param in params.items():
        param.data[index] = rows[name]
        for moment in _moments(optimizers, name, param):
            moment[index] = 0
    for key in keys:
        state[key][index] = 0


@torch.no_grad()
def reset_opacities(params: Params, optimizers: Optimizers, value: float) -> None:
    """Lower every opacity above ``value`` (activated, in (0, 1)) to it; the opacities' moments restart at zero (as
    gsplat's ``reset_opa``)."""
    limit = torch.logit(torch.tensor(value)).item()
    _replace_params(params, optimizers, lambda p, name: torch.clamp(p, max=limit), torch.zeros_like, ("opacities",))


def _per_gaussian_keys(params: Params, state: Mapping[str, Any], per_gaussian: Iterable[str]) -> list[str]:
    """The declared per-Gaussian state entries that hold rows now, checked to hold one per Gaussian."""
    n = len(params["means"])
    keys = [key for key in per_gaussian if state.get(key) is not None]
    for key in keys:
        if len(state[key]) != n:
            raise ValueError(f"strategy state '{key}' has {len(state[key])} rows for {n} Gaussians")
    return keys


def _is_moment(key: str, value: Any) -> bool:
    """Whether an optimiser state entry holds one row per Gaussian (Adam's moments; not its step count)."""
    return key != "step" and isinstance(value, Tensor)


def _moments(optimizers: Optimizers, name: str, param: Tensor) -> list[Tensor]:
    """The per-row optimiser state of ``param``; none without an optimiser (e.g. merging trained blocks) or before
    its first step."""
    optimizer = optimizers.get(name)
    if optimizer is None:
        return []
    return [value for key, value in optimizer.state.get(param, {}).items() if _is_moment(key, value)]


def _replace_params(
    params: Params,
    optimizers: Optimizers,
    param_fn: Callable[[Tensor, str], Tensor],
    moment_fn: Callable[[Tensor], Tensor],
    names: Iterable[str] | None = None,
) -> None:
    """Give every parameter (or those ``names``) a new Parameter holding ``param_fn(data, name)`` and move its
    optimiser state to it, each moment replaced by ``moment_fn(moment)``."""
    for name in list(params.keys()) if names is None else names:
        old = params[name]
        new = torch.nn.Parameter(param_fn(old.data, name), requires_grad=old.requires_grad)
        optimizer = optimizers.get(name)
        if optimizer is not None:
            state = optimizer.state.pop(old, {})
            optimizer.state[new] = {k: moment_fn(v) if _is_moment(k, v) else v for k, v in state.items()}
            optimizer.param_groups[0]["params"] = [new]
        params[name] = new
