"""The Triton kernel of the wide symmetric-memory all-reduce (imported on first use: this module
imports Triton, which CPU installs may lack). See :class:`minisgl_core.distributed.SymmMemAllReduce`."""

import triton
import triton.language as tl

try:  # programmatic dependent launch (see minisgl_core.layers._triton_kernels)
    from triton.language.extra.cuda import gdc_wait
except ImportError:
    gdc_wait = None


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
def _signal_and_wait(signal_ptrs, rank, channel, WORLD: tl.constexpr):
    # PyTorch's symmetric-memory barrier on one channel, from inside a kernel: raise our flag in
    # every peer's signal pad (slot channel * WORLD + rank, 0 -> 1, release: what this rank wrote
    # before is visible to whoever sees the flag), then take every peer's flag down in ours
    # (slot channel * WORLD + peer, 1 -> 0, acquire). Each compare-and-swap spins until the slot
    # holds what it expects, so a flag not yet taken down from the last barrier is waited out.
    me = tl.load(signal_ptrs + rank).to(tl.pointer_type(tl.int32))
    for r in tl.static_range(WORLD):
        if r != rank:
            peer = tl.load(signal_ptrs + r).to(tl.pointer_type(tl.int32))
            old = tl.atomic_cas(peer + channel * WORLD + rank, 0, 1, sem="release", scope="sys")
            while old != 0:
                old = tl.atomic_cas(peer + channel * WORLD + rank, 0, 1, sem="release", scope="sys")
    for r in tl.static_range(WORLD):
        if r != rank:
            old = tl.atomic_cas(me + channel * WORLD + r, 1, 0, sem="acquire", scope="sys")
            while old != 1:
                old = tl.atomic_cas(me + channel * WORLD + r, 1, 0, sem="acquire", scope="sys")


@triton.jit
def sum_add_rms_norm_kernel(
    buffer_ptrs,  # [world] int64: every rank's symmetric buffer, each a [rows, n] partial sum
    signal_ptrs,  # [world] int64: every rank's signal pad (BARRIER only)
    rank,
    residual,  # [rows, n] contiguous
    weight,  # [n]
    eps,
    out,  # [rows, n]: weight * norm(sum + residual)
    total,  # [rows, n]: sum + residual (the new residual stream)
    rows,
    programs,  # the grid's size
    n,
    WORLD: tl.constexpr,
    BLOCK: tl.constexpr,
    BARRIER: tl.constexpr,
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch: wait for the GEMM first
):
    # rows pid, pid + programs, ...: the all-reduce of sum_peer_buffers_kernel (float32 in rank
    # order, then rounded to the model dtype), then rms_norm_kernel's residual add and norm, bit for
    # bit. With BARRIER each program first passes the buffers' barrier on its own channel (its
    # program id), which saves the barrier kernel before this one: every rank's partial sum was
    # written by a kernel that finished before its program raised the flag.
    pid = tl.program_id(0)
    if PDL:
        gdc_wait()  # (before the flag: it says this rank's partial sum is written)
    if BARRIER:
        _signal_and_wait(signal_ptrs, rank, pid, WORLD)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    dtype = out.dtype.element_ty
    w = tl.load(weight + cols, mask=mask, other=0.0).to(tl.float32)
    row = pid.to(tl.int64)
    while row < rows:  # (a while loop: Triton's interpreter takes no range() over a runtime bound)
        i = row * n + cols
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for r in tl.static_range(WORLD):
            base = tl.load(buffer_ptrs + r).to(tl.pointer_type(out.dtype.element_ty))
            acc += tl.load(base + i, mask=mask, other=0.0).to(tl.float32)
        res = tl.load(residual + i, mask=mask, other=0.0).to(tl.float32)
        v = (acc.to(dtype).to(tl.float32) + res).to(dtype)
        tl.store(total + i, v, mask=mask)
        v32 = v.to(tl.float32)
        inv_rms = tl.rsqrt(tl.sum(v32 * v32, 0) / n + eps)
        y = (v32 * inv_rms).to(dtype).to(tl.float32) * w
        tl.store(out + i, y.to(dtype), mask=mask)
        row += programs
