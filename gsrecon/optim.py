"""Optimisers and learning-rate schedules that never import ``torch._dynamo``.

Every ``torch.optim.Optimizer`` imports ``torch._dynamo`` on its first call (its constructor, ``zero_grad``,
``state_dict`` and ``step`` are wrapped by ``torch._disable_dynamo``): 1.6-2 s of a process start on one CPU core
(BENCHMARKS.md, issue 49), more than the rest of gsrecon's start. These classes have the interface gsrecon uses
(``param_groups``, ``state`` keyed by parameter, ``zero_grad``, ``step``, ``state_dict`` / ``load_state_dict``) and
torch's state-dict format, so a checkpoint moves between them and ``torch.optim`` both ways; :class:`Adam` steps bit
for bit as ``torch.optim.Adam`` with the same ``fused`` choice, and the schedules give torch's rates bit for bit.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from copy import deepcopy
from typing import Any

import torch
from torch import Tensor

from gsrecon.errors import InputError

StateDict = dict[str, Any]


class Optimizer:
    """Parameter groups and per-parameter state as ``torch.optim.Optimizer`` keeps them; subclasses add ``step``.

    ``params`` is an iterable of tensors or of group dicts (``{"params": [...], "lr": ..., ...}``); keys a group
    leaves out take ``defaults``.
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        self.state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        for group in groups if isinstance(groups[0], dict) else [{"params": groups}]:
            self.add_param_group(dict(group))

    def add_param_group(self, group: dict[str, Any]) -> None:
        """Add ``group`` (its ``params`` a tensor or a list of tensors; missing keys take the defaults)."""
        params = group["params"]
        group["params"] = [params] if isinstance(params, Tensor) else list(params)
        for param in group["params"]:
            if not isinstance(param, Tensor):
                raise TypeError(f"an optimizer optimizes tensors, got {type(param).__name__}")
            if not (param.is_leaf or param.retains_grad):
                raise ValueError("an optimizer cannot optimize a non-leaf tensor")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in group["params"]):
            raise ValueError("some parameters appear in more than one parameter group")
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's gradient: None (``set_to_none``) or zeros."""
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                if set_to_none:
                    param.grad = None
                else:
                    param.grad.detach_().requires_grad_(False)
                    param.grad.zero_()

    def state_dict(self) -> StateDict:
        """``{"state": {index: {...}}, "param_groups": [{..., "params": [index, ...]}]}`` as torch writes it: the
        parameters numbered in group order, the state by those numbers (tensors not copied)."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            for param in group["params"]:
                index.setdefault(id(param), len(index))
            packed["params"] = [index[id(p)] for p in group["params"]]
            groups.append(packed)
        state = {index[id(p)] if isinstance(p, Tensor) else p: value for p, value in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: StateDict) -> None:
        """Take the saved state and group settings (a :meth:`state_dict`, or a ``torch.optim`` optimiser's with the
        same groups): state tensors are copied (training must not change the checkpoint it resumed from) onto their
        parameter's device, floating ones in its dtype (the ``step`` count keeps its dtype, see :meth:`_load_step`).

        Raises:
            InputError: the saved groups differ in number or size from this optimiser's, or a parameter's saved
                state does not fit it (:meth:`state_layout`); the message starts with the entry's key
                (``state.0.exp_avg``).
        """
        saved_groups = deepcopy(state_dict["param_groups"])
        if len(saved_groups) != len(self.param_groups) or any(
            len(saved["params"]) != len(group["params"]) for saved, group in zip(saved_groups, self.param_groups)
        ):
            raise InputError("param_groups differ in number or size from this optimizer's")
        pairs = zip(saved_groups, self.param_groups)
        params = {i: p for saved, group in pairs for i, p in zip(saved["params"], group["params"])}
        groups_of = {i: saved for saved in saved_groups for i in saved["params"]}
        state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        for key, value in state_dict["state"].items():
            if key not in params:
                state[key] = value
                continue
            param = params[key]
            self._check_state(value, param, f"state.{key}")
            state[param] = {
                name: self._load_step(v, param, groups_of[key]) if name == "step" else _to_param(v, param)
                for name, v in value.items()
            }
        for saved, group in zip(saved_groups, self.param_groups):
            saved["params"] = group["params"]
        self.state, self.param_groups = state, saved_groups

    def state_layout(self, param: Tensor) -> dict[str, tuple[int, ...] | None]:
        """The entries of ``param``'s state once it has stepped: each tensor's shape, None for a number."""
        raise NotImplementedError

    def _check_state(self, saved: Any, param: Tensor, key: str) -> None:
        """Refuse a parameter's saved state (empty: not stepped yet) whose entries are not :meth:`state_layout`'s:
        a step writes the state in place, over the parameter's own buffers."""
        if not isinstance(saved, dict):
            raise InputError(f"{key} is a {type(saved).__name__}, not a dict of state entries")
        if not saved:
            return
        layout = self.state_layout(param)
        for name, shape in layout.items():
            if name not in saved:
                raise InputError(f"{key} has no '{name}' (it holds {', '.join(map(str, saved))})")
            value = saved[name]
            if shape is None:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise InputError(f"{key}.{name} is a {type(value).__name__}, not a number")
            elif not isinstance(value, Tensor) or not value.is_floating_point():
                kind = f"a tensor of {value.dtype}" if isinstance(value, Tensor) else f"a {type(value).__name__}"
                raise InputError(f"{key}.{name} is {kind}, not a floating-point tensor")
            elif tuple(value.shape) != shape:
                raise InputError(f"{key}.{name} has shape {tuple(value.shape)}, not {shape} (its parameter's state)")
        unknown = [name for name in saved if name not in layout]
        if unknown:
            raise InputError(f"{key} has entries {', '.join(map(str, unknown))} this optimizer does not keep")

    def _load_step(self, value: Any, param: Tensor, group: dict[str, Any]) -> Any:
        """A saved ``step`` count: as saved (torch keeps it on the CPU unless the group is fused)."""
        return _copy(value)


