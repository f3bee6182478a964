"""RMS norm."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from minisgl_core.layers.fused import add_rms_norm, rms_norm
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

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """``norm(x)``; with ``residual``, ``(norm(x + residual), x + residual)`` in one pass."""
        if residual is None:
            return rms_norm(x, self.weight, self.eps)
        return add_rms_norm(x, residual, self.weight, self.eps)
