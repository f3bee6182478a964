"""Triton's side of :mod:`minisgl_core.layers.e4m3` (imports Triton; imported on first use): the
same constants, rounded to float32 alike, and :func:`round_e4m3`, the rounding in arithmetic that
also holds under Triton's interpreter."""

from __future__ import annotations

import triton
import triton.language as tl

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
