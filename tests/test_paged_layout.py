"""The paged layout the core computes once per batch and hands to attention backends (API 2.0):
``ForwardBatch.layout`` (device CSR) and ``ForwardBatch.host_layout`` (its offsets on the CPU),
checked against a per-sequence walk of the page table."""

from __future__ import annotations

import pytest
import torch
from minisgl_plugin_torch.backend import TorchAttentionBackend

import minisgl_core.api.batch as batch_module
from minisgl_core.api import HostPagedLayout, KVSpec, PagedLayout, paged_layout
from minisgl_core.testing.harness import make_attention
from minisgl_core.testing.paged import pages_needed, random_paged_batch

SEQ_LENS, EXTEND_LENS = [1, 16, 17, 40, 33, 5], [1, 16, 2, 1, 33, 4]


def make_batch(page_size: int):
    spec = KVSpec(num_layers=1, num_qo_heads=2, num_kv_heads=1, head_dim=8, scale=8**-0.5)
    num_pages = pages_needed(SEQ_LENS, page_size) + 2
    attn = make_attention(
        TorchAttentionBackend,
        spec,
        page_size=page_size,
        num_pages=num_pages,
        max_requests=8,
        max_context_len=48,
    )
    return random_paged_batch(
        SEQ_LENS,
        EXTEND_LENS,
        page_size=page_size,
        num_pages=num_pages,
        max_requests=8,
        max_context_len=48,
        attn=attn,
        generator=torch.Generator().manual_seed(page_size),
    )


def walk(batch, page_size: int) -> dict[str, list[int]]:
    """The layout, one sequence at a time, straight from the page table."""
    qo, kv, indices, last = [0], [0], [], []
    for i, (seq_len, extend_len) in enumerate(zip(batch.seq_lens_cpu, batch.extend_lens_cpu, strict=True)):
        slots = batch.page_table[int(batch.req_slots[i]), :seq_len].tolist()
        pages = [slot // page_size for slot in slots[::page_size]]
        # the slots of one page are contiguous: the page id alone finds them
        assert all(slot // page_size == pages[j // page_size] for j, slot in enumerate(slots))
        qo.append(qo[-1] + extend_len)
        kv.append(kv[-1] + len(pages))
        indices += pages
        last.append(seq_len - (len(pages) - 1) * page_size)
    return {"qo_indptr": qo, "kv_indptr": kv, "kv_indices": indices, "kv_last_page_len": last}


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_layout_matches_the_page_table(page_size: int) -> None:
    batch = make_batch(page_size)
    expected = walk(batch, page_size)
    layout = batch.layout
    assert isinstance(layout, PagedLayout)
    for name in PagedLayout._fields:
        tensor = getattr(layout, name)
        assert tensor.dtype == torch.int32 and tensor.device == batch.page_table.device, name
        assert tensor.tolist() == expected[name], name
    host = batch.host_layout
    assert isinstance(host, HostPagedLayout)
    for name in HostPagedLayout._fields:
        tensor = getattr(host, name)
        assert tensor.dtype == torch.int32 and tensor.device.type == "cpu", name
        assert tensor.tolist() == expected[name], name
    # the 1.x helper computes the same layout
    for name in PagedLayout._fields:
        assert getattr(paged_layout(batch, page_size), name).tolist() == expected[name], name


def test_layout_is_computed_once_per_batch(monkeypatch) -> None:
    calls = []
    real = batch_module.paged_layout

    def counting(batch, page_size):
        calls.append(page_size)
        return real(batch, page_size)

    monkeypatch.setattr(batch_module, "paged_layout", counting)
    batch = make_batch(4)
    first = batch.layout
    for _ in range(3):  # prepare_metadata, then every layer: the same object, no new computation
        assert batch.layout is first
    assert batch.host_layout is batch.host_layout
    assert calls == [4]  # the backend's page size
    # a new batch (the next step) gets its own
    assert make_batch(4).layout is not first and calls == [4, 4]
