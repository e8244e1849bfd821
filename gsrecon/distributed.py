"""Multi-process training context (``torchrun``): rank, world size and the collectives the trainer uses.

With one process every method is a no-op. Under ``torchrun`` the process group is created with
NCCL on CUDA and gloo on the CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistributedContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> DistributedContext:
        """Read ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (set by torchrun) and join the process group."""
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        ctx = cls(int(os.environ.get("RANK", "0")), world_size, int(os.environ.get("LOCAL_RANK", "0")))
        if world_size > 1 and not dist.is_initialized():
            use_nccl = torch.cuda.is_available() and os.environ.get("GSRECON_DIST_BACKEND", "") != "gloo"
            if use_nccl:
                torch.cuda.set_device(ctx.local_rank)
            dist.init_process_group("nccl" if use_nccl else "gloo")
        return ctx

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def broadcast_params(self, params: torch.nn.ParameterDict) -> None:
        """Make every rank start from rank 0's parameters."""
        if self.enabled:
            for value in params.values():
                dist.broadcast(value.data, src=0)

    def all_reduce_grads(self, params: torch.nn.ParameterDict) -> None:
        """Average parameter gradients over ranks (each rank rendered different cameras)."""
        if not self.enabled:
            return
        for value in params.values():
            if value.grad is not None:
                if value.grad.is_sparse:  # all_reduce needs dense tensors; RowSparseAdam re-sparsifies
                    value.grad = value.grad.to_dense()
                dist.all_reduce(value.grad, op=dist.ReduceOp.SUM)
                value.grad /= self.world_size

    def all_reduce_sum(self, tensors: list[torch.Tensor]) -> None:
        """Sum each tensor over ranks, in place."""
        if self.enabled:
            for tensor in tensors:
                dist.all_reduce(tensor, op=dist.ReduceOp.SUM)

    def all_reduce_max(self, tensor: torch.Tensor) -> None:
        """Element-wise maximum over ranks, in place."""
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
