"""Paged attention in plain PyTorch: the CPU backend and the reference for every other backend.

Once per step, :meth:`TorchAttentionBackend.prepare_metadata` turns the page table into a padded
``[bs, max_len]`` grid of KV slots and a ``[bs, max_extend, max_len]`` causal mask; every layer
then gathers its K/V through that grid and runs one masked ``scaled_dot_product_attention`` over
the whole batch, in float32 (on a CPU, a decode batch runs the same arithmetic as two batched
matmuls around a softmax, its rows in groups of like lengths: see
:meth:`TorchAttentionBackend._decode_by_width`; and a batch whose grid is mostly padding, one
long prompt beside short ones or decode rows, runs sequence by sequence:
:meth:`TorchAttentionBackend._each`). Padding costs memory proportional to ``bs * max_len`` per layer,
which is fine on CPU and in tests but is why GPU serving uses the kernel backends.

Soft-capping (``config.logits_soft_cap``, API 2.6: Gemma 2): the scaled scores become
``cap * tanh(scores / cap)`` before the mask and softmax, on every path; where the path would
call ``scaled_dot_product_attention``, which has no such step, it computes the scores itself
(:func:`_attention`).

Sliding window (``config.sliding_window`` in ``config.window_layers``, API 2.7: Mistral, Gemma 2):
the step's metadata holds a second mask, the causal one less the keys a window hides from each
query; the windowed layers attend through it on every path (never the unmasked shortcut of a
lone decode row), and a cascade batch is attended whole (its shared prefix may lie outside a
window), which computes the same.

Cascade (decode batches with ``shared_prefixes``): each group's queries attend once to the shared
prefix (the first sequence's slots), each sequence to its own positions after it, and the two
partial results are merged by their log-sum-exp: the same arithmetic the GPU backends run,
written plainly so it serves as their reference.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from minisgl_core.api import AttentionBackend, ForwardBatch, SharedPrefix
from minisgl_core.layers.fused import merge_attention_states

LOG2_E = 1.4426950408889634


class TorchAttentionMetadata(NamedTuple):
    #: [bs, max_len] int64 KV slot of every position; positions past a sequence's end repeat its
    #: first slot, so the gather only touches memory the sequence has written
    kv_slots: torch.Tensor
    #: [bs, 1, max_extend, max_len] bool, True where a (padded) query may attend to a key
    mask: torch.Tensor
    #: [num_tokens] int64 sequence of each new token
    token_seq: torch.Tensor
    #: [num_tokens] int64 index of each new token among its sequence's new tokens
    token_offset: torch.Tensor
    max_extend: int
    #: cascade decode: the batch's groups, and the KV slots of each group's shared prefix;
    #: ``kv_slots``/``mask`` then cover only the positions after a grouped sequence's prefix
    groups: list[SharedPrefix] | None = None
    group_slots: list[torch.Tensor] | None = None
    #: off CUDA, a decode batch without groups: its rows in groups of like widths, each as (row
    #: indices, or None for all rows in order; the group's width), for :meth:`_decode_by_width`
    width_groups: list[tuple[torch.Tensor | None, int]] | None = None
    #: off CUDA, a batch with longer prompts whose grid is mostly padding: run sequence by
    #: sequence (:meth:`_each`)
    each: bool = False
    #: with ``config.sliding_window``: ``mask`` less the keys out of each query's window
    window_mask: torch.Tensor | None = None
    #: ``mask`` is ``window_mask`` (a windowed layer's view of the metadata): always applied
    windowed: bool = False


def _gather_rows(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """K or V of one layer (``pool``: ``[num_pages, page_size, kv_heads, head_dim]``) at ``slots``
    (``[b, n]`` KV slots) as float32 ``[b, n, kv_heads, head_dim]``, as the pool holds a slot.

    ``index_select`` rather than ``pool[slots]``: the advanced-indexing kernel opens a parallel
    region even for a few rows, which on a CPU whose cores are busy with other work waits for a
    descheduled thread (milliseconds per layer on 2 shared cores, against microseconds here)."""
    b, n = slots.shape
    flat = pool.view(-1, pool.shape[-2], pool.shape[-1])
    return flat.index_select(0, slots.reshape(-1)).view(b, n, pool.shape[-2], pool.shape[-1]).float()


def _gather(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """:func:`_gather_rows` as ``[b, kv_heads, n, head_dim]`` (a view)."""
    return _gather_rows(pool, slots).transpose(1, 2)


def _cap(scores: torch.Tensor, cap: float) -> torch.Tensor:
    """``cap * tanh(scores / cap)`` in place (``cap`` 0: ``scores`` unchanged)."""
    if cap:
        scores.div_(cap).tanh_().mul_(cap)
    return scores


def _attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    cap: float,
) -> torch.Tensor:
    """``scaled_dot_product_attention(q, k, v, mask, scale)`` with GQA (``q`` [b, qo_heads, t, d],
    ``k``/``v`` [b, kv_heads, s, d], ``mask`` broadcast to [b, qo_heads, t, s] or None), the scores
    soft-capped by ``cap`` when it is non-zero (then computed here: SDPA has no cap)."""
    gqa = q.shape[1] != k.shape[1]
    if not cap:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    b, heads, t, d = q.shape
    kv_heads = k.shape[1]
    rows = q.reshape(b, kv_heads, heads // kv_heads * t, d)  # head h reads KV head h // group
    scores = _cap(torch.matmul(rows, k.transpose(-1, -2)).mul_(scale), cap).view(b, heads, t, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).view(b, kv_heads, heads // kv_heads * t, -1)
    return torch.matmul(probs, v).view(b, heads, t, d)


#: from this many gathered elements of K (batch x keys x KV heads x head dim) a CPU decode
#: attends one KV head at a time (:meth:`TorchAttentionBackend._decode`)
_HEAD_BY_HEAD_ELEMENTS = 1 << 17


def _mostly_padding(extend_lens: list[int], seq_lens: list[int]) -> bool:
    """Whether most of a batch's padded ``[bs, max_extend, max_len]`` attention grid is padding."""
    real = sum(e * s for e, s in zip(extend_lens, seq_lens))
    return 2 * real < len(extend_lens) * max(extend_lens) * max(seq_lens)


