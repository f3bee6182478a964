"""Mixed steps whose decode rows attend on the decode backend (by default on a GPU;
``MINISGL_SPLIT_MIXED=0`` turns it off, ``=1`` on anywhere).

A mixed step is a prefill batch whose first rows are the running decodes, one new token each
(``Scheduler._build_mixed``). The prefill backend attends all of them; on an H200 FlashInfer's
prefill kernel spent about 0.3 ms per such row where the decode step's kernels spend about
0.045 (Llama-3.1-8B, 2,200-token contexts; BENCHMARKS.md, "Where a mixed step's time goes"),
which made mixing lose on the GPU. Split, the decode rows run on the decode backend and the
prompt rows on the prefill backend, each over its own part of the batch; everything else in the
step (the GEMMs, the norms, the piecewise graphs) still runs once over all the rows. Both
backends write the same KV pool. With cascade on, the scheduler groups the decode rows that share
a cached prefix as it does a decode step's (``Scheduler.cascade_mixed``); the mixed batch's
``shared_prefixes`` then index those rows, and only the decode part sees them.

Measured on an H200 (BENCHMARKS.md, "Mixed steps split between the backends, on the GPU"):
Llama-3.1-8B at 32 req/s 1.10× the throughput of unsplit mixed steps (ITL p99 20 vs 121 ms) and
1.03× mixed steps off; Qwen3-0.6B at 64 req/s about as fast as unsplit: between the piecewise
graphs every layer launches both backends' kernels from the host, more host time than a small
model's step has GPU work.
"""

from __future__ import annotations

import torch

from minisgl_core.api import AttentionBackend, ForwardBatch
from minisgl_core.runner.layout import set_layout


def leading_decode_rows(batch: ForwardBatch) -> int:
    """How many of the batch's first rows add one token to a KV they already have: the decode
    rows a mixed step puts first (a prompt's last chunk of one token after its cached prefix
    counts too: its attention is the same)."""
    n = 0
    for new, total in zip(batch.extend_lens_cpu, batch.seq_lens_cpu):
        if new != 1 or total < 2:
            break
        n += 1
    return n


def part(
    batch: ForwardBatch, rows: slice, tokens: slice, attn: AttentionBackend, is_prefill: bool
) -> ForwardBatch:
    """The batch's ``rows`` (and their ``tokens``) as a batch of their own for ``attn``."""
    return ForwardBatch(
        is_prefill=is_prefill,
        input_ids=batch.input_ids[tokens],
        positions=batch.positions[tokens],
        out_cache_loc=batch.out_cache_loc[tokens],
        req_slots=batch.req_slots[rows],
        seq_lens=batch.seq_lens[rows],
        extend_lens=batch.extend_lens[rows],
        seq_lens_cpu=batch.seq_lens_cpu[rows],
        extend_lens_cpu=batch.extend_lens_cpu[rows],
        page_table=batch.page_table,
        logits_indices=batch.logits_indices[rows] - (tokens.start or 0),
        attn=attn,
    )


class SplitMixedAttention:
    """Stands in as a mixed step's ``batch.attn``: the leading decode rows on ``decode``, the
    rest on ``prefill``; its ``config`` is the prefill backend's (both share the KV pool and page
    size), its capabilities what both declare. Only for a pair whose ``"prestored_kv"`` agree
    (the model then stores the KV the same way for both parts)."""

    def __init__(self, prefill: AttentionBackend, decode: AttentionBackend) -> None:
        self.prefill, self.decode = prefill, decode
        self.config = prefill.config
        self.capabilities = prefill.capabilities & decode.capabilities
        self.name = f"{getattr(prefill, 'name', 'prefill')}+{getattr(decode, 'name', 'decode')}"

    @staticmethod
    def pairs(prefill: AttentionBackend, decode: AttentionBackend) -> bool:
        return prefill is not decode and (
            ("prestored_kv" in prefill.capabilities) == ("prestored_kv" in decode.capabilities)
        )

    def prepare_metadata(self, batch: ForwardBatch) -> None:
        d = leading_decode_rows(batch)
        rows = batch.batch_size
        decodes = part(batch, slice(0, d), slice(0, d), self.decode, is_prefill=False)
        decodes.shared_prefixes = batch.shared_prefixes  # the scheduler's groups of the decode rows
        prompts = part(batch, slice(d, rows), slice(d, batch.num_tokens), self.prefill, is_prefill=True)
        for sub in (decodes, prompts):
            set_layout(sub)
            sub.attn.prepare_metadata(sub)
        batch.attn_metadata = (d, decodes, prompts)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        d, decodes, prompts = batch.attn_metadata
        return torch.cat(
            (
                self.decode.forward(q[:d], k[:d], v[:d], layer_id, decodes),
                self.prefill.forward(q[d:], k[d:], v[d:], layer_id, prompts),
            )
        )

    def attend(self, q: torch.Tensor, layer_id: int, batch: ForwardBatch) -> torch.Tensor:
        d, decodes, prompts = batch.attn_metadata
        return torch.cat(
            (self.decode.attend(q[:d], layer_id, decodes), self.prefill.attend(q[d:], layer_id, prompts))
        )