def load_optimizer_state(optimizer: Optimizer, state: StateDict, key: str) -> None:
    """Load a checkpoint's entry ``key``, an optimiser's ``state``, into ``optimizer``; a refusal names the entry
    (``optimizers.means.state.0.exp_avg``)."""
    try:
        optimizer.load_state_dict(state)
    except InputError as exc:
        raise InputError(f"{key}.{exc}") from None


def _copy(value: Any) -> Any:
    """A deep copy of a saved state value (tensors cloned)."""
    return value.clone() if isinstance(value, Tensor) else deepcopy(value)


def _to_param(value: Any, param: Tensor) -> Any:
    """A saved state value copied next to ``param``: on its device, a floating tensor in its dtype."""
    if not isinstance(value, Tensor):
        return deepcopy(value)
    if param.is_floating_point():
        return value.to(dtype=param.dtype, device=param.device, copy=True)
    return value.to(device=param.device, copy=True)


# torch.optim.Adam's other group keys, so that state dicts move both ways; only these values are supported (step checks)
ADAM_DEFAULTS: dict[str, Any] = {
    "weight_decay": 0,
    "amsgrad": False,
    "maximize": False,
    "foreach": None,
    "capturable": False,
    "differentiable": False,
    "decoupled_weight_decay": False,
}


class Adam(Optimizer):
    """Adam (Kingma and Ba), stepping bit for bit as ``torch.optim.Adam`` without weight decay, amsgrad or
    maximize: ``fused`` calls the op torch's fused Adam calls (``torch._fused_adam_``, CPU and CUDA, torch >= 2.4),
    one pass over each tensor; otherwise the per-tensor update of torch's default on the CPU."""

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        fused: bool = False,
    ) -> None:
        if fused and not hasattr(torch, "_fused_adam_"):
            raise RuntimeError(
                f"torch {torch.__version__} has no fused Adam (torch._fused_adam_): install torch >= 2.4"
            )
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, **ADAM_DEFAULTS, "fused": fused})

    @torch.no_grad()
    def step(self) -> None:
        """One Adam update of every parameter that has a gradient (its moments start at zero)."""
        for group in self.param_groups:
            unsupported = {k: group[k] for k, v in ADAM_DEFAULTS.items() if k != "foreach" and group[k] != v}
            if unsupported:
                raise ValueError(f"gsrecon's Adam supports none of {unsupported}")
            params = [p for p in group["params"] if p.grad is not None]
            for param in params:
                if param.grad.is_sparse:
                    raise RuntimeError("Adam takes dense gradients (RowSparseAdam takes sparse ones)")
                state = self.state[param]
                if not state:
                    # torch keeps the count as a float32 tensor beside the parameter when fused, on the CPU otherwise
                    device = param.device if group["fused"] else "cpu"
                    state["step"] = torch.zeros((), dtype=torch.float32, device=device)
                    state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            if group["fused"]:
                self._fused_step(group, params)
            else:
                for param in params:
                    self._single_step(group, param)

    def state_layout(self, param: Tensor) -> dict[str, tuple[int, ...] | None]:
        return {"step": (), "exp_avg": tuple(param.shape), "exp_avg_sq": tuple(param.shape)}

    def _fused_step(self, group: dict[str, Any], params: list[Tensor]) -> None:
        """Fused Adam over ``params``, one call per device and dtype (as torch groups them)."""
        beta1, beta2 = group["betas"]
        by_kind: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
        for param in params:
            by_kind.setdefault((param.device, param.dtype), []).append(param)
        for kind in by_kind.values():
            states = [self.state[p] for p in kind]
            steps = [s["step"] for s in states]
            torch._foreach_add_(steps, 1)
            torch._fused_adam_(
                kind,
                [p.grad for p in kind],
                [s["exp_avg"] for s in states],
                [s["exp_avg_sq"] for s in states],
                [],
                steps,
                amsgrad=False,
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                weight_decay=0.0,
                eps=group["eps"],
                maximize=False,
                grad_scale=None,
                found_inf=None,
            )

    def _single_step(self, group: dict[str, Any], param: Tensor) -> None:
        """The update of one parameter in torch's per-tensor Adam (the same operations in the same order)."""
        beta1, beta2 = group["betas"]
        state = self.state[param]
        grad, exp_avg, exp_avg_sq = param.grad, state["exp_avg"], state["exp_avg_sq"]
        state["step"] += 1
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = state["step"].item()
        step_size = group["lr"] / (1 - beta1**step)
        denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(group["eps"])
        param.addcdiv_(exp_avg, denom, value=-step_size)

    def _load_step(self, value: Any, param: Tensor, group: dict[str, Any]) -> Any:
        """A saved ``step`` count: a float32 tensor beside the parameter when fused (as torch loads it)."""
        if isinstance(value, Tensor) and (group.get("fused") or group.get("capturable")):
            return value.to(dtype=torch.float32, device=param.device, copy=True)
        return _copy(value)


