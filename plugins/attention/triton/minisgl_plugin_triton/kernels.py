"""The Triton kernels of the decode backend; imported on first use (Triton is not imported with the plugin).

:func:`decode_kernel`: one program per (KV head, sequence, split) reads the split's share of the
sequence's KV, the slot of each position straight from the page table, and attends all the query
heads of its GQA group at once (``BLOCK_H`` rows of one tensor-core product, padded to 16). A
float8 e4m3 pool is widened to float16 in registers (one ``cvt`` per pair of values) and the
products run in float16 with float32 sums; a bf16/fp16 pool runs in its own dtype. Softmax in
base 2 (``scale_log2`` is the softmax scale times log2(e)). With one split the program writes the
output; with several it writes its normalised partial output and its log2-sum-exp, and
:func:`merge_kernel` combines the splits of each (sequence, head).

In bf16 / fp16 the probabilities enter the P·V product either as two terms of the pool's dtype
(``EXACT_PV``: ``P_hi`` and ``P_lo = P - P_hi``), so the product is float32-accurate (V is exact
in its own dtype, only the output's final rounding remains), or rounded once, and then the
softmax's denominator sums the same rounded values, so the output stays a weighted mean of V
(dividing by the unrounded sum biases it by V's mean times the rounding error).

Cascade (``CASCADE``): sequences sharing a cached prefix start at ``skip[seq]``, and
:func:`prefix_kernel` reads each shared prefix once for all of a group's members (their query
heads are the rows of one product), writing one more partial per split of the prefix; the merge
then always runs and takes the prefix's partials only for sequences with ``skip > 0``.
"""

from __future__ import annotations

import triton
import triton.language as tl

try:  # programmatic dependent launch (minisgl_core.layers.triton_ops.pdl_enabled)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def _attend(
    q, m, l_sum, acc, table_row, start, end, k_ptr, v_ptr, kv_stride_slot, columns, scale_log2,
    BLOCK_N: tl.constexpr, EXACT_PV: tl.constexpr,
):  # fmt: skip
    """Online softmax of ``q``'s rows over positions ``start .. end - 1`` of one page-table row."""
    for block in range(start, end, BLOCK_N):
        pos = block + tl.arange(0, BLOCK_N)
        valid = pos < end
        slot = tl.load(table_row + pos, mask=valid, other=0).to(tl.int64)
        kv_offsets = slot[:, None] * kv_stride_slot + columns[None, :]
        k = tl.load(k_ptr + kv_offsets, mask=valid[:, None], other=0.0).to(q.dtype)
        if q.dtype == tl.float32:  # float32 products in float32 (a GPU's default is TF32: 10 bits)
            scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale_log2
        else:
            scores = tl.dot(q, tl.trans(k)) * scale_log2
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        v = tl.load(v_ptr + kv_offsets, mask=valid[:, None], other=0.0).to(q.dtype)
        p_hi = p.to(q.dtype)
        if q.dtype == tl.float32:
            pv = tl.dot(p_hi, v, input_precision="ieee")
        else:
            pv = tl.dot(p_hi, v)
        if EXACT_PV:  # the rounding error of P as a second product: P·V as exact as float32
            pv += tl.dot((p - p_hi.to(tl.float32)).to(q.dtype), v)
        else:  # normalise by the rounded weights the product used: a true weighted mean of V
            p = p_hi.to(tl.float32)
        l_sum = l_sum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + pv
        m = m_new
    return m, l_sum, acc


