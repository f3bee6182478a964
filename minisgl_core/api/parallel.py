"""Tensor-parallel context handed to models: which rank this is and the collectives it needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ParallelContext:
    tp_rank: int = 0
    tp_size: int = 1
    #: a torch.distributed process group (NCCL on GPU, gloo on CPU); None when tp_size == 1
    group: Any = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` across ranks in place and return it."""
        if self.tp_size > 1:
            torch.distributed.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's ``x`` along ``dim`` (rank order)."""
        if self.tp_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.tp_size)]
        torch.distributed.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)

    def shard(self, size: int, what: str = "dimension") -> int:
        """Size of this rank's shard of ``size``; an error when it does not divide evenly."""
        if size % self.tp_size:
            raise ValueError(f"{what} of size {size} is not divisible by tp_size={self.tp_size}")
        return size // self.tp_size
