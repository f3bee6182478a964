"""A minimal paged attention backend: each sequence on its own, in float32, with plain tensor ops.

Short rather than fast: it shows the whole contract of :class:`~minisgl_core.api.AttentionBackend`
(write the new K/V at ``out_cache_loc``, attend causally over each sequence's paged KV, GQA,
any page size). Kernels backends keep this shape and swap the loop for a batched kernel.
"""

from __future__ import annotations

import torch

from minisgl_core.api import AttentionBackend, ForwardBatch


class ExampleAttentionBackend(AttentionBackend):
    # What the conformance kit tests; "cuda_graph" would also need the three graph methods.
    capabilities = frozenset({"prefill", "decode", "page_size>1"})

    def prepare_metadata(self, batch: ForwardBatch) -> None:
        # Once per step, shared by every layer: the KV slots of each sequence, in position order,
        # from the page layout the core computed for this batch (page ids on the batch's device,
        # offsets on the host: no device sync).
        page_size, pages = self.config.page_size, batch.layout.kv_indices.long()
        starts = batch.host_layout.kv_indptr.tolist()
        in_page = torch.arange(page_size, device=pages.device)
        batch.attn_metadata = [
            (pages[starts[i] : starts[i + 1], None] * page_size + in_page).flatten()[:n]
            for i, n in enumerate(batch.seq_lens_cpu)
        ]

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        cache = self.config.kv_cache
        cache.store(layer_id, batch.out_cache_loc, k, v)  # first, so new tokens see themselves
        flat = (cache.num_slots, cache.num_kv_heads, cache.head_dim)
        all_keys, all_values = cache.k_cache(layer_id).view(flat), cache.v_cache(layer_id).view(flat)
        group = q.shape[1] // cache.num_kv_heads  # query heads per KV head (GQA)
        out = torch.empty_like(q)
        start = 0
        for slots, new in zip(batch.attn_metadata, batch.extend_lens_cpu, strict=True):
            queries = q[start : start + new].float()  # [new, heads, dim]
            keys = all_keys[slots].float().repeat_interleave(group, dim=1)  # [seq_len, heads, dim]
            values = all_values[slots].float().repeat_interleave(group, dim=1)
            scores = torch.einsum("qhd,khd->hqk", queries, keys) * self.config.scale
            # The new tokens are the last `new` positions: query i sits at position prefix + i.
            prefix = slots.numel() - new
            query_pos = prefix + torch.arange(new, device=q.device)
            future = torch.arange(slots.numel(), device=q.device)[None, :] > query_pos[:, None]
            scores.masked_fill_(future, float("-inf"))
            out[start : start + new] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values).to(q.dtype)
            start += new
        return out
