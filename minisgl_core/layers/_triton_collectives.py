"""The Triton kernel of the wide symmetric-memory all-reduce (imported on first use: this module
imports Triton, which CPU installs may lack). See :class:`minisgl_core.distributed.SymmMemAllReduce`."""

import triton
import triton.language as tl


@triton.jit
def sum_peer_buffers_kernel(
    buffer_ptrs,  # [world] int64: every rank's symmetric buffer (this rank's own among them)
    out,  # [n]: the sum, written here
    n,
    WORLD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # program i: elements [i * BLOCK, (i + 1) * BLOCK) of every rank's buffer, summed in float32 in
    # rank order (so every rank computes the same bits), read over NVLink from the peers.
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for r in tl.static_range(WORLD):
        base = tl.load(buffer_ptrs + r).to(tl.pointer_type(out.dtype.element_ty))
        acc += tl.load(base + i, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + i, acc.to(out.dtype.element_ty), mask=mask)


@triton.jit
def sum_add_rms_norm_kernel(
    buffer_ptrs,  # [world] int64: every rank's symmetric buffer, each a [rows, n] partial sum
    residual,  # [rows, n] contiguous
    weight,  # [n]
    eps,
    out,  # [rows, n]: weight * norm(sum + residual)
    total,  # [rows, n]: sum + residual (the new residual stream)
    n,
    WORLD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # one row per program: the all-reduce of sum_peer_buffers_kernel (float32 in rank order, then
    # rounded to the model dtype), then rms_norm_kernel's residual add and norm, bit for bit
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    i = row * n + cols
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for r in tl.static_range(WORLD):
        base = tl.load(buffer_ptrs + r).to(tl.pointer_type(out.dtype.element_ty))
        acc += tl.load(base + i, mask=mask, other=0.0).to(tl.float32)
    dtype = out.dtype.element_ty
    res = tl.load(residual + i, mask=mask, other=0.0).to(tl.float32)
    v = (acc.to(dtype).to(tl.float32) + res).to(dtype)
    tl.store(total + i, v, mask=mask)
    v32 = v.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(v32 * v32, 0) / n + eps)
    w = tl.load(weight + cols, mask=mask, other=0.0).to(tl.float32)
    y = (v32 * inv_rms).to(dtype).to(tl.float32) * w
    tl.store(out + i, y.to(dtype), mask=mask)
