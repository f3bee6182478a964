"""Triton kernel of a batch's page ids (imported on first use; see :mod:`minisgl_core.runner.layout`)."""

import triton
import triton.language as tl


@triton.jit
def kv_indices_kernel(
    page_table,  # [rows, max_context_len] int32: KV slot of every position of every request row
    table_stride,
    req_slots,  # [bs] int32: each sequence's row
    kv_indptr,  # [bs + 1] int32: offsets of each sequence's page ids in kv_indices
    kv_indices,  # [total_pages] int32 (out)
    PAGE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Program (sequence, block of its pages): page j of the sequence is the page of its slot at
    position ``j * PAGE`` (slots of one page are contiguous)."""
    seq = tl.program_id(0)
    start = tl.load(kv_indptr + seq)
    pages = tl.load(kv_indptr + seq + 1) - start
    row = tl.load(req_slots + seq).to(tl.int64)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = j < pages
    slots = tl.load(page_table + row * table_stride + j.to(tl.int64) * PAGE, mask=mask, other=0)
    tl.store(kv_indices + start + j, slots // PAGE, mask=mask)
