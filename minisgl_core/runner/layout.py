"""A batch's paged layout (``ForwardBatch.layout``) with one copy and one kernel on CUDA.

``api.batch.paged_layout`` builds it from the device tensors with ≈ 20 small torch ops (cumsums,
``repeat_interleave``, gathers), each a kernel launch paid on the host before every step's
attention plan. The offsets and last-page lengths follow from the host-side lengths
(``ForwardBatch.host_layout``), so they go over in one packed copy; the page ids, which need the
page table on the device, come from one Triton kernel. The core sets ``batch.layout`` with this
before the backend plans (a cached property: the backend then reads this one).
"""

from __future__ import annotations

import functools

import torch

from minisgl_core.api.batch import ForwardBatch, PagedLayout, paged_layout
from minisgl_core.runner.sampler import copy_to_device

_BLOCK = 64


def fast_layout_enabled(device: torch.device) -> bool:
    from minisgl_core.layers.triton_ops import triton_enabled

    return triton_enabled(device, "MINISGL_COMPILE")


def set_layout(batch: ForwardBatch) -> None:
    """Compute ``batch.layout`` (once) the fast way where Triton runs, else as the API does."""
    if "layout" in batch.__dict__:
        return
    if fast_layout_enabled(batch.seq_lens.device):
        batch.layout = build_layout(batch)  # type: ignore[misc]  # fills the cached property


class FastLayoutBatch(ForwardBatch):
    """A batch whose ``layout`` is built the fast way (:func:`build_layout`) when something first
    reads it, and not at all otherwise: a decode graph's replay batch, whose backend may plan from
    the layout (FlashInfer) or read the page table itself (the Triton decode plugin reads none, so
    building it eagerly cost every decode step a packed copy, two allocations and a kernel launch
    of host time)."""

    @functools.cached_property
    def layout(self) -> PagedLayout:
        return build_layout(self)


def build_layout(batch: ForwardBatch) -> PagedLayout:
    page_size = batch.attn.config.page_size
    host = batch.host_layout
    bs = batch.batch_size
    device = batch.seq_lens.device
    # qo_indptr | kv_indptr | kv_last_page_len in one host tensor, one copy; each part starts
    # 64-byte aligned (Triton compiles another variant for a pointer that is not 16-byte aligned:
    # a compile in the middle of a run, see Scheduler._forward_batch)
    width = -(-(bs + 1) // 16) * 16
    packed = torch.zeros(3, width, dtype=torch.int32)
    packed[0, : bs + 1] = host.qo_indptr
    packed[1, : bs + 1] = host.kv_indptr
    packed[2, :bs] = host.kv_last_page_len
    packed = copy_to_device(packed, device)
    qo_indptr, kv_indptr, last = packed[0, : bs + 1], packed[1, : bs + 1], packed[2, :bs]
    total = int(host.kv_indptr[-1])
    kv_indices = torch.empty(total, dtype=torch.int32, device=device)
    if total:
        from minisgl_core.runner._layout_triton import kv_indices_kernel

        most = -(-max(batch.seq_lens_cpu) // page_size)
        table = batch.page_table
        kv_indices_kernel[(bs, -(-most // _BLOCK))](
            table, table.stride(0), batch.req_slots, kv_indptr, kv_indices, PAGE=page_size, BLOCK=_BLOCK
        )
    return PagedLayout(qo_indptr, kv_indptr, kv_indices, last)


__all__ = ["FastLayoutBatch", "build_layout", "paged_layout", "set_layout"]
