"""The batch one model step runs on, shared by models and attention backends.

Token-major tensors cover the new tokens of every sequence, sequence after sequence. The KV of a
sequence lives in the paged KV pool at the slots listed by its row of ``page_table``: position
``i`` of the sequence in row ``r`` is at slot ``page_table[r, i]``; slots of one page are
contiguous (``slot // page_size`` is the page, ``slot % page_size`` the offset in it).
"""

from __future__ import annotations

import functools
import itertools
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


class PagedLayout(NamedTuple):
    """The CSR description of a batch's paged KV that FlashInfer-style kernels take.

    All int32 on the batch's device."""

    #: [bs + 1] offsets of each sequence's new tokens
    qo_indptr: torch.Tensor
    #: [bs + 1] offsets into ``kv_indices``
    kv_indptr: torch.Tensor
    #: [total_pages] page ids, sequence after sequence
    kv_indices: torch.Tensor
    #: [bs] tokens used in each sequence's last page (1..page_size)
    kv_last_page_len: torch.Tensor


def paged_layout(batch: ForwardBatch, page_size: int) -> PagedLayout:
    """Build the CSR page layout of ``batch`` from its page table. Since API 2.0 the core does
    this once per batch (:attr:`ForwardBatch.layout`); backends read that instead.

    Sizes come from the batch's host-side lengths, so nothing here waits for the device."""
    device = batch.seq_lens.device
    seq_lens = batch.seq_lens.to(torch.int32)
    num_pages = (seq_lens + page_size - 1) // page_size
    total_pages = sum((s + page_size - 1) // page_size for s in batch.seq_lens_cpu)
    qo_indptr = torch.zeros(batch.batch_size + 1, dtype=torch.int32, device=device)
    qo_indptr[1:] = torch.cumsum(batch.extend_lens, 0)
    kv_indptr = torch.zeros_like(qo_indptr)
    kv_indptr[1:] = torch.cumsum(num_pages, 0)
    # For every page of every sequence: which sequence, and which page of it.
    seq_of_page = torch.repeat_interleave(
        torch.arange(batch.batch_size, device=device), num_pages, output_size=total_pages
    )
    page_in_seq = torch.arange(total_pages, device=device) - kv_indptr[seq_of_page]
    first_slots = batch.page_table[batch.req_slots.long()[seq_of_page], page_in_seq * page_size]
    kv_indices = (first_slots // page_size).to(torch.int32)
    kv_last_page_len = (seq_lens - 1) % page_size + 1
    return PagedLayout(qo_indptr, kv_indptr, kv_indices, kv_last_page_len)


class HostPagedLayout(NamedTuple):
    """(API 2.0) :class:`PagedLayout`'s offsets as CPU int32 tensors (see ``ForwardBatch.host_layout``)."""

    #: [bs + 1] offsets of each sequence's new tokens
    qo_indptr: torch.Tensor
    #: [bs + 1] offsets into the page ids
    kv_indptr: torch.Tensor
    #: [bs] tokens used in each sequence's last page (1..page_size)
    kv_last_page_len: torch.Tensor


def _int32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


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

    @functools.cached_property
    def layout(self) -> PagedLayout:
        """(API 2.0) The CSR page layout of this batch on its device, for its backend's page size:
        computed by the core on first read and shared by every later reader (the backend's
        ``prepare_metadata`` / ``prepare_capture`` / ``prepare_replay`` and its layers), so no
        backend builds it. Cached: code that changes a batch's lengths, rows or page table after
        the first read builds a new batch (or deletes ``layout`` and ``host_layout`` first)."""
        return paged_layout(self, self.attn.config.page_size)

    @functools.cached_property
    def host_layout(self) -> HostPagedLayout:
        """(API 2.0) :attr:`layout`'s offsets as CPU tensors, from the host-side lengths (no
        device sync): what planners that read offsets on the host (FlashInfer's ``plan()``) take."""
        page_size = self.attn.config.page_size
        pages = [(n + page_size - 1) // page_size for n in self.seq_lens_cpu]
        return HostPagedLayout(
            qo_indptr=_int32([0, *itertools.accumulate(self.extend_lens_cpu)]),
            kv_indptr=_int32([0, *itertools.accumulate(pages)]),
            kv_last_page_len=_int32([(n - 1) % page_size + 1 for n in self.seq_lens_cpu]),
        )

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def prefix_lens_cpu(self) -> list[int]:
        return [s - e for s, e in zip(self.seq_lens_cpu, self.extend_lens_cpu)]
