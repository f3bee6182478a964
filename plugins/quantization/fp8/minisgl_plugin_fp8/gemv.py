"""FP8 products for small batches (decode): ``out = (q(x) * x_scale) @ (w_q * w_scale).T`` with the
activations quantized per token to e4m3 exactly as ``quantize_rows`` does (so a token's result is
the one ``torch._scaled_mm`` gives it in a large batch, up to float32 summation order: greedy output
does not depend on how many tokens share the step, which speculative decoding's verify relies on),
the e4m3 weights read as one byte each, float32 accumulation and both scales applied at the end.

At a handful of tokens a linear layer is a stream over its weight: the time is the weight's bytes
over the memory bandwidth, and cuBLASLt's FP8 GEMM plus the separate kernel that quantizes the
activations ran slower than bf16 there. Here each program owns ``BLOCK_N`` output rows (weight
rows), first reads its tokens' whole rows for their scales (a few KB from L2), then walks ``K`` in
``BLOCK_K`` chunks, each thread loading 16 bytes of a weight row at a time:

* one token: CUDA cores, ``acc[n, k] += w[n, k] * q(x)[k]`` elementwise, one sum over ``k`` at the end;
* 2-16 tokens: tensor cores, ``acc = w_tile @ q(x)_tile.T`` (the weight is the MMA's wide operand,
  the tokens its narrow one, padded to a power of two; e4m3 values are exact in bf16). Measured on
  an H200 (2026-11-26): an elementwise scheme with a token axis matched this only at two tokens on
  one shape and ran 1.45-5x slower elsewhere, and 64-row by 128-column tiles in three stages were
  the fastest of the 32-256 by 128-256 tried.

When ``N / BLOCK_N`` programs cannot fill the GPU (N = 4,096 with wide tiles) the ``K`` loop is split
over a second grid dimension: each split writes float32 partial sums and a second small kernel
adds them in a fixed order (no atomics: the same input gives the same bits, in a CUDA graph or not).

Triton is imported with this module: :mod:`minisgl_plugin_fp8.method` imports it on first use.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

#: most tokens the GEMV takes; from 17 on the FP8 tensor-core GEMM (``torch._scaled_mm``) runs
GEMV_MAX_M = 16
FP8_MAX: tl.constexpr = tl.constexpr(448.0)
MIN_SCALE: tl.constexpr = tl.constexpr(1e-12)


class GemvConfig(NamedTuple):
    block_m: int  # tokens per program: 1 (CUDA cores) or a power of two >= 2 (tensor cores)
    block_n: int  # weight rows per program
    block_k: int  # weight columns per loop step
    split_k: int  # programs along K (1: no partial sums)
    num_warps: int
    num_stages: int


#: programs wanted per SM before the K loop is split (several per SM keep enough loads in flight)
PROGRAMS_PER_SM = 2
#: most splits: each adds float32 partial sums of [tokens, N] to write and read back
MAX_SPLIT_K = 4


@functools.cache
def _sm_count(device_index: int | None) -> int:
    if device_index is None:  # the CPU under Triton's interpreter
        return 132
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def pick_config(m: int, n: int, k: int, sm_count: int = 132) -> GemvConfig:
    """The launch for ``m`` tokens times an ``[n, k]`` weight. One token: 8 rows by 1,024 columns
    per step (512 for a short K); more: 64 rows by 128 columns through
    tensor cores. Then ``split_k``, a power of two up to ``MAX_SPLIT_K``, grows until there are
    ``PROGRAMS_PER_SM`` programs per SM, as long as each split keeps at least two loop steps."""
    if m == 1:  # 1,024 columns when K has them: 9% less time over Llama-3.1-8B's four layers (H200)
        block_m, block_n, block_k, num_warps, num_stages = 1, 8, 1024 if k >= 2048 else 512, 4, 2
    else:
        block_m, block_n, block_k, num_warps, num_stages = triton.next_power_of_2(m), 64, 128, 4, 3
    tiles = triton.cdiv(n, block_n)
    split_k = 1
    while (
        split_k < MAX_SPLIT_K
        and tiles * split_k < PROGRAMS_PER_SM * sm_count
        and k >= 2 * split_k * 2 * block_k
    ):
        split_k *= 2
    return GemvConfig(block_m, block_n, block_k, split_k, num_warps, num_stages)


@triton.jit
def fp8_gemv_kernel(
    x,  # [M, K] activations, last stride 1
    x_row_stride,
    w,  # [N, K] float8_e4m3fn, contiguous
    w_scale,  # [N] float32
    out,  # [M, N] in the activations' dtype, or float32 partial sums [SPLIT_K, M, N]
    M,
    N,
    K,
    K_PER_SPLIT: tl.constexpr,  # a multiple of BLOCK_K (a constant: Triton's interpreter wants one)
    K_ROW: tl.constexpr,  # K rounded up to a multiple of SCALE_BLOCK (the scales' loop bound)
    SCALE_BLOCK: tl.constexpr,  # columns per step of the scales' pass over the tokens' rows
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    split = tl.program_id(1)
    k_start = split * K_PER_SPLIT
    cols = k_start + tl.arange(0, BLOCK_K)
    w_ptrs = w + rows[:, None].to(tl.int64) * K + cols[None, :]
    scale = tl.load(w_scale + rows, mask=row_ok, other=0.0)
    out = out + split.to(tl.int64) * M * N
    if BLOCK_M == 1:
        # x as one [1, BLOCK_K] row: the weight tile's layout, no shuffle through shared memory
        x_scale, x_inverse = _token_scale(x + tl.arange(0, SCALE_BLOCK)[None, :], K, tl.full((1, 1), True, tl.int1),
                                          K_ROW, SCALE_BLOCK)  # fmt: skip
        x_ptrs = x + cols[None, :]
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for step in range(0, K_PER_SPLIT, BLOCK_K):
            col_ok = cols[None, :] + step < K
            xk = _quantize(tl.load(x_ptrs + step, mask=col_ok, other=0.0), x_inverse, tl.float32)
            wk = tl.load(w_ptrs + step, mask=row_ok[:, None] & col_ok, other=0.0)
            acc += wk.to(tl.float32) * xk
        result = tl.sum(acc, axis=1) * scale * tl.reshape(x_scale, (1,))
        tl.store(out + rows, result.to(out.dtype.element_ty), mask=row_ok)
    else:
        tokens = tl.arange(0, BLOCK_M)
        token_ok = tokens < M
        x_rows = x + tokens[:, None] * x_row_stride
        x_scale, x_inverse = _token_scale(x_rows + tl.arange(0, SCALE_BLOCK)[None, :], K, token_ok[:, None],
                                          K_ROW, SCALE_BLOCK)  # [BLOCK_M, 1] each  # fmt: skip
        x_ptrs = x_rows + cols[None, :]
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for step in range(0, K_PER_SPLIT, BLOCK_K):
            col_ok = cols + step < K
            xk = tl.load(x_ptrs + step, mask=token_ok[:, None] & col_ok[None, :], other=0.0)
            xq = _quantize(xk, x_inverse, xk.dtype)  # e4m3 values: exact in bf16 and float32
            wk = tl.load(w_ptrs + step, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
            # the weight is the wide operand; ieee keeps a float32 run (tests) out of tf32
            acc = tl.dot(wk.to(xk.dtype), tl.trans(xq), acc, input_precision="ieee")
        result = acc * scale[:, None] * tl.trans(x_scale)
        dst = out + tokens[None, :] * N + rows[:, None]
        tl.store(dst, result.to(out.dtype.element_ty), mask=row_ok[:, None] & token_ok[None, :])


@triton.jit
def _token_scale(x_ptrs, K, token_ok, K_ROW: tl.constexpr, SCALE_BLOCK: tl.constexpr):
    """Each token's e4m3 scale as ``quantize_rows`` computes it, ``max(amax / 448, 1e-12)`` over
    its whole row (every split reads the row: the scale must not depend on the split), and its
    reciprocal."""
    amax = tl.zeros(x_ptrs.shape, dtype=tl.float32)
    for step in range(0, K_ROW, SCALE_BLOCK):
        col_ok = tl.arange(0, SCALE_BLOCK)[None, :] + step < K
        amax = tl.maximum(
            amax, tl.abs(tl.load(x_ptrs + step, mask=token_ok & col_ok, other=0.0).to(tl.float32))
        )
    scale = tl.maximum(tl.div_rn(tl.max(amax, axis=1, keep_dims=True), FP8_MAX), MIN_SCALE)
    return scale, tl.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)


@triton.jit
def _quantize(xk, x_inverse, dtype: tl.constexpr):
    """``xk`` rounded to e4m3 on its token's grid, as ``quantize_rows`` does (times the scale's
    reciprocal, clamp, round to nearest even), returned as the e4m3 values in ``dtype``."""
    q = tl.clamp(xk.to(tl.float32) * x_inverse, -FP8_MAX, FP8_MAX)
    return _round_e4m3(q).to(dtype)


@triton.jit
def _round_e4m3(q):
    """float32 ``q`` (``|q| <= 448``) to the nearest e4m3 value, ties to even, in arithmetic: the
    step of ``q``'s binade (2**(e - 3); 2**-9 for e4m3's subnormals) from the exponent bits, then
    ``q / step`` rounded by the 1.5 * 2**23 trick. The same bits as a hardware conversion, and
    also right under Triton's interpreter, whose conversion (3.6) drops the carry into the
    exponent when a value rounds up to a power of two (31.6 gave 16, not 32)."""
    exponent = tl.maximum((q.to(tl.int32, bitcast=True) >> 23) & 0xFF, 127 - 6)
    step = ((exponent - 3) << 23).to(tl.float32, bitcast=True)
    inverse = ((257 - exponent) << 23).to(tl.float32, bitcast=True)  # 1 / step, exactly
    return ((q * inverse + 12582912.0) - 12582912.0) * step


@triton.jit
def sum_splits_kernel(partials, out, size, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """``out = partials.sum(0)`` over ``[SPLIT_K, size]`` float32, in split order, rounded once."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < size
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        total += tl.load(partials + s * size + i, mask=mask, other=0.0)
    tl.store(out + i, total.to(out.dtype.element_ty), mask=mask)


