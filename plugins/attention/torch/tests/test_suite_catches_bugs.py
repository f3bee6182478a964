"""The conformance suite must fail backends with typical bugs; each mutant of the torch backend
below has one, and running a suite test against it has to raise."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from minisgl_plugin_torch.backend import TorchAttentionBackend

from minisgl_core.api import ForwardBatch
from minisgl_core.testing.attention_suite import AttentionBackendSuite, Shape


class DefaultScale(TorchAttentionBackend):
    def forward(self, q, k, v, layer_id, batch):
        self.config = dataclasses.replace(self.config, scale=1 / math.sqrt(q.shape[-1]))
        return super().forward(q, k, v, layer_id, batch)


class AttendsBeforeStoring(TorchAttentionBackend):
    def forward(self, q, k, v, layer_id, batch):
        store = self.config.kv_cache.store
        self.config.kv_cache.store = lambda *args: None  # type: ignore[method-assign]
        try:
            out = super().forward(q, k, v, layer_id, batch)
        finally:
            self.config.kv_cache.store = store  # type: ignore[method-assign]
        store(layer_id, batch.out_cache_loc, k, v)
        return out


class ReadsLayerZero(TorchAttentionBackend):
    def forward(self, q, k, v, layer_id, batch):
        self.config.kv_cache.store(layer_id, batch.out_cache_loc, k, v)
        return super().forward(q, k, v, 0, batch)


class NotCausal(TorchAttentionBackend):
    def prepare_metadata(self, batch: ForwardBatch) -> None:
        super().prepare_metadata(batch)
        meta = batch.attn_metadata
        valid = torch.arange(meta.mask.shape[-1]) < batch.seq_lens.long()[:, None]
        batch.attn_metadata = meta._replace(mask=valid[:, None, None, :].expand_as(meta.mask))


class ReadsPastSequenceEnd(TorchAttentionBackend):
    def prepare_metadata(self, batch: ForwardBatch) -> None:
        super().prepare_metadata(batch)
        meta = batch.attn_metadata
        width = meta.kv_slots.shape[1] + 1
        slots = batch.page_table[batch.req_slots.long(), :width].long()
        batch.attn_metadata = meta._replace(kv_slots=slots, mask=F.pad(meta.mask, (0, 1), value=True))


class WrongGqaGrouping(TorchAttentionBackend):
    def forward(self, q, k, v, layer_id, batch):
        heads = q.shape[1]
        order = torch.arange(heads).view(-1, self.config.num_kv_heads).t().flatten()  # interleaved
        out = super().forward(q[:, order], k, v, layer_id, batch)
        return out[:, torch.argsort(order)]


class WritesOneSlotTooMany(TorchAttentionBackend):
    def forward(self, q, k, v, layer_id, batch):
        written = set(batch.out_cache_loc.tolist())
        other = next(slot for slot in range(self.config.kv_cache.num_slots) if slot not in written)
        self.config.kv_cache.store(layer_id, torch.tensor([other]), k[:1], v[:1])
        return super().forward(q, k, v, layer_id, batch)


class CascadeDropsThePrefix(TorchAttentionBackend):
    """Cascade decode that attends to each grouped sequence's own suffix only."""

    def prepare_metadata(self, batch: ForwardBatch) -> None:
        super().prepare_metadata(batch)
        meta = batch.attn_metadata
        if meta.groups:
            batch.attn_metadata = meta._replace(groups=[], group_slots=[])


class CascadeAveragesInsteadOfMerging(TorchAttentionBackend):
    """Merges the prefix and suffix results with equal weights instead of by log-sum-exp."""

    def _attend(self, q, k, v, mask):
        out, lse = super()._attend(q, k, v, mask)
        return out, torch.zeros_like(lse)


class CascadeStopsAPageShort(TorchAttentionBackend):
    """Reads one page less of each shared prefix than the group shares."""

    def prepare_metadata(self, batch: ForwardBatch) -> None:
        super().prepare_metadata(batch)
        meta = batch.attn_metadata
        if meta.groups:
            page = self.config.page_size
            batch.attn_metadata = meta._replace(group_slots=[s[:-page] for s in meta.group_slots])


