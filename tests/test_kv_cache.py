"""KVCache.store: one write through both halves of the pool when k and v sit side by side."""

from __future__ import annotations

import os

import pytest
import torch

from minisgl_core.api import KVCache
from minisgl_core.layers.fused import qk_norm_rope, qkv_norm_rope

HEADS, DIM, Q_HEADS = 2, 8, 4


def pool(dtype=torch.float32) -> KVCache:
    return KVCache(
        num_layers=2, num_pages=6, page_size=4, num_kv_heads=HEADS, head_dim=DIM, dtype=dtype, device="cpu"
    )


def qkv(tokens: int) -> torch.Tensor:
    return torch.randn(tokens, Q_HEADS + 2 * HEADS, DIM, generator=torch.Generator().manual_seed(tokens))


@pytest.mark.parametrize("tokens", [1, 5])
def test_adjacent_and_separate_k_v_store_the_same(tokens):
    _, k, v = qkv(tokens).split((Q_HEADS, HEADS, HEADS), dim=1)
    loc = torch.randperm(24, generator=torch.Generator().manual_seed(1))[:tokens]
    joint, separate = pool(), pool()
    assert joint._adjacent(k, v) is not None
    joint.store(1, loc, k, v)
    separate.store(1, loc, k.clone(), v.clone())  # separate tensors: two writes
    assert separate._adjacent(k.clone(), v.clone()) is None
    assert torch.equal(joint.buffer, separate.buffer)
    flat = joint.buffer[1].view(2, -1, HEADS, DIM)
    assert torch.equal(flat[0, loc], k) and torch.equal(flat[1, loc], v)
    assert joint.buffer[0].abs().sum() == 0  # the other layer is untouched


def test_near_misses_are_not_taken_for_adjacent():
    x = qkv(3)
    cache = pool()
    q, k, v = x.split((Q_HEADS, HEADS, HEADS), dim=1)
    assert cache._adjacent(k, v) is not None
    assert cache._adjacent(v, k) is None  # v before k
    assert cache._adjacent(q[:, :HEADS], k) is None  # one head block too far apart
    assert cache._adjacent(k, v[:, :1].expand(3, HEADS, DIM)) is None  # other strides
    assert pool(torch.float16)._adjacent(k, v) is None  # stored with a cast: two writes
    kv = torch.randn(3, 2 * HEADS, DIM)  # adjacent, but rows of exactly k+v: still one view
    assert cache._adjacent(kv[:, :HEADS], kv[:, HEADS:]) is not None


def test_qkv_norm_rope_is_qk_norm_rope_with_v_beside_k():
    x = qkv(6)
    positions = torch.arange(6) * 7
    inv_freq = 1.0 / (1e4 ** (torch.arange(0, DIM, 2).float() / DIM))
    qw, kw = torch.rand(DIM) + 0.5, torch.rand(DIM) + 0.5
    for weights in ((None, None), (qw, kw)):
        out = qkv_norm_rope(x, positions, inv_freq, *weights, Q_HEADS, HEADS, 1e-6)
        expected_qk = qk_norm_rope(x[:, : Q_HEADS + HEADS], positions, inv_freq, *weights, Q_HEADS, 1e-6)
        assert out.shape == x.shape and out.is_contiguous()
        torch.testing.assert_close(out[:, : Q_HEADS + HEADS], expected_qk, rtol=0, atol=0)
        assert torch.equal(out[:, Q_HEADS + HEADS :], x[:, Q_HEADS + HEADS :])


def _resident_bytes() -> int:
    """This process's resident memory (Linux: /proc/self/statm, in pages)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux's /proc")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_a_cpu_pool_is_zeros_that_take_memory_as_they_are_written(dtype):
    """A CPU pool of 64-256 MB: all zeros, of its shape and dtype, yet resident only where
    written (``torch.zeros`` wrote every byte of the default model's 3 GB pool at start-up: 1.7 s)."""
    pages, heads, dim = 1 << 12, 8, 128
    before = _resident_bytes()
    cache = KVCache(
        num_layers=2,
        num_pages=pages,
        page_size=16,
        num_kv_heads=heads,
        head_dim=dim,
        dtype=dtype,
        device="cpu",
    )
    size = cache.buffer.numel() * cache.buffer.element_size()
    assert cache.buffer.shape == (2, 2, pages, 16, heads, dim) and cache.buffer.dtype == dtype
    assert size >= 64 << 20
    assert _resident_bytes() - before < size // 8
    assert not cache.buffer.view(torch.uint8).any()
    k = torch.ones(3, heads, dim)
    cache.store(1, torch.tensor([0, 7, 4000]), k, 2 * k)
    assert cache.k_cache(1).view(-1, heads, dim)[[0, 7, 4000]].float().eq(1).all()
    assert cache.v_cache(1).view(-1, heads, dim)[[0, 7, 4000]].float().eq(2).all()
    assert not cache.k_cache(0).view(torch.uint8).any()  # the other layer is untouched
