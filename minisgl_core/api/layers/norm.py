"""RMS norm."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from minisgl_core.api.layers.weights import load_full, new_param


class RMSNorm(nn.Module):
    """RMS norm over the last dimension, computed in float32 like Hugging Face's."""

    def __init__(
        self, dim: int, eps: float = 1e-6, *, dtype: torch.dtype | None = None, device: Any = None
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight = new_param((dim,), dtype, device, load_full)
        self.weight.data.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)