class OneTokenRowsSeeOnlyThemselves(TorchAttentionBackend):
    """In a prefill batch, treats a row with one new token as a fresh one-token prompt (a kernel
    that takes extend length 1 for "no cached prefix"): mixed steps' decode rows lose their KV."""

    def prepare_metadata(self, batch: ForwardBatch) -> None:
        super().prepare_metadata(batch)
        if not batch.is_prefill:
            return
        meta = batch.attn_metadata
        mask = meta.mask.clone()
        for b, (seq, ext) in enumerate(zip(batch.seq_lens_cpu, batch.extend_lens_cpu)):
            if ext == 1:
                mask[b, 0, 0, :] = torch.arange(mask.shape[-1]) == seq - 1
        batch.attn_metadata = meta._replace(mask=mask)


class IgnoresSoftCap(TorchAttentionBackend):
    """Declares "soft_cap" (API 2.6) but attends with uncapped scores."""

    def prepare_metadata(self, batch: ForwardBatch) -> None:
        self.config = dataclasses.replace(self.config, logits_soft_cap=0.0)
        super().prepare_metadata(batch)


class CapsOnlyPrefill(TorchAttentionBackend):
    """Caps only prefill steps' scores: decode steps (another path on a CPU) run uncapped."""

    def prepare_metadata(self, batch: ForwardBatch) -> None:
        if not batch.is_prefill:
            self.config = dataclasses.replace(self.config, logits_soft_cap=0.0)
        super().prepare_metadata(batch)


MUTANTS = [
    DefaultScale,
    AttendsBeforeStoring,
    ReadsLayerZero,
    NotCausal,
    ReadsPastSequenceEnd,
    WrongGqaGrouping,
    WritesOneSlotTooMany,
]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.__name__)
@pytest.mark.parametrize(
    "test_name", ["test_extend_with_cached_prefix", "test_mixed_batch", "test_mixed_step"]
)
def test_suite_rejects(mutant: type[TorchAttentionBackend], test_name: str) -> None:
    suite = type("MutantSuite", (AttentionBackendSuite,), {"backend_cls": mutant})()
    generator = torch.Generator().manual_seed(1)
    with pytest.raises(AssertionError):
        getattr(suite, test_name)(Shape(2, 4, 64, 16), generator)


@pytest.mark.parametrize(
    "mutant",
    [CascadeDropsThePrefix, CascadeAveragesInsteadOfMerging, CascadeStopsAPageShort],
    ids=lambda m: m.__name__,
)
def test_suite_rejects_cascade_bugs(mutant: type[TorchAttentionBackend]) -> None:
    suite = type("MutantSuite", (AttentionBackendSuite,), {"backend_cls": mutant})()
    with pytest.raises(AssertionError):
        suite.test_cascade_decode(Shape(2, 4, 64, 16), torch.Generator().manual_seed(1))


@pytest.mark.parametrize("mutant", [IgnoresSoftCap, CapsOnlyPrefill], ids=lambda m: m.__name__)
def test_suite_rejects_a_backend_declaring_soft_cap_that_does_not_cap(
    mutant: type[TorchAttentionBackend],
) -> None:
    suite = type("MutantSuite", (AttentionBackendSuite,), {"backend_cls": mutant})()
    with pytest.raises(AssertionError):
        suite.test_soft_cap(torch.Generator().manual_seed(1))


@pytest.mark.parametrize("page_size", [1, 16])
def test_suite_rejects_a_prefill_path_without_decode_rows(page_size: int) -> None:
    suite = type("MutantSuite", (AttentionBackendSuite,), {"backend_cls": OneTokenRowsSeeOnlyThemselves})()
    with pytest.raises(AssertionError):
        suite.test_mixed_step(Shape(2, 4, 64, page_size), torch.Generator().manual_seed(1))


def test_suite_accepts_the_unmutated_backend() -> None:
    suite = type("PlainSuite", (AttentionBackendSuite,), {"backend_cls": TorchAttentionBackend})()
    for test_name in (
        "test_extend_with_cached_prefix",
        "test_mixed_batch",
        "test_mixed_step",
        "test_cascade_decode",
    ):
        getattr(suite, test_name)(Shape(2, 4, 64, 16), torch.Generator().manual_seed(1))
    suite.test_soft_cap(torch.Generator().manual_seed(1))
