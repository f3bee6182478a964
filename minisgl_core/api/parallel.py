"""Tensor-parallel context handed to models: which rank this is and the collectives it needs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

#: Faster all-reduce paths the core installs per process group (``id(group)``): each takes the
#: tensor, sums it across ranks in place and returns True, or returns False when it cannot (size,
#: dtype) and NCCL/gloo does it. See ``minisgl_core.distributed.SymmMemAllReduce``.
_fast_all_reduce: dict[int, Callable[[torch.Tensor], bool]] = {}


@dataclass(frozen=True)
class ParallelContext:
    tp_rank: int = 0
    tp_size: int = 1
    #: a torch.distributed process group (NCCL on GPU, gloo on CPU); None when tp_size == 1
    group: Any = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` across ranks in place and return it."""
        if self.tp_size > 1:
            fast = _fast_all_reduce.get(id(self.group))
            if fast is None or not fast(x):
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
