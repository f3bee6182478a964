"""The elementwise pieces of a decoder layer, each fused into one kernel on CUDA.

Decode steps of small models are made of many tiny kernels: written plainly, an fp32 RMS norm
is eight launches and rotary twenty, which costs more than the matrix products at batch one.
On CUDA these functions go through ``torch.compile`` (Triton), once per process with dynamic
shapes, before any CUDA graph is captured; elsewhere (CPU, CI) they run eagerly with the same math.
``--disable-fast-path compile`` (or ``MINISGL_COMPILE=0``) turns fusion off (ablation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
import torch.nn.functional as F

from minisgl_core import fast_paths
from minisgl_core.layers import triton_ops

F_ = TypeVar("F_", bound=Callable)


def compiled_kernels(x: torch.Tensor) -> bool:
    """Whether work on ``x`` takes the compiled (Triton) kernels: on CUDA, with the ``compile``
    fast path on. Plugins with Triton kernels of their own ask this too, so that
    ``--disable-fast-path compile`` (or ``MINISGL_COMPILE=0``) turns theirs off with the core's."""
    return x.is_cuda and fast_paths.current().compile


def fused(fn: F_) -> F_:
    compiled: list[Callable] = []

    def call(x: torch.Tensor, *args):
        if not compiled_kernels(x):
            return fn(x, *args)
        if not compiled:
            compiled.append(torch.compile(fn, dynamic=True, fullgraph=True))
        return compiled[0](x, *args)

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    call.__doc__ = fn.__doc__
    return call  # type: ignore[return-value]


def _normalize(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / rms(x)`` over the last dimension, computed in float32 like Hugging Face."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rotary_angles(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary angles computed in float32: ``[num_tokens, 1, head_dim]`` cos and sin in ``dtype``.

    Off CUDA the decoder computes them once per forward and hands them to every layer (``angles``
    below), which on a CPU saves a cos and a sin over every token per layer (5% of a 2-core
    decode step); on CUDA each layer's fused kernel computes them in registers instead."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotary: ``x * cos + rotate_half(x) * sin``."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@fused
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _normalize(x, weight, eps)


@fused
def _add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    total = x + residual
    return _normalize(total, weight, eps), total


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm over the last dimension in float32, as Hugging Face computes it: a hand-written
    Triton kernel on CUDA (:func:`~minisgl_core.layers.triton_ops.rms_norm`), else compiled (or
    eager on CPU)."""
    if triton_ops.norm_enabled(x, weight):
        return triton_ops.rms_norm(x, weight, eps)  # type: ignore[return-value]
    return _rms_norm(x, weight, eps)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)``: the residual add folded into the next norm."""
    if triton_ops.norm_enabled(x, weight) and residual.shape == x.shape and residual.dtype == x.dtype:
        return triton_ops.rms_norm(x, weight, eps, residual)  # type: ignore[return-value]
    return _add_rms_norm(x, residual, weight, eps)


def add_partials_rms_norm(
    partials: triton_ops.SplitKPartials, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`add_rms_norm` of a split-K GEMM's partial sums not yet added (``partials.total()``):
    the sum, the add and the norm in one Triton kernel where :func:`add_rms_norm` would run the
    Triton norm, else the sum first."""
    if (
        triton_ops.norm_enabled(residual, weight)
        and residual.dtype == partials.dtype
        and residual.dim() == 2
        and residual.shape == partials.shape
    ):
        return triton_ops.add_partials_rms_norm(partials, residual, weight, eps)
    return add_rms_norm(partials.total(), residual, weight, eps)


@fused
def rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    angles: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style rotary (rotate_half) on [num_tokens, heads, head_dim]; angles in float32.
    ``angles``: :func:`rotary_angles` of ``positions`` already computed (in q's dtype), or None."""
    cos, sin = angles if angles is not None else rotary_angles(positions, inv_freq, q.dtype)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


@fused
def _silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up = [gate | up]`` over the last dimension: a hand-written
    Triton kernel on CUDA (:func:`~minisgl_core.layers.triton_ops.silu_and_mul`), else fused
    through ``torch.compile`` (or eager on CPU)."""
    if gate_up.dim() == 2 and triton_ops.silu_mul_enabled(gate_up.device):
        return triton_ops.silu_and_mul(gate_up)
    return _silu_and_mul(gate_up)


@fused
def qk_norm_rope(
    qk: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    num_q_heads: int,
    eps: float,
    angles: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Query and key heads side by side, ``[num_tokens, q_heads + kv_heads, head_dim]`` (a view
    into the fused qkv projection): optional per-head RMS norm (Qwen3's q_norm/k_norm), then
    rotary, written to one contiguous tensor. One kernel on CUDA instead of four; the same
    arithmetic as :func:`rms_norm` followed by :func:`rotary` (``angles`` as there)."""
    return _qk_norm_rope(qk, positions, inv_freq, q_weight, k_weight, num_q_heads, eps, angles)


def _qk_norm_rope(
    qk, positions, inv_freq, q_weight, k_weight, num_q_heads: int, eps: float, angles
) -> torch.Tensor:
    num_heads, head_dim = qk.shape[1], qk.shape[2]
    if q_weight is not None and k_weight is not None:
        weight = torch.cat(
            (q_weight.expand(num_q_heads, head_dim), k_weight.expand(num_heads - num_q_heads, head_dim))
        )
        qk = _normalize(qk, weight, eps)
    cos, sin = angles if angles is not None else rotary_angles(positions, inv_freq, qk.dtype)
    return _rotate(qk, cos, sin)


@fused
def qkv_norm_rope(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    num_q_heads: int,
    num_kv_heads: int,
    eps: float,
    angles: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """:func:`qk_norm_rope` on the q and k heads of ``qkv`` (``[num_tokens, q_heads + 2 * kv_heads,
    head_dim]``, the fused projection's output), the v heads copied after them: one contiguous
    tensor of the same shape, still one kernel on CUDA. Each token's k and v heads end up side by
    side, so :meth:`~minisgl_core.api.KVCache.store` writes both with one kernel (API 1.4)."""
    qk_heads = num_q_heads + num_kv_heads
    qk = _qk_norm_rope(qkv[:, :qk_heads], positions, inv_freq, q_weight, k_weight, num_q_heads, eps, angles)
    return torch.cat((qk, qkv[:, qk_heads:]), dim=1)


@fused
def merge_attention_states(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor, use_b: torch.Tensor
) -> torch.Tensor:
    """Attention over the union of two disjoint key sets, from attention over each part.

    ``out_*``: [num_tokens, heads, head_dim]; ``lse_*``: [num_tokens, heads] float32 log-sum-exp
    of the scaled scores in **base 2** (FlashInfer's convention). Rows where ``use_b`` ([num_tokens]
    bool) is false return ``out_a`` and ignore part b entirely, even NaN there. Result in
    ``out_a``'s dtype; the weighting is done in float32."""
    keep = use_b[:, None]
    lse_b = torch.where(keep, lse_b, float("-inf"))
    top = torch.maximum(lse_a, lse_b)
    w_a = torch.exp2(lse_a - top)
    w_b = torch.exp2(lse_b - top)
    part_b = torch.where(keep[..., None], out_b.float(), 0.0)
    merged = (out_a.float() * w_a[..., None] + part_b * w_b[..., None]) / (w_a + w_b)[..., None]
    return merged.to(out_a.dtype)
