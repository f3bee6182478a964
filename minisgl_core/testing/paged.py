"""Random paged KV layouts and a dense attention reference, for testing attention backends.

:func:`random_page_table` gives sequences random, non-contiguous pages in random page-table rows;
:func:`make_forward_batch` builds the :class:`ForwardBatch` of one step on such a layout (so a test
can run several steps on the same pages); :func:`random_paged_batch` does both at once.
:func:`reference_attention` computes the expected output from the dense, unpaged K/V in float64.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from minisgl_core.api import AttentionBackend, ForwardBatch, KVCache


class PageTableLayout(NamedTuple):
    #: [max_requests, max_context_len] int32; entries a sequence does not own point at spare pages
    page_table: torch.Tensor
    #: [n] int32 row of each sequence (distinct, in random order)
    req_slots: torch.Tensor


def pages_needed(lengths: Sequence[int], page_size: int) -> int:
    return sum((n + page_size - 1) // page_size for n in lengths)


def random_page_table(
    capacities: Sequence[int],
    *,
    page_size: int,
    num_pages: int,
    max_requests: int,
    max_context_len: int,
    generator: torch.Generator,
    device: torch.device | str = "cpu",
) -> PageTableLayout:
    """Give sequence ``i`` whole pages for ``capacities[i]`` tokens, drawn in random order from the pool.

    Pages no sequence owns are "spare": every other page-table entry points into them, like the
    stale entries a real table keeps, so a backend reading past a sequence's end gets wrong values.
    """
    if len(capacities) > max_requests:
        raise ValueError(f"{len(capacities)} sequences but only {max_requests} page-table rows")
    if max(capacities, default=0) > max_context_len:
        raise ValueError(f"a sequence of {max(capacities)} tokens exceeds max_context_len={max_context_len}")
    if pages_needed(capacities, page_size) >= num_pages:
        raise ValueError("the pool needs at least one spare page besides the sequences' pages")
    page_order = torch.randperm(num_pages, generator=generator)
    offsets = torch.arange(page_size)
    used = pages_needed(capacities, page_size)
    spare_slots = (page_order[used:, None] * page_size + offsets).flatten()
    stale = torch.randint(len(spare_slots), (max_requests, max_context_len), generator=generator)
    page_table = spare_slots[stale]
    rows = torch.randperm(max_requests, generator=generator)[: len(capacities)]
    next_page = 0
    for row, capacity in zip(rows.tolist(), capacities, strict=True):
        count = (capacity + page_size - 1) // page_size
        pages = page_order[next_page : next_page + count]
        next_page += count
        slots = (pages[:, None] * page_size + offsets).flatten()[:max_context_len]
        page_table[row, : len(slots)] = slots
    return PageTableLayout(
        page_table.to(device=device, dtype=torch.int32), rows.to(device=device, dtype=torch.int32)
    )


def make_forward_batch(
    layout: PageTableLayout,
    seq_lens: Sequence[int],
    extend_lens: Sequence[int],
    *,
    attn: AttentionBackend,
    generator: torch.Generator,
    rows: Sequence[int] | None = None,
    is_prefill: bool | None = None,
    vocab_size: int = 1000,
    captured: bool = False,
) -> ForwardBatch:
    """One step for the sequences in ``rows`` of ``layout`` (indices into ``layout.req_slots``;
    default all): each has ``seq_lens[i]`` tokens after the step, the last ``extend_lens[i]`` new.
    ``is_prefill`` defaults to "some sequence has more than one new token"."""
    if len(seq_lens) != len(extend_lens) or not seq_lens:
        raise ValueError("seq_lens and extend_lens must be non-empty and of the same length")
    if any(not 1 <= e <= s for s, e in zip(seq_lens, extend_lens, strict=True)):
        raise ValueError(f"need 1 <= extend_len <= seq_len, got {list(seq_lens)} / {list(extend_lens)}")
    device = layout.page_table.device
    picked = list(range(len(seq_lens))) if rows is None else list(rows)
    req_slots = layout.req_slots[torch.tensor(picked, device=device)]
    table_rows = layout.page_table[req_slots.long()].long()
    positions = [torch.arange(s - e, s, device=device) for s, e in zip(seq_lens, extend_lens, strict=True)]
    out_cache_loc = torch.cat([table_rows[i, pos] for i, pos in enumerate(positions)])
    num_tokens = sum(extend_lens)

    def int32(values: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(values), dtype=torch.int32, device=device)

    return ForwardBatch(
        is_prefill=any(e > 1 for e in extend_lens) if is_prefill is None else is_prefill,
        input_ids=torch.randint(vocab_size, (num_tokens,), generator=generator).to(device),
        positions=torch.cat(positions),
        out_cache_loc=out_cache_loc,
        req_slots=req_slots,
        seq_lens=int32(seq_lens),
        extend_lens=int32(extend_lens),
        seq_lens_cpu=list(seq_lens),
        extend_lens_cpu=list(extend_lens),
        page_table=layout.page_table,
        logits_indices=torch.cumsum(torch.tensor(list(extend_lens), device=device), 0) - 1,
        attn=attn,
        captured=captured,
    )


def random_paged_batch(
    seq_lens: Sequence[int],
    extend_lens: Sequence[int],
    *,
    page_size: int,
    num_pages: int,
    max_requests: int,
    max_context_len: int,
    attn: AttentionBackend,
    generator: torch.Generator,
    device: torch.device | str = "cpu",
    is_prefill: bool | None = None,
) -> ForwardBatch:
    """A step of ``len(seq_lens)`` sequences on a fresh random page layout (see :func:`random_page_table`)."""
    layout = random_page_table(
        seq_lens,
        page_size=page_size,
        num_pages=num_pages,
        max_requests=max_requests,
        max_context_len=max_context_len,
        generator=generator,
        device=device,
    )
    return make_forward_batch(
        layout, seq_lens, extend_lens, attn=attn, generator=generator, is_prefill=is_prefill
    )


def store_prefixes(
    kv_cache: KVCache,
    layer_id: int,
    batch: ForwardBatch,
    keys: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
) -> None:
    """Write the cached prefix (positions before this step's new tokens) of every sequence of
    ``batch`` into the pool; ``keys[i]``/``values[i]`` hold at least its first prefix_len positions."""
    for i, prefix_len in enumerate(batch.prefix_lens_cpu):
        slots = batch.page_table[batch.req_slots[i].long(), :prefix_len].long()
        kv_cache.store(layer_id, slots, keys[i][:prefix_len], values[i][:prefix_len])


def reference_attention(
    q: torch.Tensor,
    keys: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    extend_lens: Sequence[int],
    scale: float,
    soft_cap: float = 0.0,
    window: int = 0,
) -> torch.Tensor:
    """Causal attention in float64 on CPU from dense K/V, one sequence at a time; ``soft_cap``
    non-zero: the scaled scores capped to ``soft_cap * tanh(scores / soft_cap)`` first (API 2.6);
    ``window`` non-zero: a query at position ``p`` sees only the keys after ``p - window`` (API 2.7).

    ``q``: [num_tokens, qo_heads, head_dim], the new tokens sequence after sequence; ``keys[i]``/
    ``values[i]``: [seq_len_i, kv_heads, head_dim], every position of sequence i. Query j of
    sequence i sits at position ``seq_len_i - extend_lens[i] + j`` and sees keys up to it."""
    outputs = []
    start = 0
    for key, value, extend_len in zip(keys, values, extend_lens, strict=True):
        seq_len = key.shape[0]
        query = q[start : start + extend_len].detach().cpu().double()
        start += extend_len
        group = query.shape[1] // key.shape[1]
        key = key.detach().cpu().double().repeat_interleave(group, dim=1)
        value = value.detach().cpu().double().repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,shd->hts", query, key) * scale
        if soft_cap:
            scores = soft_cap * torch.tanh(scores / soft_cap)
        query_pos = torch.arange(seq_len - extend_len, seq_len)
        causal = torch.arange(seq_len)[None, :] <= query_pos[:, None]
        if window:
            causal &= torch.arange(seq_len)[None, :] > query_pos[:, None] - window
        probs = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        outputs.append(torch.einsum("hts,shd->thd", probs, value))
    return torch.cat(outputs)
