"""Triton's side of :mod:`minisgl_core.layers.e4m3` (imports Triton; imported on first use): the
same constants, rounded to float32 alike; :func:`round_e4m3`, the rounding in arithmetic that also
holds under Triton's interpreter; :func:`row_scale`; and :func:`quantize_rows_triton`,
``quantize_rows`` as one kernel (the fp8 plugin's activations, the e4m3 experts' GEMM inputs)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minisgl_core.layers import triton_ops

try:  # programmatic dependent launch (minisgl_core.layers.triton_ops.pdl_enabled)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:
    gdc_launch_dependents = gdc_wait = None

FP8_MAX: tl.constexpr = tl.constexpr(448.0)
INV_FP8_MAX: tl.constexpr = tl.constexpr(1.0 / 448.0)  # e4m3.INV_FP8_MAX, rounded to float32 alike
MIN_SCALE: tl.constexpr = tl.constexpr(1e-12)


@triton.jit
def round_e4m3(q):
    """float32 ``q`` (``|q| <= 448``) to the nearest e4m3 value, ties to even, in arithmetic: the
    step of ``q``'s binade (2**(e - 3); 2**-9 for e4m3's subnormals) from the exponent bits, then
    ``q / step`` rounded by the 1.5 * 2**23 trick. The same value as a hardware conversion, and
    also right under Triton's interpreter, whose conversion (3.6) drops the carry into the
    exponent when a value rounds up to a power of two (31.6 gave 16, not 32)."""
    exponent = tl.maximum((q.to(tl.int32, bitcast=True) >> 23) & 0xFF, 127 - 6)
    step = ((exponent - 3) << 23).to(tl.float32, bitcast=True)
    inverse = ((257 - exponent) << 23).to(tl.float32, bitcast=True)  # 1 / step, exactly
    return ((q * inverse + 12582912.0) - 12582912.0) * step


@triton.jit
def row_scale(x, K, K_ROW: tl.constexpr, BLOCK: tl.constexpr):
    """The e4m3 scale of the row at ``x`` as ``quantize_rows`` computes it, ``max(amax * (1 / 448),
    1e-12)`` (a multiplication: see minisgl_core.layers.e4m3.INV_FP8_MAX), and its IEEE
    reciprocal, both ``[1, 1]``: the one place :func:`quantize_rows_kernel` and the fp8 plugin's
    one-token GEMV take them from."""
    amax = tl.zeros((1, BLOCK), dtype=tl.float32)
    for start in range(0, K_ROW, BLOCK):
        cols = start + tl.arange(0, BLOCK)[None, :]
        amax = tl.maximum(amax, tl.abs(tl.load(x + cols, mask=cols < K, other=0.0).to(tl.float32)))
    scale = tl.maximum(tl.max(amax, axis=1, keep_dims=True) * INV_FP8_MAX, MIN_SCALE)
    return scale, tl.div_rn(tl.full((1, 1), 1.0, tl.float32), scale)


@triton.jit
def quantize_rows_kernel(
    x,
    x_row_stride,
    q,
    scales,
    K,
    K_ROW: tl.constexpr,  # K rounded up to a multiple of BLOCK (a constant: the interpreter wants one)
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch
):
    """Row ``program_id`` of ``x`` as ``quantize_rows`` quantizes it, in the fp8 GEMV's arithmetic:
    the scale ``max(amax * (1 / 448), 1e-12)``, its IEEE reciprocal, each element times it,
    clamped, rounded to e4m3 (exact in the float8 store), in two passes over the row."""
    if PDL:  # wait for the kernel before, then let the one after start launching
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    x = x + row * x_row_stride
    scale, inverse = row_scale(x, K, K_ROW, BLOCK)
    for start in range(0, K_ROW, BLOCK):
        cols = start + tl.arange(0, BLOCK)[None, :]
        xk = tl.load(x + cols, mask=cols < K, other=0.0).to(tl.float32)
        qk = round_e4m3(tl.clamp(xk * inverse, -FP8_MAX, FP8_MAX))
        tl.store(q + row * K + cols, qk.to(q.dtype.element_ty), mask=cols < K)
    tl.store(scales + row + tl.zeros((1, 1), dtype=tl.int64), scale)


_QUANTIZE_BLOCK = 4096


def quantize_rows_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_rows(x)`` for ``x`` [M, K] (last stride 1) as one kernel: (float8_e4m3fn [M, K],
    float32 scales [M, 1]), the same bits."""
    m, k = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        block = min(triton.next_power_of_2(k), _QUANTIZE_BLOCK)
        k_row = triton.cdiv(k, block) * block
        quantize_rows_kernel[(m,)](
            x,
            x.stride(0),
            q,
            scales,
            k,
            K_ROW=k_row,
            BLOCK=block,
            num_warps=4,
            **triton_ops.pdl_options(x.device),
        )
    return q, scales