@triton.jit
def _prefetch_l2(ptrs):
    """``prefetch.global.L2`` of each address: its 128-byte line brought into L2, nothing read into
    registers, no value changed (before a PDL wait, for data the kernel before does not write).
    Inline PTX: compiled for CUDA only."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _write_partial(part_ptr, lse_ptr, entry, o, m, l_sum, nonempty, row_ok, dims, HEAD_DIM: tl.constexpr):
    """A normalised partial output and its log2-sum-exp (-inf where no position was read)."""
    tl.store(part_ptr + entry[:, None] * HEAD_DIM + dims[None, :], o, mask=row_ok[:, None])
    lse = tl.where(nonempty, m + tl.log2(l_sum), float("-inf"))
    tl.store(lse_ptr + entry, lse, mask=row_ok)


@triton.jit
def decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    page_table_ptr,
    req_slots_ptr,
    seq_lens_ptr,
    order_ptr,
    skip_ptr,
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
    ENTRIES: tl.constexpr,
    CASCADE: tl.constexpr,
    WIDEN_FP8: tl.constexpr,
    DOT_FP32: tl.constexpr,
    EXACT_PV: tl.constexpr,
    PDL: tl.constexpr = False,  # compiled for programmatic dependent launch
    EARLY: tl.constexpr = False,  # the first blocks' K and V prefetched into L2 before the wait (see below)
    EARLY_BLOCKS: tl.constexpr = 1,
    EARLY_LINE: tl.constexpr = 64,  # elements a prefetch covers: a 128-byte line, at most a head's row
    WINDOW: tl.constexpr = 0,  # the layer's sliding window (API 2.7): its last WINDOW positions; 0: all
):
    if PDL and not EARLY:  # wait for the kernel before, then let the one after start launching
        gdc_wait()
        gdc_launch_dependents()
    # heads vary fastest in the launch order, and sequences come longest first (``order``), so
    # the longest programs start first and the short ones fill in behind them
    kv_head = tl.program_id(0)
    seq = tl.load(order_ptr + tl.program_id(1))
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    row = tl.load(req_slots_ptr + seq).to(tl.int64)
    first = 0
    if WINDOW:  # the query, at seq_len - 1, sees the positions after seq_len - 1 - WINDOW
        first = tl.maximum(seq_len - WINDOW, 0)
    if CASCADE:  # a shared prefix is the prefix kernel's: this sequence's own part starts after it
        first = tl.load(skip_ptr + seq)
    # whole blocks per split, so only the sequence's last block is partial
    per_split = tl.cdiv(tl.cdiv(seq_len - first, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = first + split * per_split
    end = tl.minimum(start + per_split, seq_len)

    rows = tl.arange(0, BLOCK_H)
    head = kv_head * GROUP + rows
    head_ok = rows < GROUP
    dims = tl.arange(0, HEAD_DIM)
    table_row = page_table_ptr + row * page_table_stride
    columns = kv_head * HEAD_DIM + dims
    if EARLY:
        # Launched with PDL, this program starts while the kernel before it (the one writing q
        # and the new token's K and V) still runs: bring its first EARLY_BLOCKS blocks of K and V
        # into L2 meanwhile (one prefetch a 128-byte line, or a shorter head row; nothing held in
        # registers, which a first version did at the cost of its occupancy; L2 is where that
        # kernel's writes land, so no stale value can be read), then wait. The step's metadata
        # and the page table were written before that kernel started.
        pos0 = start + tl.arange(0, EARLY_BLOCKS * BLOCK_N)
        slot0 = tl.load(table_row + pos0, mask=pos0 < end, other=0).to(tl.int64)
        lines = kv_head * HEAD_DIM + tl.arange(0, HEAD_DIM // EARLY_LINE) * EARLY_LINE
        offsets = tl.where((pos0 < end)[:, None], slot0[:, None] * kv_stride_slot + lines[None, :], 0)
        _prefetch_l2(k_ptr + offsets)
        _prefetch_l2(v_ptr + offsets)
        if PDL:
            gdc_wait()
            gdc_launch_dependents()
    q_offsets = seq.to(tl.int64) * q_stride_token + head[:, None] * q_stride_head + dims[None, :]
    q = tl.load(q_ptr + q_offsets, mask=head_ok[:, None], other=0.0)
    if WIDEN_FP8:
        q = q.to(tl.float16)
    if DOT_FP32:  # the CPU interpreter's bf16 products are wrong (Triton 3.6); its float32 ones are not
        q = q.to(tl.float32)

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    m, l_sum, acc = _attend(
        q, m, l_sum, acc, table_row, start, end, k_ptr, v_ptr, kv_stride_slot, columns, scale_log2,
        BLOCK_N, EXACT_PV,
    )  # fmt: skip

    nonempty = l_sum > 0
    o = acc / tl.where(nonempty, l_sum, 1.0)[:, None]
    if ENTRIES == 1:
        out_offsets = seq.to(tl.int64) * out_stride_token + head[:, None] * out_stride_head + dims[None, :]
        tl.store(out_ptr + out_offsets, o.to(out_ptr.dtype.element_ty), mask=head_ok[:, None])
    else:
        entry = (seq.to(tl.int64) * NUM_HEADS + head) * ENTRIES + split
        _write_partial(part_ptr, lse_ptr, entry, o, m, l_sum, nonempty, head_ok, dims, HEAD_DIM)


@triton.jit
def prefix_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    page_table_ptr,
    req_slots_ptr,
    tasks_ptr,
    part_ptr,
    lse_ptr,
    scale_log2,
    q_stride_token,
    q_stride_head,
    kv_stride_slot,
    page_table_stride,
    tasks_stride,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    PREFIX_SPLITS: tl.constexpr,
    WIDEN_FP8: tl.constexpr,
    DOT_FP32: tl.constexpr,
    EXACT_PV: tl.constexpr,
    PDL: tl.constexpr = False,  # compiled for programmatic dependent launch
):
    """One program per (KV head, task, prefix split). A task is up to ``BLOCK_M // GROUP``
    consecutive sequences sharing their first ``length`` positions (``tasks`` rows: first
    sequence, count, length; count 0 = no task): the prefix's KV is read once, through the first
    member's page-table row, for the query heads of all of them."""
    if PDL:  # wait for the kernel before, then let the one after start launching
        gdc_wait()
        gdc_launch_dependents()
    kv_head = tl.program_id(0)
    task = tl.program_id(1)
    split = tl.program_id(2)
    first = tl.load(tasks_ptr + task)
    count = tl.load(tasks_ptr + tasks_stride + task)
    length = tl.load(tasks_ptr + 2 * tasks_stride + task)
    row = tl.load(req_slots_ptr + first).to(tl.int64)
    per_split = tl.cdiv(tl.cdiv(length, PREFIX_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, length)

    rows = tl.arange(0, BLOCK_M)
    member = rows // GROUP
    row_ok = member < count
    seq = (first + member).to(tl.int64)
    head = kv_head * GROUP + rows % GROUP
    dims = tl.arange(0, HEAD_DIM)
    q_offsets = seq[:, None] * q_stride_token + head[:, None] * q_stride_head + dims[None, :]
    q = tl.load(q_ptr + q_offsets, mask=row_ok[:, None], other=0.0)
    if WIDEN_FP8:
        q = q.to(tl.float16)
    if DOT_FP32:
        q = q.to(tl.float32)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    table_row = page_table_ptr + row * page_table_stride
    columns = kv_head * HEAD_DIM + dims
    m, l_sum, acc = _attend(
        q, m, l_sum, acc, table_row, start, end, k_ptr, v_ptr, kv_stride_slot, columns, scale_log2,
        BLOCK_N, EXACT_PV,
    )  # fmt: skip
    nonempty = l_sum > 0
    o = acc / tl.where(nonempty, l_sum, 1.0)[:, None]
    entry = (seq * NUM_HEADS + head) * (NUM_SPLITS + PREFIX_SPLITS) + NUM_SPLITS + split
    _write_partial(part_ptr, lse_ptr, entry, o, m, l_sum, nonempty, row_ok, dims, HEAD_DIM)


@triton.jit
def merge_kernel(
    part_ptr,
    lse_ptr,
    skip_ptr,
    out_ptr,
    out_stride_token,
    out_stride_head,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    ENTRIES: tl.constexpr,
    OWN_ENTRIES: tl.constexpr,
    ENTRIES_P2: tl.constexpr,
    CASCADE: tl.constexpr,
    PDL: tl.constexpr = False,  # compiled for programmatic dependent launch
):
    """Combines each (sequence, head)'s ``ENTRIES`` partials by their log2-sum-exp: the first
    ``OWN_ENTRIES`` are the sequence's own splits, the rest (cascade) its shared prefix's, read
    only where the sequence has one (``skip > 0``)."""
    if PDL:  # wait for the kernel before, then let the one after start launching
        gdc_wait()
        gdc_launch_dependents()
    seq = tl.program_id(0)
    head = tl.program_id(1)
    index = tl.arange(0, ENTRIES_P2)
    used = index < ENTRIES
    if CASCADE:
        used &= (index < OWN_ENTRIES) | (tl.load(skip_ptr + seq) > 0)
    dims = tl.arange(0, HEAD_DIM)
    entry = (seq.to(tl.int64) * NUM_HEADS + head) * ENTRIES + index
    lse = tl.load(lse_ptr + entry, mask=used, other=float("-inf"))
    top = tl.max(lse, 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # no KV at all: zeros rather than NaN
    weight = tl.exp2(lse - top)
    parts = tl.load(part_ptr + entry[:, None] * HEAD_DIM + dims[None, :], mask=used[:, None], other=0.0)
    total = tl.sum(weight, 0)
    o = tl.sum(parts * weight[:, None], 0) / tl.where(total > 0, total, 1.0)
    out_offsets = seq.to(tl.int64) * out_stride_token + head * out_stride_head + dims
    tl.store(out_ptr + out_offsets, o.to(out_ptr.dtype.element_ty))