_SUM_BLOCK = 1024


def fp8_gemv(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, config: GemvConfig | None = None
) -> torch.Tensor:
    """``(xq * x_scale) @ (weight.float() * weight_scale.view(-1, 1)).T`` in ``x.dtype``, where
    ``xq, x_scale = quantize_rows(x)`` (computed inside the kernel): ``x`` [M, K] with
    ``M <= GEMV_MAX_M``, ``weight`` [N, K] float8_e4m3fn contiguous, ``weight_scale`` N float32
    (any shape). No host synchronisation: safe in CUDA graph capture. ``config`` overrides
    :func:`pick_config` (benchmarks)."""
    m, k = x.shape
    n = weight.shape[0]
    if x.stride(-1) != 1:
        x = x.contiguous()
    if config is None:
        config = pick_config(m, n, k, _sm_count(x.device.index if x.is_cuda else None))
    assert m <= config.block_m and weight.shape[1] == k and weight.is_contiguous()
    k_per_split = triton.cdiv(triton.cdiv(k, config.split_k), config.block_k) * config.block_k
    # the scales' pass: a token's whole row in one load when it fits (16K elements a program)
    scale_block = min(triton.next_power_of_2(k), 16384 // config.block_m)
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    target = (
        out
        if config.split_k == 1
        else torch.empty(config.split_k, m, n, device=x.device, dtype=torch.float32)
    )
    grid = (triton.cdiv(n, config.block_n), config.split_k)
    fp8_gemv_kernel[grid](
        x, x.stride(0), weight, weight_scale, target, m, n, k,
        K_PER_SPLIT=k_per_split, K_ROW=triton.cdiv(k, scale_block) * scale_block, SCALE_BLOCK=scale_block, BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    if config.split_k > 1:
        sum_splits_kernel[(triton.cdiv(m * n, _SUM_BLOCK),)](
            target, out, m * n, SPLIT_K=config.split_k, BLOCK=_SUM_BLOCK
        )
    return out
