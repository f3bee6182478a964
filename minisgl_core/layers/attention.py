"""The model side of attention: shape q/k/v and hand them to the batch's backend."""

from __future__ import annotations

import torch
from torch import nn

from minisgl_core.api.batch import ForwardBatch


class AttentionLayer(nn.Module):
    """Hands one layer's q/k/v to the batch's attention backend (which also writes the KV pool)."""

    def __init__(self, layer_id: int, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.layer_id, self.num_heads, self.num_kv_heads, self.head_dim = (
            layer_id,
            num_heads,
            num_kv_heads,
            head_dim,
        )

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        num_tokens = q.shape[0]
        out = batch.attn.forward(
            q.reshape(num_tokens, self.num_heads, self.head_dim),
            k.reshape(num_tokens, self.num_kv_heads, self.head_dim),
            v.reshape(num_tokens, self.num_kv_heads, self.head_dim),
            self.layer_id,
            batch,
        )
        return out.reshape(num_tokens, self.num_heads * self.head_dim)

    def attend(self, q: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """Attention of ``q`` when the model has already written this layer's new K/V to the pool
        (only for backends declaring ``"prestored_kv"``, API 1.5)."""
        num_tokens = q.shape[0]
        out = batch.attn.attend(q.reshape(num_tokens, self.num_heads, self.head_dim), self.layer_id, batch)
        return out.reshape(num_tokens, self.num_heads * self.head_dim)
