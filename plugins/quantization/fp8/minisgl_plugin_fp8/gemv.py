"""The FP8 product for one token (batch-1 decoding): ``out = (q(x) * x_scale) @ (w_q * w_scale).T``
with the activation row quantized to e4m3 exactly as ``quantize_rows`` does (so the token's result
is the one ``torch._scaled_mm`` gives it in any larger batch, up to float32 summation order: greedy
output does not depend on how many tokens share the step, which speculative decoding's verify
relies on), the e4m3 weights read as one byte each, float32 accumulation, both scales at the end.

At one token a linear layer is a stream over its weight: the time is the weight's bytes over the
memory bandwidth, and cuBLASLt's FP8 GEMM plus the separate kernel that quantizes the activations
ran slower than bf16 there (0.70-1.10x on an H200). Here each program owns ``BLOCK_N`` output rows
(weight rows), issues the load of its first weight block, reads the token's whole row for its scale
while that block is in flight (one load of a few KB from L2, the same in every program), then walks
``K`` in ``BLOCK_K`` chunks, each thread loading 16 bytes of a weight row at a time (evict-first:
each byte is read once a step) and multiplying on CUDA cores, summing ``ACC_R`` neighbouring
columns in registers into ``acc[n, k // ACC_R]``, with one sum over ``k`` at the end.

From two tokens on ``torch._scaled_mm`` runs. Measured on an H200 (2026-11-26, BENCHMARKS.md): a
tensor-core variant of this kernel for 2-16 tokens was as fast as bf16 when it multiplied the
activations unquantized, but rounding them in the kernel (needed for the batch invariance above)
made it slower than ``_scaled_mm``, so it was removed.

When ``N / BLOCK_N`` programs cannot fill the GPU the ``K`` loop is split over a second grid
dimension: each split writes float32 partial sums and a second small kernel adds them in a fixed
order (no atomics: the same input gives the same bits, in a CUDA graph or not).

Triton is imported with this module: :mod:`minisgl_plugin_fp8.method` imports it on first use.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from minisgl_core.layers import triton_ops
from minisgl_core.layers.triton_e4m3 import FP8_MAX, quantize_rows_kernel, quantize_rows_triton  # noqa: F401
from minisgl_core.layers.triton_e4m3 import round_e4m3 as _round_e4m3
from minisgl_core.layers.triton_e4m3 import row_scale as _row_scale

try:  # programmatic dependent launch (minisgl_core.layers.triton_ops.pdl_enabled)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:
    gdc_launch_dependents = gdc_wait = None

#: most tokens the GEMV takes; from 2 on the FP8 tensor-core GEMM (``torch._scaled_mm``) runs
GEMV_MAX_M = 1


class GemvConfig(NamedTuple):
    block_n: int  # weight rows per program
    block_k: int  # weight columns per loop step
    split_k: int  # programs along K (1: no partial sums)
    num_warps: int
    num_stages: int
    tiles: int = 1  # BLOCK_N-row tiles per program, one after the other (the scale's pass shared)
    prefetch: bool = False  # the first weight block loaded before the scale's pass
    acc_r: int = 1  # products summed in each thread over this many neighbouring columns a step
    evict: bool = False  # weight loads marked evict-first (each byte is read once a step)
    #: the token's row rounded to e4m3 by the GPU's conversion instruction rather than in
    #: arithmetic (``_round_e4m3``, which Triton's interpreter needs): the same values
    hw_round: bool = True


#: programs wanted per SM before the K loop is split (several per SM keep enough loads in flight)
PROGRAMS_PER_SM = 2
#: most splits: each adds float32 partial sums of [N] to write and read back
MAX_SPLIT_K = 4
#: weights with at least this many rows take 16-row tiles; with at most FEW_ROWS, 2,048 columns a step
MANY_ROWS = 16384
FEW_ROWS = 4096


@functools.cache
def _sm_count(device_index: int | None) -> int:
    if device_index is None:  # the CPU under Triton's interpreter
        return 132
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def pick_config(n: int, k: int, sm_count: int = 132) -> GemvConfig:
    """The launch for one token times an ``[n, k]`` weight, from a sweep on an H200 with every
    weight read from HBM (``tools/device_gemv_sweep.py``, BENCHMARKS.md, 2026-11-28; Llama-3.1-8B's
    four shapes: 0.0779 -> 0.0635 ms a layer against the previous rule, which had been tuned on
    weights L2 held): the first weight block loaded before the scale's pass, weights loaded
    evict-first (each byte is read once a step: 1-3% on every shape), products summed in each
    thread over ``acc_r`` neighbouring columns (a narrower accumulator: 10-20%), and the tile by
    the row count: 16 rows x 512 columns for many rows (gate_up's 28,672), 8 x 2,048 for few rows
    of a long K (o_proj, down_proj), else 8 x 1,024 (qkv); rows shorter than 2,048 columns take
    8 x 512 (the fastest for Qwen3-0.6B's qkv and gate_up in the same kind of sweep, whose four
    shapes took 13.3 µs a layer with this rule, 17.5 with the previous one). ``acc_r`` 16 but
    for the shortest rows (8): with the row rounded by the conversion instruction (``hw_round``)
    the 8 x 2,048 tiles took 16 too (o_proj and down_proj 24.2 -> 23.9 µs, 2026-12-01). Then ``split_k``, a power of two up to ``MAX_SPLIT_K``, grows until there are
    ``PROGRAMS_PER_SM`` programs of 8 rows per SM (o_proj's 4,096 rows stay unsplit, as
    measured), as long as each split keeps at least two loop steps."""
    if k < 2048:
        block_n, block_k, acc_r = 8, 512, 8
    elif n >= MANY_ROWS:
        block_n, block_k, acc_r = 16, 512, 16
    elif n <= FEW_ROWS and k >= 4096:
        block_n, block_k, acc_r = 8, 2048, 16
    else:
        block_n, block_k, acc_r = 8, 1024, 16
    num_warps, num_stages = 4, 2
    tiles = triton.cdiv(n, 8)
    split_k = 1
    while (
        split_k < MAX_SPLIT_K
        and tiles * split_k < PROGRAMS_PER_SM * sm_count
        and k >= 2 * split_k * 2 * block_k
    ):
        split_k *= 2
    return GemvConfig(
        block_n, block_k, split_k, num_warps, num_stages, tiles=1, prefetch=True, acc_r=acc_r, evict=True
    )


@triton.jit
def fp8_gemv_kernel(
    x,  # [K] the token's activations
    w,  # [N, K] float8_e4m3fn, contiguous
    w_scale,  # [N] float32
    out,  # [N] in the activations' dtype, or float32 partial sums [SPLIT_K, N]
    N,
    K,
    K_PER_SPLIT: tl.constexpr,  # a multiple of BLOCK_K (a constant: Triton's interpreter wants one)
    K_ROW: tl.constexpr,  # K rounded up to a multiple of SCALE_BLOCK (the scale's loop bound)
    SCALE_BLOCK: tl.constexpr,  # columns per step of the scale's pass over the row
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    TILES: tl.constexpr,  # BLOCK_N-row tiles per program: the scale's pass once for all of them
    PREFETCH: tl.constexpr,  # load the first weight block before the scale's pass
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch
    ACC_R: tl.constexpr = 1,  # GemvConfig.acc_r
    EVICT: tl.constexpr = False,  # GemvConfig.evict
    HW_ROUND: tl.constexpr = False,  # GemvConfig.hw_round, compiled (never under the interpreter)
):
    split = tl.program_id(1)
    cols = split * K_PER_SPLIT + tl.arange(0, BLOCK_K)
    out = out + split.to(tl.int64) * N
    first_rows = tl.program_id(0) * TILES * BLOCK_N + tl.arange(0, BLOCK_N)
    first_ok = (first_rows[:, None] < N) & (cols[None, :] < K)
    w_first = w + first_rows[:, None].to(tl.int64) * K + cols[None, :]
    if PREFETCH:  # the first weight block in flight while the scale's pass runs
        wk_first = _load_weights(w_first, first_ok, EVICT)
    if PDL:  # (the weights are not the kernel before's output: their first block may load before)
        gdc_wait()
        gdc_launch_dependents()
    # over the whole row: every split reads it, the scale must not depend on the split
    x_scale, x_inverse = _row_scale(x, K, K_ROW, SCALE_BLOCK)
    # x as one [1, BLOCK_K] row: the weight tile's layout, no shuffle through shared memory
    x_ptrs = x + cols[None, :]
    for tile in tl.static_range(TILES):
        rows = (tl.program_id(0) * TILES + tile) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        w_ptrs = w + rows[:, None].to(tl.int64) * K + cols[None, :]
        scale = tl.load(w_scale + rows, mask=row_ok, other=0.0)
        acc = tl.zeros((BLOCK_N, BLOCK_K // ACC_R), dtype=tl.float32)
        if PREFETCH and tile == 0:
            xk = tl.load(x_ptrs, mask=cols[None, :] < K, other=0.0)
            acc = _accumulate(acc, wk_first, xk, x_inverse, ACC_R, HW_ROUND)
        for step in range(BLOCK_K if PREFETCH and tile == 0 else 0, K_PER_SPLIT, BLOCK_K):
            col_ok = cols[None, :] + step < K
            xk = tl.load(x_ptrs + step, mask=col_ok, other=0.0)
            wk = _load_weights(w_ptrs + step, row_ok[:, None] & col_ok, EVICT)
            acc = _accumulate(acc, wk, xk, x_inverse, ACC_R, HW_ROUND)
        result = tl.sum(acc, axis=1) * scale * tl.reshape(x_scale, (1,))
        tl.store(out + rows, result.to(out.dtype.element_ty), mask=row_ok)


@triton.jit
def _load_weights(ptrs, mask, EVICT: tl.constexpr):
    if EVICT:
        return tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _accumulate(acc, wk, xk, x_inverse, ACC_R: tl.constexpr, HW_ROUND: tl.constexpr):
    """``acc`` plus the products of a weight block and its columns of ``x`` rounded to e4m3; with
    ``ACC_R`` > 1 each thread first sums ``ACC_R`` neighbouring columns (``acc`` is that much
    narrower: fewer registers a program). ``HW_ROUND``: the rounding as one conversion to e4m3
    and back (round to nearest even; the values are clamped to e4m3's range first) instead of
    ``_round_e4m3``'s ten or so instructions an element, done again by every program."""
    xs = tl.clamp(xk.to(tl.float32) * x_inverse, -FP8_MAX, FP8_MAX)
    if HW_ROUND:
        xq = xs.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.float32)
    else:
        xq = _round_e4m3(xs)
    products = wk.to(tl.float32) * xq
    if ACC_R == 1:
        return acc + products
    rows: tl.constexpr = products.shape[0]
    cols: tl.constexpr = products.shape[1]
    return acc + tl.sum(tl.reshape(products, (rows, cols // ACC_R, ACC_R)), axis=2)


@triton.jit
def sum_splits_kernel(
    partials, out, size, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False
):
    """``out = partials.sum(0)`` over ``[SPLIT_K, size]`` float32, in split order, rounded once."""
    if PDL:  # wait for the kernel before, then let the one after start launching
        gdc_wait()
        gdc_launch_dependents()
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < size
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        total += tl.load(partials + s * size + i, mask=mask, other=0.0)
    tl.store(out + i, total.to(out.dtype.element_ty), mask=mask)


_SUM_BLOCK = 1024
#: most elements the scale's pass loads at once (one load for every Llama-3.1-8B row)
_SCALE_BLOCK_MAX = 16384


def fp8_gemv(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, config: GemvConfig | None = None
) -> torch.Tensor:
    """``(xq * x_scale) @ (weight.float() * weight_scale.view(-1, 1)).T`` in ``x.dtype``, where
    ``xq, x_scale = quantize_rows(x)`` (computed inside the kernel): ``x`` [1, K], ``weight``
    [N, K] float8_e4m3fn contiguous, ``weight_scale`` N float32 (any shape). No host
    synchronisation: safe in CUDA graph capture. ``config`` overrides :func:`pick_config`."""
    m, k = x.shape
    n = weight.shape[0]
    assert m == GEMV_MAX_M and weight.shape[1] == k and weight.is_contiguous()
    x = x.reshape(k)
    if x.stride(0) != 1:
        x = x.contiguous()
    if config is None:
        config = pick_config(n, k, _sm_count(x.device.index if x.is_cuda else None))
    k_per_split = triton.cdiv(triton.cdiv(k, config.split_k), config.block_k) * config.block_k
    scale_block = min(triton.next_power_of_2(k), _SCALE_BLOCK_MAX)
    out = torch.empty(n, device=x.device, dtype=x.dtype)
    pdl = triton_ops.pdl_options(x.device)
    target = (
        out if config.split_k == 1 else torch.empty(config.split_k, n, device=x.device, dtype=torch.float32)
    )
    fp8_gemv_kernel[(triton.cdiv(n, config.block_n * config.tiles), config.split_k)](
        x, weight, weight_scale, target, n, k,
        K_PER_SPLIT=k_per_split, K_ROW=triton.cdiv(k, scale_block) * scale_block, SCALE_BLOCK=scale_block,
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, TILES=config.tiles, PREFETCH=config.prefetch,
        ACC_R=config.acc_r, EVICT=config.evict, HW_ROUND=config.hw_round and x.is_cuda,
        num_warps=config.num_warps, num_stages=config.num_stages, **pdl,
    )  # fmt: skip
    if config.split_k > 1:
        sum_splits_kernel[(triton.cdiv(n, _SUM_BLOCK),)](
            target, out, n, SPLIT_K=config.split_k, BLOCK=_SUM_BLOCK, **pdl
        )
    return out.view(1, n)