def _width_groups(ends: list[int]) -> list[tuple[list[int], int]]:
    """Decode rows grouped so that none is padded past twice its width (``ends``: each row's
    width): ``(rows, the group's width)``, one group of every row in order when they are alike."""
    if 2 * min(ends) >= max(ends):
        return [(list(range(len(ends))), max(ends))]
    groups: list[tuple[list[int], int]] = []
    for row in sorted(range(len(ends)), key=ends.__getitem__, reverse=True):
        if groups and 2 * ends[row] >= groups[-1][1]:
            groups[-1][0].append(row)
        else:
            groups.append(([row], ends[row]))
    return groups


class TorchAttentionBackend(AttentionBackend):
    """Causal paged attention with GQA for any device and page size (no CUDA graphs)."""

    capabilities = frozenset(
        {
            "prefill",
            "decode",
            "page_size>1",
            "cascade",
            "prestored_kv",
            "kv_fp8",
            "mixed",
            "soft_cap",
            "sliding_window",
        }
    )

    def prepare_metadata(self, batch: ForwardBatch) -> None:
        batch.attn_metadata = self.build_metadata(batch)

    def build_metadata(self, batch: ForwardBatch, max_len: int | None = None) -> TorchAttentionMetadata:
        """The metadata of ``batch``, its KV padded to ``max_len`` (default: the longest sequence)."""
        groups = batch.shared_prefixes
        if not groups or self.config.sliding_window:  # (a window may hide part of a shared prefix)
            return self._grid(batch, max_len)
        if max(batch.extend_lens_cpu) > 1:
            raise ValueError("shared_prefixes is for decode batches (one new token per sequence)")
        key_starts = [0] * batch.batch_size
        for group in groups:
            key_starts[group.start : group.end] = [group.length] * (group.end - group.start)
        rows = batch.req_slots.long()
        group_slots = [batch.page_table[rows[g.start], : g.length].long() for g in groups]
        return self._suffix_grid(batch, key_starts)._replace(groups=groups, group_slots=group_slots)

    def _suffix_grid(self, batch: ForwardBatch, key_starts: list[int]) -> TorchAttentionMetadata:
        """A cascade decode step's own keys: sequence b's positions ``key_starts[b]`` to its length,
        padded to the longest such suffix (its shared prefix is attended per group, from
        ``group_slots``). A grid over whole sequences with the prefixes masked out gathered and
        multiplied every prefix key once more for nothing: on a CPU, 35 sequences sharing 760
        tokens decoded slower with cascade than without (1.14 against 0.63 s a step)."""
        device = batch.page_table.device
        bs = batch.batch_size
        width = max(n - start for n, start in zip(batch.seq_lens_cpu, key_starts))
        starts = torch.tensor(key_starts, device=device)
        positions = starts[:, None] + torch.arange(width, device=device)[None, :]
        valid = positions < batch.seq_lens.to(device=device, dtype=torch.int64)[:, None]
        table = batch.page_table[batch.req_slots.long()]
        slots = table.gather(1, positions.clamp(max=table.shape[1] - 1)).long()
        return TorchAttentionMetadata(
            kv_slots=torch.where(valid, slots, slots[:, :1]),  # padding reads a valid key, masked
            mask=valid[:, None, None, :],
            token_seq=torch.arange(bs, device=device),
            token_offset=torch.zeros(bs, dtype=torch.int64, device=device),
            max_extend=1,
        )

    def _grid(self, batch: ForwardBatch, max_len: int | None) -> TorchAttentionMetadata:
        device = batch.page_table.device
        bs = batch.batch_size
        # Python-side lengths give the padded shapes without a device sync.
        max_len = max(batch.seq_lens_cpu) if max_len is None else max_len
        max_extend = max(batch.extend_lens_cpu)
        num_tokens = sum(batch.extend_lens_cpu)
        seq_lens = batch.seq_lens.to(device=device, dtype=torch.int64)
        extend_lens = batch.extend_lens.to(device=device, dtype=torch.int64)
        prefix_lens = seq_lens - extend_lens

        key_pos = torch.arange(max_len, device=device)
        key_valid = key_pos[None, :] < seq_lens[:, None]
        rows = batch.page_table[batch.req_slots.long(), :max_len].long()
        kv_slots = torch.where(key_valid, rows, rows[:, :1])

        # Padded query j of sequence b sits at position prefix_b + j; padded rows past the
        # sequence's new tokens see every valid key, so no softmax row is empty (no NaN).
        query_pos = prefix_lens[:, None] + torch.arange(max_extend, device=device)[None, :]
        mask = (key_pos[None, None, :] <= query_pos[:, :, None]) & key_valid[:, None, :]
        window_mask = None
        if self.config.sliding_window:
            # (a padded query row counts as its sequence's last position: its row is never empty)
            last = torch.minimum(query_pos, seq_lens[:, None] - 1)
            window_mask = (mask & (key_pos[None, None, :] > last[:, :, None] - self.config.sliding_window))[
                :, None
            ]

        token_seq = torch.repeat_interleave(
            torch.arange(bs, device=device), extend_lens, output_size=num_tokens
        )
        seq_start = torch.cumsum(extend_lens, 0) - extend_lens
        token_offset = torch.arange(num_tokens, device=device) - seq_start[token_seq]
        # Off CUDA, how the layers will split the batch, decided once for the step: a decode row
        # sees exactly its sequence's keys, so its width is its length.
        width_groups, each = None, False
        if device.type != "cuda":
            if max_extend == 1:
                grouped = _width_groups(batch.seq_lens_cpu)
                width_groups = [
                    (None if len(grouped) == 1 else torch.tensor(rows), width) for rows, width in grouped
                ]
            elif max_extend > 1:
                each = _mostly_padding(batch.extend_lens_cpu, batch.seq_lens_cpu)
        return TorchAttentionMetadata(
            kv_slots=kv_slots,
            mask=mask[:, None],
            token_seq=token_seq,
            token_offset=token_offset,
            max_extend=max_extend,
            width_groups=width_groups,
            each=each,
            window_mask=window_mask,
        )

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        self.config.kv_cache.store(layer_id, batch.out_cache_loc, k, v)
        return self.attend(q, layer_id, batch)

    def attend(self, q: torch.Tensor, layer_id: int, batch: ForwardBatch) -> torch.Tensor:
        cache = self.config.kv_cache
        meta: TorchAttentionMetadata = batch.attn_metadata
        if self.config.window_of(layer_id):
            meta = meta._replace(mask=meta.window_mask, windowed=True)
        bs, num_qo_heads, head_dim = batch.batch_size, q.shape[1], q.shape[2]
        # Decode (one new token per sequence) needs no scatter into the padded grid: token i is
        # sequence i's only query. The index_put/index pair it replaces cost a parallel region
        # each per layer on the CPU (see _gather).
        decode = meta.max_extend == 1 and q.shape[0] == bs
        if meta.width_groups is not None and not q.is_cuda:
            return self._decode_by_width(q.float(), layer_id, meta, batch).to(q.dtype)

        keys = _gather(cache.k_cache(layer_id), meta.kv_slots)
        values = _gather(cache.v_cache(layer_id), meta.kv_slots)
        if meta.each and not q.is_cuda:
            return self._each(q.float(), keys, values, meta, batch).to(q.dtype)
        if decode:
            queries = q.float()[:, None]
        else:
            queries = q.new_zeros((bs, meta.max_extend, num_qo_heads, head_dim), dtype=torch.float32)
            queries[meta.token_seq, meta.token_offset] = q.float()
        if meta.groups is not None:
            return self._cascade(queries[:, 0], keys, values, meta, layer_id).to(q.dtype)
        # one sequence decoding over exactly its own keys sees them all: no mask to apply
        whole = decode and bs == 1 and keys.shape[2] == batch.seq_lens_cpu[0] and not meta.windowed
        out = _attention(
            queries.transpose(1, 2),
            keys,
            values,
            None if whole else meta.mask,
            self.config.scale,
            self.config.logits_soft_cap,
        )
        # [bs, qo_heads, max_extend, head_dim] -> the new tokens, token-major
        if decode:
            return out[:, :, 0].to(q.dtype)
        return out.transpose(1, 2)[meta.token_seq, meta.token_offset].to(q.dtype)

    def _decode_by_width(
        self, q: torch.Tensor, layer_id: int, meta: TorchAttentionMetadata, batch: ForwardBatch
    ) -> torch.Tensor:
        """A decode batch on the CPU (``q``: float32 [bs, qo_heads, head_dim]), its rows gathered
        and attended in the groups of like widths the step's metadata chose (a row's width: its
        length, where its visible keys end), so that one long sequence does not pad every short
        one's keys to its length (a 4,000-token row beside 30 of 100 tokens: 30 times the keys
        read). Rows of like lengths are one group, in the grid's order."""
        k_pool, v_pool = self.config.kv_cache.k_cache(layer_id), self.config.kv_cache.v_cache(layer_id)
        groups = meta.width_groups
        assert groups is not None
        if len(groups) == 1:
            n = groups[0][1]
            slots = meta.kv_slots[:, :n]
            # one sequence over exactly its own keys sees them all: no mask to apply
            mask = None if batch.batch_size == 1 and not meta.windowed else meta.mask[..., :n]
            return self._decode(q, _gather_rows(k_pool, slots), _gather_rows(v_pool, slots), mask)
        out = torch.empty_like(q)
        for index, n in groups:
            assert index is not None
            slots = meta.kv_slots.index_select(0, index)[:, :n]
            mask = meta.mask.index_select(0, index)[..., :n]
            part = self._decode(
                q.index_select(0, index), _gather_rows(k_pool, slots), _gather_rows(v_pool, slots), mask
            )
            out.index_copy_(0, index, part)
        return out

    def _decode(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """One query per sequence (``q``: float32 [bs, qo_heads, head_dim]) over its keys
        (``keys``/``values``: [bs, n, kv_heads, head_dim], as gathered; ``mask`` [bs, 1, 1, n] or
        None), as two batched matmuls around a softmax, GQA by viewing each KV head's queries as
        rows.

        On a CPU this beats ``scaled_dot_product_attention``, whose flash kernel opens a parallel
        region per call for a few microseconds of work: on cores shared with other programs that
        region waits for a descheduled thread, milliseconds per layer (measured 13 ms per call on
        2 busy cores, against tens of microseconds for these ops).

        A product over the (sequence, KV head) pairs at once needs each pair's keys contiguous: a
        transposing copy of the gathered K and V, which took more than the products (64
        sequences of 200 keys, 3 KV heads of 64: 3.2 ms a layer; 32 of 600, 8 heads of 128: 102
        ms). One KV head at a time, its keys are a strided matrix BLAS reads in place (1.7 and
        12 ms); below :data:`_HEAD_BY_HEAD_ELEMENTS` gathered elements, or one sequence, whose
        pairs need no copy, the loop's calls cost more than the copy saves."""
        bs, n, kv_heads, head_dim = keys.shape
        num_heads = q.shape[1]
        rows = q.view(bs, kv_heads, num_heads // kv_heads, head_dim)  # head h reads KV head h // group
        if bs == 1 or keys.numel() < _HEAD_BY_HEAD_ELEMENTS:
            scores = torch.matmul(rows, keys.transpose(1, 2).transpose(-1, -2)).mul_(self.config.scale)
            _cap(scores, self.config.logits_soft_cap)
            if mask is not None:
                scores.masked_fill_(~mask, float("-inf"))  # [bs, 1, 1, n] broadcast over heads
            out = torch.matmul(torch.softmax(scores, dim=-1), values.transpose(1, 2))  # [bs, kv, g, head_dim]
            return out.view(bs, num_heads, head_dim)
        hidden = None if mask is None else ~mask[:, 0]  # [bs, 1, n]
        outs = []
        for h in range(kv_heads):
            scores = torch.bmm(rows[:, h], keys[:, :, h].transpose(1, 2)).mul_(
                self.config.scale
            )  # [bs, g, n]
            _cap(scores, self.config.logits_soft_cap)
            if hidden is not None:
                scores.masked_fill_(hidden, float("-inf"))
            outs.append(torch.bmm(torch.softmax(scores, dim=-1), values[:, :, h]))  # [bs, g, head_dim]
        return torch.stack(outs, dim=1).view(bs, num_heads, head_dim)

    def _each(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        meta: TorchAttentionMetadata,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """A batch of unequal sequences (one long prompt beside short ones, or beside decode rows
        in a mixed step) without the padded grid's wasted rows: each run of one-token rows through
        :meth:`_decode`, each other sequence alone. The mask still says which keys each query sees
        (the keys' padding is kept: it is the queries' that cost). ``q``: float32, token-major
        (sequence by sequence), as is the output."""
        out: list[torch.Tensor] = []
        extend_lens = batch.extend_lens_cpu
        b = token = 0
        while b < len(extend_lens):
            end = b + 1
            if extend_lens[b] == 1:  # a run of decode rows
                while end < len(extend_lens) and extend_lens[end] == 1:
                    end += 1
                rows = slice(b, end)
                out.append(
                    self._decode(
                        q[token : token + end - b],
                        keys[rows].transpose(1, 2),
                        values[rows].transpose(1, 2),
                        meta.mask[rows, :, :1],
                    )
                )
                token += end - b
            else:
                extend = extend_lens[b]
                o = _attention(
                    q[token : token + extend].transpose(0, 1)[None],  # [1, qo_heads, extend, head_dim]
                    keys[b:end],
                    values[b:end],
                    meta.mask[b:end, :, :extend],
                    self.config.scale,
                    self.config.logits_soft_cap,
                )
                out.append(o[0].transpose(0, 1))  # [extend, qo_heads, head_dim]
                token += extend
            b = end
        return torch.cat(out)

    def _cascade(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        meta: TorchAttentionMetadata,
        layer_id: int,
    ) -> torch.Tensor:
        """Decode ``queries`` [bs, qo_heads, head_dim]: own suffixes (``keys``/``values`` as
        gathered through the suffix-only grid), then each group's shared prefix, merged."""
        out, lse = self._attend(queries[:, :, None], keys, values, meta.mask)
        out, lse = out[:, :, 0], lse[:, :, 0]  # [bs, heads, head_dim], [bs, heads]
        cache = self.config.kv_cache
        assert meta.groups is not None and meta.group_slots is not None
        for group, slots in zip(meta.groups, meta.group_slots, strict=True):
            # The group's queries as the query rows of one sequence: [1, heads, n, head_dim].
            q = queries[group.start : group.end].transpose(0, 1)[None]
            k = _gather(cache.k_cache(layer_id), slots[None])
            v = _gather(cache.v_cache(layer_id), slots[None])
            prefix_out, prefix_lse = self._attend(q, k, v, None)
            rows = slice(group.start, group.end)
            out[rows] = merge_attention_states(
                prefix_out[0].transpose(0, 1),
                prefix_lse[0].transpose(0, 1),
                out[rows],
                lse[rows],
                torch.ones(group.end - group.start, dtype=torch.bool, device=q.device),
            )
        return out

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention with its log-sum-exp: ``q`` [b, qo_heads, t, d], ``k``/``v`` [b, kv_heads, s, d],
        ``mask`` [b, 1, 1, s] (the keys each sequence sees) or None. Returns the output [b, qo_heads, t, d]
        and the base-2 log-sum-exp of the scaled scores [b, qo_heads, t].

        A KV head's queries are rows of one product with its keys (``[b, kv_heads, group * t, d]``),
        not its keys repeated for each query head: ``repeat_interleave`` copied K and V ``group``
        times."""
        b, heads, t, d = q.shape
        kv_heads = k.shape[1]
        group = heads // kv_heads
        scores = _cap(
            q.reshape(b, kv_heads, group * t, d) @ k.transpose(-1, -2) * self.config.scale,
            self.config.logits_soft_cap,
        )
        if mask is not None:  # [b, 1, 1, s]: the same keys hidden from every head and query
            scores = scores.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        out = torch.exp(scores - lse[..., None]) @ v
        return out.view(b, heads, t, d), (lse * LOG2_E).view(b, heads, t)