class LRScheduler:
    """A learning-rate schedule over an optimiser's groups, with ``torch.optim.lr_scheduler``'s state-dict format:
    built at ``last_epoch`` 0 (each group's ``initial_lr`` set), each :meth:`step` advances it by one."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_lrs: list[float] = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = -1
        self._step_count = 0
        self._is_initial = True
        self._get_lr_called_within_step = False  # torch's bookkeeping key: the state dicts have the same keys
        self.step()
        self._is_initial = False

    def get_lr(self) -> list[float]:
        """The groups' rates at ``last_epoch``."""
        raise NotImplementedError

    def step(self) -> None:
        """Advance the schedule by one and set the groups' rates."""
        self._step_count += 1
        self.last_epoch += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        """The rates the last :meth:`step` set."""
        return self._last_lr

    def state_dict(self) -> StateDict:
        """Every attribute but the optimiser (torch's format)."""
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict: StateDict) -> None:
        """Take a saved :meth:`state_dict` (or a torch scheduler's of the same kind); keys torch writes for its own
        bookkeeping are kept as attributes, as torch does."""
        self.__dict__.update(state_dict)


class ExponentialLR(LRScheduler):
    """Each step multiplies every group's rate by ``gamma`` (torch's chainable ``ExponentialLR``: the rate of step
    ``t`` is that of ``t - 1`` times ``gamma``, the same floats as torch's)."""

    def __init__(self, optimizer: Any, gamma: float) -> None:
        self.gamma = gamma
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        if self._is_initial:
            return [group["lr"] for group in self.optimizer.param_groups]
        return [group["lr"] * self.gamma for group in self.optimizer.param_groups]


class LambdaLR(LRScheduler):
    """The rate of step ``t`` is each group's initial rate times ``lr_lambda(t)`` (torch's ``LambdaLR``: one function
    for every group, or a list of one per group; the functions are not saved)."""

    def __init__(self, optimizer: Any, lr_lambda: Callable[[int], float] | list[Callable[[int], float]]) -> None:
        self.lr_lambdas = list(lr_lambda) if isinstance(lr_lambda, list) else [lr_lambda] * len(optimizer.param_groups)
        if len(self.lr_lambdas) != len(optimizer.param_groups):
            raise ValueError(f"{len(self.lr_lambdas)} lr_lambdas for {len(optimizer.param_groups)} parameter groups")
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        return [base * fn(self.last_epoch) for fn, base in zip(self.lr_lambdas, self.base_lrs)]

    def state_dict(self) -> StateDict:
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}
        state["lr_lambdas"] = [None] * len(self.lr_lambdas)
        return state

    def load_state_dict(self, state_dict: StateDict) -> None:
        self.__dict__.update({k: v for k, v in state_dict.items() if k != "lr_lambdas"})


def sparse_adam_step(
    param: Tensor, grad: Tensor, state: dict[str, Any], lr: float, betas: tuple[float, float], eps: float
) -> None:
    """Lazy Adam's update of the rows of ``param`` that the sparse COO ``grad`` holds (``state``: ``step``, an int,
    and the moments ``exp_avg``, ``exp_avg_sq``), as ``torch.optim.SparseAdam`` computes it."""
    beta1, beta2 = betas
    state["step"] += 1  # counted whether or not a row moves, as torch counts it
    grad = grad.coalesce()  # the update is not linear: each row once
    indices, values = grad._indices(), grad._values()
    if values.numel() == 0:
        return

    def sparse(rows: Tensor) -> Tensor:
        return torch.sparse_coo_tensor(indices, rows, grad.shape, check_invariants=False)

    exp_avg, exp_avg_sq, step = state["exp_avg"], state["exp_avg_sq"], state["step"]
    old_avg = exp_avg.sparse_mask(grad)._values()
    avg_update = values.sub(old_avg).mul_(1 - beta1)
    exp_avg.add_(sparse(avg_update))
    old_sq = exp_avg_sq.sparse_mask(grad)._values()
    sq_update = values.pow(2).sub_(old_sq).mul_(1 - beta2)
    exp_avg_sq.add_(sparse(sq_update))
    numer = avg_update.add_(old_avg)
    denom = sq_update.add_(old_sq).sqrt_().add_(eps)
    step_size = lr * math.sqrt(1 - beta2**step) / (1 - beta1**step)
    param.add_(sparse(-step_size * numer.div_(denom)))
