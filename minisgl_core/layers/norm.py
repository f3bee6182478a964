"""RMS norm."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from minisgl_core.api.parallel import ParallelContext, _fast_all_reduce
from minisgl_core.layers import triton_ops
from minisgl_core.layers.fused import add_partials_rms_norm, add_rms_norm, rms_norm
from minisgl_core.layers.weights import load_full, new_param


class RMSNorm(nn.Module):
    """RMS norm over the last dimension, computed in float32 like Hugging Face's."""

    def __init__(
        self, dim: int, eps: float = 1e-6, *, dtype: torch.dtype | None = None, device: Any = None
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight = new_param((dim,), dtype, device, load_full)
        self.weight.data.fill_(1.0)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None = None,
        *,
        partial_of: ParallelContext | None = None,
    ):
        """``norm(x)``; with ``residual``, ``(norm(x + residual), x + residual)`` in one pass.
        ``partial_of``: ``x`` is this rank's partial sum in that group (a ``RowParallelLinear``
        called with ``reduce=False``), all-reduced first; with a residual under tensor parallelism
        on CUDA that sum is fused with the add and the norm where the core's symmetric-memory
        all-reduce can (``--disable-fast-path symm_mem_norm`` turns it off), bitwise the same. On one
        GPU ``x`` may be a split-K GEMM's partial sums (:class:`~minisgl_core.layers.triton_ops.SplitKPartials`),
        added here with the residual and the norm in one kernel, bitwise the same too."""
        if isinstance(x, triton_ops.SplitKPartials):  # one GPU: a split-K GEMM's sum, deferred
            if residual is None:
                return rms_norm(x.total(), self.weight, self.eps)
            return add_partials_rms_norm(x, residual, self.weight, self.eps)
        if partial_of is not None and partial_of.tp_size > 1:
            fused = None
            if residual is not None:
                fast = _fast_all_reduce.get(id(partial_of.group))
                fuse = getattr(fast, "add_rms_norm", None)
                fused = fuse(x, residual, self.weight, self.eps) if fuse is not None else None
            if fused is not None:
                return fused
            x = partial_of.all_reduce(x)
        if residual is None:
            return rms_norm(x, self.weight, self.eps)
        return add_rms_norm(x, residual, self.weight, self.eps)
