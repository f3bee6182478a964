"""The fa3 backend's FlashAttention-3 prefill path on the CPU: the attention conformance suite
over ``flash_attn_with_kvcache`` as :func:`flash_attn_with_kvcache` below models it from
FlashAttention-3's documented semantics (decode runs on the fi backend's FlashInfer double). What
it checks is the backend's own work: the dense page table it builds from the batch, the varlen
query offsets, the scale, soft-cap and window it passes. The GPU machine has no FlashAttention-3
build, so its kernels are not checked anywhere yet (the same suite runs on the GPU in
``test_fa3_suite.py`` over whichever path is installed)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from minisgl_plugin_fa3.backend import FLASH_ATTN_MODULE, FlashAttention3Backend

from minisgl_core.testing.attention_suite import AttentionBackendSuite

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fi" / "tests"))
import flashinfer_double  # noqa: E402

#: every call's keyword arguments, to see which path ran
CALLS: list[dict] = []


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    cache_seqlens: torch.Tensor,
    page_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    max_seqlen_q: int,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
) -> torch.Tensor:
    """Paged K/V ``[pages, page_size, kv_heads, head_dim]`` read through ``page_table`` (one row
    of page ids a sequence) up to ``cache_seqlens``; varlen queries by ``cu_seqlens_q``, aligned to
    the end of their sequence; with ``causal`` a query sees keys up to its own position, and
    ``window_size[0] >= 0`` of them before it at most."""
    CALLS.append({"window_size": window_size, "causal": causal})
    page = k_cache.shape[1]
    group = q.shape[1] // k_cache.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out = torch.zeros(q.shape, dtype=torch.float32)
    cu = cu_seqlens_q.tolist()
    for b, kv_len in enumerate(cache_seqlens.tolist()):
        n = cu[b + 1] - cu[b]
        assert n <= max_seqlen_q
        pages = page_table[b, : -(-kv_len // page)].long()
        keys = k_cache[pages].float().flatten(0, 1)[:kv_len].repeat_interleave(group, 1)
        values = v_cache[pages].float().flatten(0, 1)[:kv_len].repeat_interleave(group, 1)
        scores = torch.einsum("nhd,khd->hnk", q[cu[b] : cu[b + 1]].float(), keys) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        position = torch.arange(kv_len - n, kv_len)[:, None]
        key = torch.arange(kv_len)[None, :]
        visible = torch.ones(n, kv_len, dtype=torch.bool)
        if causal:
            visible &= key <= position
        if window_size[0] >= 0:
            visible &= key >= position - window_size[0]
        weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1)
        out[cu[b] : cu[b + 1]] = torch.einsum("hnk,khd->nhd", weights, values)
    return out.to(q.dtype)


class FlashAttention3OnCpu(flashinfer_double.OnCpu, FlashAttention3Backend):
    @classmethod
    def prefill_path(cls) -> str:
        return FLASH_ATTN_MODULE


@pytest.fixture(autouse=True)
def _doubles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flashinfer", flashinfer_double)
    fa3 = type(sys)("flash_attn_interface")
    fa3.flash_attn_with_kvcache = flash_attn_with_kvcache
    monkeypatch.setitem(sys.modules, FLASH_ATTN_MODULE, fa3)
    CALLS.clear()


class TestFlashAttention3PrefillOnCpu(AttentionBackendSuite):
    backend_cls = FlashAttention3OnCpu
    gqa_ratios = (1, 4)
    head_dims = (64,)

    def test_prefill_ran_flash_attention(self, generator: torch.Generator) -> None:
        """The suite's prefill steps above went through ``flash_attn_with_kvcache`` (not
        FlashInfer's prefill), with the window where the layer has one."""
        self.test_sliding_window(generator)
        assert {c["window_size"] for c in CALLS} == {(-1, -1), (6, 0)}  # the suite's WINDOW is 7
