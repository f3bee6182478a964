"""Hand-built :class:`ForwardBatch` es for tests: a few sequences over a paged KV pool whose slots
are handed out in shuffled page order, so models and attention backends are exercised on a
non-contiguous layout without the scheduler."""

from __future__ import annotations

from typing import Any

import torch

from minisgl_core.api import AttentionBackend, AttentionConfig, ForwardBatch, KVCache, KVSpec, Model


def make_attention(
    backend_cls: type[AttentionBackend],
    kv_spec: KVSpec,
    *,
    page_size: int = 1,
    num_pages: int = 256,
    max_requests: int = 8,
    max_context_len: int = 256,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> AttentionBackend:
    """An attention backend over a fresh KV pool sized for ``kv_spec``."""
    device = torch.device(device)
    kv_cache = KVCache(
        num_layers=kv_spec.num_layers,
        num_pages=num_pages,
        page_size=page_size,
        num_kv_heads=kv_spec.num_kv_heads,
        head_dim=kv_spec.head_dim,
        dtype=dtype,
        device=device,
    )
    config = AttentionConfig(
        num_qo_heads=kv_spec.num_qo_heads,
        num_kv_heads=kv_spec.num_kv_heads,
        head_dim=kv_spec.head_dim,
        scale=kv_spec.scale,
        page_size=page_size,
        dtype=dtype,
        device=device,
        max_requests=max_requests,
        max_context_len=max_context_len,
        kv_cache=kv_cache,
        logits_soft_cap=kv_spec.logits_soft_cap,
        sliding_window=kv_spec.sliding_window,
        window_layers=kv_spec.window_layers,
    )
    return backend_cls(config)


class PagedSequences:
    """Sequences living in rows of a page table, each grown by :meth:`extend` steps.

    Pages are taken from a seeded random permutation of the pool, so neighbouring pages of one
    sequence are scattered."""

    def __init__(self, attn: AttentionBackend, *, seed: int = 0) -> None:
        config = attn.config
        self.attn = attn
        self.page_size = config.page_size
        self.device = config.device
        self.page_table = torch.zeros(
            config.max_requests, config.max_context_len, dtype=torch.int32, device=self.device
        )
        generator = torch.Generator().manual_seed(seed)
        self._free_pages = torch.randperm(config.kv_cache.num_pages, generator=generator).tolist()
        self._pages: dict[int, list[int]] = {}
        self.seq_lens: dict[int, int] = {}

    def new_row(self) -> int:
        row = len(self.seq_lens)
        if row >= self.page_table.shape[0]:
            raise ValueError("page table is full")
        self._pages[row], self.seq_lens[row] = [], 0
        return row

    def extend(
        self, rows: list[int], new_tokens: list[list[int]], *, is_prefill: bool | None = None
    ) -> ForwardBatch:
        """One step appending ``new_tokens[i]`` to sequence ``rows[i]``; metadata already prepared.

        ``is_prefill`` defaults to "some sequence gets more than one token"."""
        input_ids: list[int] = []
        positions: list[int] = []
        locs: list[int] = []
        for row, tokens in zip(rows, new_tokens, strict=True):
            start = self.seq_lens[row]
            slots = self._grow(row, start + len(tokens))
            input_ids += tokens
            positions += range(start, start + len(tokens))
            locs += slots[start:]
        extend_lens = [len(tokens) for tokens in new_tokens]
        seq_lens = [self.seq_lens[row] for row in rows]
        as_tensor = self._tensor
        batch = ForwardBatch(
            is_prefill=any(n > 1 for n in extend_lens) if is_prefill is None else is_prefill,
            input_ids=as_tensor(input_ids, torch.int64),
            positions=as_tensor(positions, torch.int64),
            out_cache_loc=as_tensor(locs, torch.int64),
            req_slots=as_tensor(rows, torch.int32),
            seq_lens=as_tensor(seq_lens, torch.int32),
            extend_lens=as_tensor(extend_lens, torch.int32),
            seq_lens_cpu=seq_lens,
            extend_lens_cpu=extend_lens,
            page_table=self.page_table,
            logits_indices=as_tensor([sum(extend_lens[: i + 1]) - 1 for i in range(len(rows))], torch.int64),
            attn=self.attn,
        )
        self.attn.prepare_metadata(batch)
        return batch

    def _tensor(self, values: list[Any], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)

    def _grow(self, row: int, new_len: int) -> list[int]:
        pages = self._pages[row]
        while len(pages) * self.page_size < new_len:
            if not self._free_pages:
                raise ValueError("KV pool is full")
            pages.append(self._free_pages.pop())
        slots = [page * self.page_size + offset for page in pages for offset in range(self.page_size)][
            :new_len
        ]
        self.page_table[row, :new_len] = self._tensor(slots, torch.int32)
        self.seq_lens[row] = new_len
        return slots


@torch.inference_mode()
def greedy_generate(
    model: Model, attn: AttentionBackend, prompt: list[int], steps: int, *, seed: int = 0
) -> tuple[list[int], list[torch.Tensor]]:
    """Prefill ``prompt`` as one sequence, then ``steps`` greedy decode steps.

    Returns ``steps + 1`` greedy tokens and the [vocab] float32 logits they are the argmax of: the
    prefill's, then each decode step's (the last token is predicted but never fed back)."""
    sequences = PagedSequences(attn, seed=seed)
    row = sequences.new_row()
    logits = [model(sequences.extend([row], [prompt]))[0].float()]
    tokens: list[int] = []
    for _ in range(steps):
        tokens.append(int(logits[-1].argmax()))
        logits.append(model(sequences.extend([row], [[tokens[-1]]], is_prefill=False))[0].float())
    tokens.append(int(logits[-1].argmax()))
    return tokens, logits
