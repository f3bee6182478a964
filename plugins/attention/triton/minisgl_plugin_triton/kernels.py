"""The Triton kernels of the decode backend; imported on first use (Triton is not imported with the plugin).

:func:`decode_kernel`: one program per (KV head, sequence, split) reads the split's share of the
sequence's KV, the slot of each position straight from the page table, and attends all the query
heads of its GQA group at once (``BLOCK_H`` rows of one tensor-core product, padded to 16). A
float8 e4m3 pool is widened to float16 in registers (one ``cvt`` per pair of values) and the
products run in float16 with float32 sums; a bf16/fp16 pool runs in its own dtype. Softmax in
base 2 (``scale_log2`` is the softmax scale times log2(e)). With one split the program writes the
output; with several it writes its normalised partial output and its log2-sum-exp, and
:func:`merge_kernel` combines the splits of each (sequence, head).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    page_table_ptr,
    req_slots_ptr,
    seq_lens_ptr,
    order_ptr,
    out_ptr,
    part_ptr,
    lse_ptr,
    scale_log2,
    q_stride_token,
    q_stride_head,
    kv_stride_slot,
    page_table_stride,
    out_stride_token,
    out_stride_head,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    WIDEN_FP8: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    # heads vary fastest in the launch order, and sequences come longest first (``order``), so
    # the longest programs start first and the short ones fill in behind them
    kv_head = tl.program_id(0)
    seq = tl.load(order_ptr + tl.program_id(1))
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    row = tl.load(req_slots_ptr + seq).to(tl.int64)
    # whole blocks per split, so only the sequence's last block is partial
    per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)

    rows = tl.arange(0, BLOCK_H)
    head = kv_head * GROUP + rows
    head_ok = rows < GROUP
    dims = tl.arange(0, HEAD_DIM)
    q_offsets = seq.to(tl.int64) * q_stride_token + head[:, None] * q_stride_head + dims[None, :]
    q = tl.load(q_ptr + q_offsets, mask=head_ok[:, None], other=0.0)
    if WIDEN_FP8:
        q = q.to(tl.float16)
    if DOT_FP32:  # the CPU interpreter's bf16 products are wrong (Triton 3.6); its float32 ones are not
        q = q.to(tl.float32)

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    table_row = page_table_ptr + row * page_table_stride
    columns = kv_head * HEAD_DIM + dims
    for block in range(start, end, BLOCK_N):
        pos = block + tl.arange(0, BLOCK_N)
        valid = pos < end
        slot = tl.load(table_row + pos, mask=valid, other=0).to(tl.int64)
        kv_offsets = slot[:, None] * kv_stride_slot + columns[None, :]
        k = tl.load(k_ptr + kv_offsets, mask=valid[:, None], other=0.0).to(q.dtype)
        scores = tl.dot(q, tl.trans(k)) * scale_log2
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv_offsets, mask=valid[:, None], other=0.0).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v)
        m = m_new

    nonempty = l_sum > 0
    o = acc / tl.where(nonempty, l_sum, 1.0)[:, None]
    if NUM_SPLITS == 1:
        out_offsets = seq.to(tl.int64) * out_stride_token + head[:, None] * out_stride_head + dims[None, :]
        tl.store(out_ptr + out_offsets, o.to(out_ptr.dtype.element_ty), mask=head_ok[:, None])
    else:
        entry = (seq.to(tl.int64) * NUM_HEADS + head) * NUM_SPLITS + split
        tl.store(part_ptr + entry[:, None] * HEAD_DIM + dims[None, :], o, mask=head_ok[:, None])
        lse = tl.where(nonempty, m + tl.log2(l_sum), float("-inf"))
        tl.store(lse_ptr + entry, lse, mask=head_ok)


@triton.jit
def merge_kernel(
    part_ptr,
    lse_ptr,
    out_ptr,
    out_stride_token,
    out_stride_head,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, NUM_SPLITS)
    dims = tl.arange(0, HEAD_DIM)
    entry = (seq.to(tl.int64) * NUM_HEADS + head) * NUM_SPLITS + splits
    lse = tl.load(lse_ptr + entry)
    top = tl.max(lse, 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # no KV at all: zeros rather than NaN
    weight = tl.exp2(lse - top)
    parts = tl.load(part_ptr + entry[:, None] * HEAD_DIM + dims[None, :])
    total = tl.sum(weight, 0)
    o = tl.sum(parts * weight[:, None], 0) / tl.where(total > 0, total, 1.0)
    out_offsets = seq.to(tl.int64) * out_stride_token + head * out_stride_head + dims
    tl.store(out_ptr + out_offsets, o.to(out_ptr.dtype.element_ty))
