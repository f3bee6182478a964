"""Float8 e4m3 rows with one float32 scale each: the rounding every FP8 path shares (the fp8
quantization plugin's layers, the grouped GEMMs of e4m3 experts in :mod:`minisgl_core.layers.moe`),
so a row quantized on one path has the same bits on another."""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
#: scales are ``amax * INV_FP8_MAX`` (a multiplication by this float32 constant), not ``amax / 448``:
#: torch on CUDA divides by a scalar that way itself, while its CPU kernel and Triton divide, and
#: one ulp of scale moves activations across e4m3 rounding boundaries (GPU check, 2026-11-26)
INV_FP8_MAX = 1.0 / FP8_MAX
#: smallest scale: an all-zero row or token must not divide by zero
MIN_SCALE = 1e-12


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``t`` [rows, cols] as (float8_e4m3fn [rows, cols], float32 scale [rows, 1]) with
    ``t ≈ q * scale``: each row scaled so its largest magnitude maps to 448."""
    amax = t.abs().amax(dim=-1, keepdim=True).float()
    scale = (amax * INV_FP8_MAX).clamp_(min=MIN_SCALE)
    # times the reciprocal (one IEEE division per row, as the Triton kernels compute it)
    q = (t.float() * torch.reciprocal(scale)).clamp_(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale
