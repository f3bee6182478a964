"""Paged attention in plain PyTorch: the CPU backend and the reference for every other backend.

Once per step, :meth:`TorchAttentionBackend.prepare_metadata` turns the page table into a padded
``[bs, max_len]`` grid of KV slots and a ``[bs, max_extend, max_len]`` causal mask; every layer
then gathers its K/V through that grid and runs one masked ``scaled_dot_product_attention`` over
the whole batch, in float32. Padding costs memory proportional to ``bs * max_len`` per layer,
which is fine on CPU and in tests but is why GPU serving uses the kernel backends.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from minisgl_core.api import AttentionBackend, ForwardBatch


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


class TorchAttentionBackend(AttentionBackend):
    """Causal paged attention with GQA for any device and page size (no CUDA graphs)."""

    capabilities = frozenset({"prefill", "decode", "page_size>1"})

    def prepare_metadata(self, batch: ForwardBatch) -> None:
        batch.attn_metadata = self.build_metadata(batch)

    def build_metadata(self, batch: ForwardBatch, max_len: int | None = None) -> TorchAttentionMetadata:
        """The metadata of ``batch``, its KV padded to ``max_len`` (default: the longest sequence)."""
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

        token_seq = torch.repeat_interleave(
            torch.arange(bs, device=device), extend_lens, output_size=num_tokens
        )
        seq_start = torch.cumsum(extend_lens, 0) - extend_lens
        token_offset = torch.arange(num_tokens, device=device) - seq_start[token_seq]
        return TorchAttentionMetadata(
            kv_slots=kv_slots,
            mask=mask[:, None],
            token_seq=token_seq,
            token_offset=token_offset,
            max_extend=max_extend,
        )

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        cache = self.config.kv_cache
        cache.store(layer_id, batch.out_cache_loc, k, v)
        meta: TorchAttentionMetadata = batch.attn_metadata
        bs, num_qo_heads, head_dim = batch.batch_size, q.shape[1], q.shape[2]

        flat = (cache.num_slots, cache.num_kv_heads, cache.head_dim)
        # [bs, max_len, kv_heads, head_dim] -> [bs, kv_heads, max_len, head_dim]
        keys = cache.k_cache(layer_id).view(flat)[meta.kv_slots].float().transpose(1, 2)
        values = cache.v_cache(layer_id).view(flat)[meta.kv_slots].float().transpose(1, 2)

        queries = q.new_zeros((bs, meta.max_extend, num_qo_heads, head_dim), dtype=torch.float32)
        queries[meta.token_seq, meta.token_offset] = q.float()
        out = F.scaled_dot_product_attention(
            queries.transpose(1, 2),
            keys,
            values,
            attn_mask=meta.mask,
            scale=self.config.scale,
            enable_gqa=num_qo_heads != cache.num_kv_heads,
        )
        # [bs, qo_heads, max_extend, head_dim] -> the new tokens, token-major
        return out.transpose(1, 2)[meta.token_seq, meta.token_offset].to(q.dtype)
