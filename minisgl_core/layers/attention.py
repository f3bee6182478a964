"""The model side of attention: shape q/k/v and hand them to the batch's backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from minisgl_core.api.batch import ForwardBatch
from minisgl_core.plugin_results import WrongResult, shown

#: (layer, method name, tensor arguments, batch) -> the layer's output; see :func:`split_at_attention`
Splitter = Callable[["AttentionLayer", str, tuple[torch.Tensor, ...], ForwardBatch], torch.Tensor]

_splitter: Splitter | None = None


@contextmanager
def split_at_attention(splitter: Splitter | None) -> Iterator[None]:
    """While active, every :class:`AttentionLayer` call goes to ``splitter`` instead of the batch's
    backend: ``splitter(layer, "forward" or "attend", tensor arguments, batch)`` returns the
    ``[num_tokens, heads * head_dim]`` output the model continues with. The piecewise CUDA graphs
    of prefill steps (``runner/piecewise.py``) end one graph and begin the next there, and replay
    the layer's own method between the graphs. ``None``: calls go to the backend again."""
    global _splitter
    previous, _splitter = _splitter, splitter
    try:
        yield
    finally:
        _splitter = previous


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
        if _splitter is not None:
            return _splitter(self, "forward", (q, k, v), batch)
        num_tokens = q.shape[0]
        out = batch.attn.forward(
            q.reshape(num_tokens, self.num_heads, self.head_dim),
            k.reshape(num_tokens, self.num_kv_heads, self.head_dim),
            v.reshape(num_tokens, self.num_kv_heads, self.head_dim),
            self.layer_id,
            batch,
        )
        return self._flat(out, num_tokens, "forward", batch)

    def attend(self, q: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """Attention of ``q`` when the model has already written this layer's new K/V to the pool
        (only for backends declaring ``"prestored_kv"``, API 1.5)."""
        if _splitter is not None:
            return _splitter(self, "attend", (q,), batch)
        num_tokens = q.shape[0]
        out = batch.attn.attend(q.reshape(num_tokens, self.num_heads, self.head_dim), self.layer_id, batch)
        return self._flat(out, num_tokens, "attend", batch)

    def _flat(self, out: object, num_tokens: int, method: str, batch: ForwardBatch) -> torch.Tensor:
        """The backend's ``method``'s output as ``[num_tokens, heads x head_dim]``; a WrongResult
        naming the backend when it is not a tensor of that many elements."""
        try:
            return out.reshape(num_tokens, self.num_heads * self.head_dim)  # type: ignore[union-attr]
        except (AttributeError, RuntimeError):
            wrong = self._wrong_output(out, num_tokens, method, batch)
            if wrong is None:
                raise
            raise wrong from None

    def _wrong_output(
        self, out: object, num_tokens: int, method: str, batch: ForwardBatch
    ) -> WrongResult | None:
        """Why the reshape of what the backend's ``method`` returned failed, naming the backend
        (the reshape's own error named none): not a tensor, or not ``[num_tokens, heads,
        head_dim]``'s number of elements; None when it is neither (a device error, raised as
        it is). Asked only when the reshape fails: the try costs nothing per call."""
        expected = [num_tokens, self.num_heads, self.head_dim]
        if isinstance(out, torch.Tensor) and out.numel() == num_tokens * self.num_heads * self.head_dim:
            return None
        return WrongResult(
            batch.attn, "attention", f"{method} returned {shown(out)}, expected shape {expected} (q's)"
        )
