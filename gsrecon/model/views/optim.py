"""The optimiser of the per-view modules: Adam over the rows of the views a step trained on.

A per-view parameter holds one row per training view ([N, ...]), and a step's loss reaches only the rows of the
views in its batch (one step in N at batch size 1). Dense Adam moves every row every step: a row keeps moving on
its momentum for about ten steps after each visit, and its second moment, averaged over all steps instead of its
visits, is about N times too small, so each visit moves the row several times further than Adam's step. Where a
view's gradient is mostly noise (a camera at its true pose, seen by a young scene) the row wanders by that much
(BENCHMARKS.md, issue 38). :class:`VisitedRowsAdam` is Adam as if each row were its own parameter, stepped only
when its view is trained on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from gsrecon.optim import Optimizer


class VisitedRowsAdam(Optimizer):
    """Adam that moves only the given rows of its parameters, each row with its own moments and its own count of
    updates for the bias correction; rows not given keep their values and their moments."""

    def __init__(
        self, params: Iterable[Any], lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-15
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps})

    def state_layout(self, param: Tensor) -> dict[str, tuple[int, ...] | None]:
        return {"exp_avg": tuple(param.shape), "exp_avg_sq": tuple(param.shape), "updates": tuple(param.shape[:1])}

    @torch.no_grad()
    def step(self, rows: Tensor | None = None) -> None:
        """Update the ``rows`` [B] (row indices into every parameter's first dimension; None: every row)."""
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)
                    state["updates"] = torch.zeros(param.shape[0], dtype=param.dtype, device=param.device)  # [N]
                at = slice(None) if rows is None else rows
                grad = param.grad[at]
                updates = state["updates"][at] + 1
                exp_avg = state["exp_avg"][at].lerp(grad, 1 - beta1)
                exp_avg_sq = state["exp_avg_sq"][at].mul(beta2).addcmul_(grad, grad, value=1 - beta2)
                state["updates"][at], state["exp_avg"][at], state["exp_avg_sq"][at] = updates, exp_avg, exp_avg_sq
                per_row = (-1,) + (1,) * (param.dim() - 1)
                correction1 = (1 - beta1**updates).view(per_row)
                correction2 = (1 - beta2**updates).view(per_row)
                denom = (exp_avg_sq / correction2).sqrt_().add_(group["eps"])
                param[at] -= group["lr"] * (exp_avg / correction1) / denom
