"""Model architectures."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from minisgl_core.api.batch import ForwardBatch
from minisgl_core.api.parallel import ParallelContext


@dataclass(frozen=True)
class ModelConfig:
    #: the parsed ``config.json`` of the model directory
    hf_config: dict[str, Any]
    dtype: torch.dtype
    device: torch.device
    parallel: ParallelContext
    #: the longest sequence the engine runs (``--max-context-len`` capped by the config's
    #: ``max_position_embeddings``); None: ``max_position_embeddings`` (API 2.1)
    max_context_len: int | None = None


@dataclass(frozen=True)
class KVSpec:
    """What the core needs to size the KV pool and build the attention backend (per TP rank)."""

    num_layers: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    #: attention logit soft-capping: scores become ``cap * tanh(scores / cap)`` (after ``scale``,
    #: before the mask and softmax; Gemma 2's ``attn_logit_softcapping``); 0.0: none. The core
    #: passes it to the backends as ``AttentionConfig.logits_soft_cap`` and refuses, at start, a
    #: backend that does not declare "soft_cap" (API 2.6)
    logits_soft_cap: float = 0.0
    #: sliding-window attention (API 2.7): in the layers of ``window_layers`` (layer ids, as the
    #: backends' ``forward`` gets them) a query at position ``p`` sees only the keys at positions
    #: ``p - sliding_window + 1`` to ``p`` (transformers' ``kv_idx > q_idx - sliding_window``;
    #: Mistral, Phi-3, Gemma 2's alternate layers, Qwen2's ``use_sliding_window``); 0: none. The
    #: core passes it on as ``AttentionConfig.sliding_window``/``window_layers`` when the context
    #: it runs is longer than the window (else it is full attention, which every backend computes)
    #: and then refuses, at start, a backend that does not declare "sliding_window"
    sliding_window: int = 0
    window_layers: frozenset[int] = frozenset()


class Model(torch.nn.Module):
    """A causal LM built from a Hugging Face ``config.json``.

    Subclasses are constructed with a :class:`ModelConfig` directly on its device and dtype, get
    their weights through :meth:`load_weights`, and run one :class:`ForwardBatch` per step.
    Build them from :mod:`minisgl_core.layers` so tensor parallelism comes for free.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config

    @property
    @abstractmethod
    def kv_spec(self) -> KVSpec:
        """Attention shape of this rank's shard."""

    @abstractmethod
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Run the batch; return logits [bs, vocab_size] of each sequence's last new token, in float32
        or (API 1.2+) in the model's dtype: the sampler computes in float32 either way."""

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Consume (checkpoint name, full tensor) pairs, keeping this rank's shard of each.

        Returns the checkpoint names it used; the core reports any name left unused and any
        parameter never loaded."""
