"""The batch one model step runs on, shared by models and attention backends.

Token-major tensors cover the new tokens of every sequence, sequence after sequence. The KV of a
sequence lives in the paged KV pool at the slots listed by its row of ``page_table``: position
``i`` of the sequence in row ``r`` is at slot ``page_table[r, i]``; slots of one page are
contiguous (``slot // page_size`` is the page, ``slot % page_size`` the offset in it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

if TYPE_CHECKING:
    from minisgl_core.api.attention import AttentionBackend


class SharedPrefix(NamedTuple):
    """Decode sequences ``start .. end - 1`` of a batch (consecutive) whose first ``length``
    positions are the same KV slots: a prompt prefix they all reused from the prefix cache.

    ``length`` is a multiple of the page size and shorter than each of their sequences."""

    start: int
    end: int
    length: int


@dataclass
class ForwardBatch:
    is_prefill: bool
    #: [num_tokens] token ids of the new tokens
    input_ids: torch.Tensor
    #: [num_tokens] position of each new token in its sequence
    positions: torch.Tensor
    #: [num_tokens] KV-pool slot where each new token's K/V is written
    out_cache_loc: torch.Tensor
    #: [bs] int32 row of ``page_table`` for each sequence
    req_slots: torch.Tensor
    #: [bs] int32 tokens in the KV after this step (cached prefix + new tokens)
    seq_lens: torch.Tensor
    #: [bs] int32 new tokens of each sequence in this step (1 for decode)
    extend_lens: torch.Tensor
    #: the same two as Python lists: planning code reads them without a device sync
    seq_lens_cpu: list[int]
    extend_lens_cpu: list[int]
    #: [max_requests, max_context_len] int32: KV slot of every position of every request row
    page_table: torch.Tensor
    #: [bs] index into the token dimension of each sequence's last new token
    logits_indices: torch.Tensor
    #: the attention backend that runs this batch (prefill and decode may differ)
    attn: AttentionBackend
    #: whatever ``attn.prepare_metadata`` computed for this batch
    attn_metadata: Any = None
    #: true when the batch runs inside a captured CUDA graph (shapes are padded)
    captured: bool = False
    #: free-form data for plugins; never read by the core
    extra: dict[str, Any] = field(default_factory=dict)
    #: (API 1.3, decode batches, only for backends declaring "cascade") ``None``: attend as
    #: usual. A list: the groups of sequences sharing a prefix (each sequence in at most one;
    #: the others are on their own), for cascade attention: read a shared prefix once per group
    #: and merge it with each sequence's own suffix. The result must equal plain attention, so a
    #: backend may also ignore it.
    shared_prefixes: list[SharedPrefix] | None = None

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def prefix_lens_cpu(self) -> list[int]:
        return [s - e for s, e in zip(self.seq_lens_cpu, self.extend_lens_cpu)]
