"""The hand-written Triton kernels of ``minisgl_core.layers.triton_ops`` (norm + rotary + KV store; SiLU·mul) and the
wide all-reduce's sum (``minisgl_core.layers._triton_collectives``), run on the CPU under
Triton's interpreter in a child process (``TRITON_INTERPRET`` must be set before Triton is
imported). In float32, where the interpreter's arithmetic is exact enough to compare with the
eager reference at 1e-5; bf16 rounding is checked on the GPU (``tools/device_e2e.py``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from minisgl_core.testing.triton_interpreter import (
    CheckOutputs,
    run_checks,
    run_checks_under_interpreter,
    run_under_interpreter,
)

pytest.importorskip("triton")

CHILD_ENV = {"MINISGL_FUSED_KV": "1"}
#: the checks of single kernels, which patch nothing, change no environment variable and start
#: no engine: one child runs them all (a child's start-up, torch and Triton imported, cost about
#: 3 s of CI each); the model checks below, which do all three, keep a child each
KERNEL_CHECKS = ["kernel", "silu", "layout", "norm", "gemm", "split_k", "collective"]


def run_child(*args: str) -> str:
    return run_under_interpreter(__file__, *args, env=CHILD_ENV)


@pytest.fixture(scope="module")
def kernel_checks() -> CheckOutputs:
    return run_checks_under_interpreter(__file__, KERNEL_CHECKS, env=CHILD_ENV)


def test_kernel_matches_norm_rope_and_store(kernel_checks):
    out = kernel_checks["kernel"]
    assert out.count("ok") == 8, out


def test_silu_mul_matches_eager(kernel_checks):
    out = kernel_checks["silu"]
    assert out.count("ok") == 3, out


def test_layout_kernel_matches_paged_layout(kernel_checks):
    out = kernel_checks["layout"]
    assert out.count("ok") == 6, out


def test_rms_norm_matches_eager(kernel_checks):
    out = kernel_checks["norm"]
    assert out.count("ok") == 8, out


def test_small_gemm_matches_a_float32_product(kernel_checks):
    out = kernel_checks["gemm"]
    assert out.split() == ["ok"] * 7, out


def test_split_k_partials_added_in_the_norm_are_bitwise_the_separate_sum(kernel_checks):
    out = kernel_checks["split_k"]
    assert out.split() == ["ok"] * 5, out


def test_a_decoder_leaving_split_k_sums_to_its_norms_generates_the_same(tmp_path):
    out = run_child("split_k_model", str(tmp_path))
    assert out.split() == ["same"], out


def test_small_gemm_takes_narrow_and_vocabulary_sized_weights_only():
    """The shapes it serves (``small_gemm_config``): Qwen3-0.6B's o_proj and down_proj and every
    lm_head, up to 64 rows; never qkv or gate_up (cuBLAS is as fast), never Llama-3.1-8B's
    o_proj (square) or down_proj (58 Mi elements), never more than 64 rows."""
    from minisgl_core.layers.triton_ops import small_gemm_config

    assert small_gemm_config(1, 1024, 2048) == (16, 32, 128, 4)  # Qwen3-0.6B o_proj
    assert small_gemm_config(64, 1024, 3072) == (64, 32, 128, 4)  # its down_proj
    assert small_gemm_config(20, 151936, 1024) == (32, 64, 128, 1)  # its lm_head
    assert small_gemm_config(48, 128256, 4096) == (64, 128, 128, 1)  # Llama-3.1-8B's lm_head
    assert small_gemm_config(1, 100, 700) == (16, 32, 128, 1)  # too short for a split
    for rows, n, k in [(1, 4096, 1024), (8, 6144, 1024), (1, 4096, 4096), (1, 4096, 14336), (65, 1024, 2048),
                       (0, 1024, 2048)]:  # fmt: skip
        assert small_gemm_config(rows, n, k) is None, (rows, n, k)


def test_every_small_gemm_tile_is_compiled_while_the_decode_graphs_are_captured():
    """A prefill step's lm_head runs eagerly on however many sequences end their prompt in it
    (1-64 rows): every tile it can pick must be one a decode graph size already compiled at
    start-up, and the row count must not be a specialization of the kernel (else a row count the
    capture did not see would compile inside a timed run)."""
    pytest.importorskip("triton")
    from minisgl_core.layers._triton_kernels import small_gemm_kernel
    from minisgl_core.layers.triton_ops import SMALL_GEMM_MAX_ROWS, small_gemm_config
    from minisgl_core.runner.cuda_graph import capture_sizes

    assert [p.name for p in small_gemm_kernel.params if p.do_not_specialize] == ["m"]
    for n, k in [(1024, 2048), (1024, 3072), (151936, 1024), (128256, 4096)]:
        captured = {small_gemm_config(rows, n, k) for rows in capture_sizes(256)} - {None}
        used = {small_gemm_config(rows, n, k) for rows in range(1, SMALL_GEMM_MAX_ROWS + 1)}
        assert used <= captured, (n, k, used - captured)


def test_all_reduce_kernels_add_every_buffer_in_rank_order(kernel_checks):
    out = kernel_checks["collective"]
    assert out.split() == ["ok"] * 5, out


def test_decoder_with_fused_store_generates_the_same(tmp_path):
    out = run_child("model", str(tmp_path))
    assert out.count("same") == 2, out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("q_heads, kv_heads, norm", [(16, 8, True), (32, 8, False)])
@pytest.mark.parametrize("tokens", [1, 7, 300])
def test_bf16_on_cuda_is_as_close_to_float32_as_the_compiled_path(q_heads, kv_heads, norm, tokens):
    """On the GPU in bf16 (Qwen3's and Llama's head layouts): the kernel's q, k and v are about as
    close to a float32 computation as the two-kernel path it replaces (``qkv_norm_rope`` compiled, then
    ``KVCache.store``), and no slot but ``loc`` changes."""
    from minisgl_core.api import KVCache
    from minisgl_core.layers.fused import qkv_norm_rope
    from minisgl_core.layers.triton_ops import rope_store_kv

    dev, head_dim, slots = torch.device("cuda"), 128, 4096
    gen = torch.Generator(device=dev).manual_seed(tokens)
    qkv = torch.randn(tokens, q_heads + 2 * kv_heads, head_dim, device=dev, generator=gen).bfloat16()
    positions = torch.randint(0, 8192, (tokens,), device=dev, generator=gen)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2, device=dev).float() / head_dim))
    weights = (
        (torch.rand(head_dim, device=dev, generator=gen).bfloat16() + 0.5,) * 2 if norm else (None, None)
    )
    loc = torch.randperm(slots, device=dev, generator=gen)[:tokens]
    exact = qkv_norm_rope.__wrapped__(
        qkv.float(), positions, inv_freq, *[None if w is None else w.float() for w in weights],
        q_heads, kv_heads, 1e-6,
    )  # fmt: skip
    two_kernels = qkv_norm_rope(qkv, positions, inv_freq, *weights, q_heads, kv_heads, 1e-6)
    pools = []
    for _ in range(2):
        pools.append(KVCache(num_layers=1, num_pages=slots // 16, page_size=16, num_kv_heads=kv_heads,
                             head_dim=head_dim, dtype=torch.bfloat16, device=dev))  # fmt: skip
    pools[0].store(0, loc, *two_kernels[:, q_heads:].split(kv_heads, dim=1))
    q = rope_store_kv(qkv, positions, inv_freq, *weights, q_heads, kv_heads, 1e-6, pools[1], 0, loc)
    stored = pools[1].buffer[0].view(2, slots, kv_heads, head_dim)[:, loc]
    fused = torch.cat((q, stored[0], stored[1]), dim=1).float()
    # bf16 rounding: the mean error the same within 25%, the largest within one more ulp
    error_fused, error_two = (fused - exact).abs(), (two_kernels.float() - exact).abs()
    assert error_fused.mean() <= 1.25 * error_two.mean() + 1e-4, (error_fused.mean(), error_two.mean())
    assert error_fused.max() <= 2 * error_two.max() + 1e-3, (error_fused.max(), error_two.max())
    untouched = torch.ones(slots, dtype=torch.bool, device=dev)
    untouched[loc] = False
    assert not pools[1].buffer[0].view(2, slots, -1)[:, untouched].any()


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9), reason="needs an sm89+ GPU"
)
@pytest.mark.parametrize("tokens", [1, 300])
def test_fp8_pool_on_cuda_stores_what_the_unfused_path_stores(tokens):
    """Over a float8 e4m3 pool (``--kv-cache-dtype fp8_e4m3``) the kernel stores what
    ``KVCache.store`` would (rounded to bf16, saturated at ±448, rounded to e4m3), bit for bit: v
    against the two-kernel path (copied, so its bf16 values are the same), k against the same
    kernel's bf16 k (written into a bf16 pool) cast by ``KVCache.store``, since the two paths' norm
    and rotary may round k's bf16 value a step apart (the bf16 test above), which e4m3 then rounds
    a whole step apart (6%) where it crosses a boundary. v large enough that some values saturate.
    (CUDA only: Triton 3.6's interpreter rounds float32 to e4m3 wrongly, -31.2 to -16, so the
    decoder fuses float8 stores on sm89+ GPUs only, ``triton_ops.float8_stores``.)"""
    from minisgl_core.api import KVCache
    from minisgl_core.layers.fused import qkv_norm_rope
    from minisgl_core.layers.triton_ops import rope_store_kv

    dev, q_heads, kv_heads, head_dim, slots = torch.device("cuda"), 16, 8, 128, 4096
    gen = torch.Generator(device=dev).manual_seed(tokens)
    qkv = torch.randn(tokens, q_heads + 2 * kv_heads, head_dim, device=dev, generator=gen)
    qkv[:, q_heads + kv_heads :] *= 300.0
    qkv = qkv.bfloat16()
    positions = torch.randint(0, 8192, (tokens,), device=dev, generator=gen)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2, device=dev).float() / head_dim))
    weights = (torch.rand(head_dim, device=dev, generator=gen).bfloat16() + 0.5,) * 2
    loc = torch.randperm(slots, device=dev, generator=gen)[:tokens]

    def pool(dtype: torch.dtype) -> KVCache:
        return KVCache(num_layers=1, num_pages=slots // 16, page_size=16, num_kv_heads=kv_heads,
                       head_dim=head_dim, dtype=dtype, device=dev)  # fmt: skip

    unfused, fused, fused_bf16, recast = (
        pool(torch.float8_e4m3fn),
        pool(torch.float8_e4m3fn),
        pool(torch.bfloat16),
        pool(torch.float8_e4m3fn),
    )
    two_kernels = qkv_norm_rope(qkv, positions, inv_freq, *weights, q_heads, kv_heads, 1e-6)
    unfused.store(0, loc, *two_kernels[:, q_heads:].split(kv_heads, dim=1))
    rope_store_kv(qkv, positions, inv_freq, *weights, q_heads, kv_heads, 1e-6, fused, 0, loc)
    rope_store_kv(qkv, positions, inv_freq, *weights, q_heads, kv_heads, 1e-6, fused_bf16, 0, loc)
    bf16_rows = fused_bf16.buffer[0].view(2, slots, kv_heads, head_dim)[:, loc]
    recast.store(0, loc, bf16_rows[0], bf16_rows[1])

    def rows(p: KVCache) -> torch.Tensor:
        return p.buffer[0].view(2, slots, kv_heads, head_dim)[:, loc].view(torch.uint8)

    assert (unfused.buffer.float().abs() == 448).any()  # saturated values are among them
    assert torch.equal(rows(fused)[1], rows(unfused)[1])  # v
    assert torch.equal(rows(fused), rows(recast))  # k and v
    untouched = torch.ones(slots, dtype=torch.bool, device=dev)
    untouched[loc] = False
    assert not fused.buffer[0].view(2, slots, -1)[:, untouched].view(torch.uint8).any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens, inter", [(1, 3072), (300, 14336), (8192, 3072)])
def test_silu_mul_bf16_on_cuda_is_as_close_to_float32_as_the_compiled_path(tokens, inter):
    import torch.nn.functional as F

    from minisgl_core.layers import triton_ops
    from minisgl_core.layers.fused import _silu_and_mul

    gate_up = torch.randn(
        tokens, 2 * inter, device="cuda", generator=torch.Generator("cuda").manual_seed(tokens)
    )
    gate_up = gate_up.bfloat16()
    exact = F.silu(gate_up[:, :inter].float()) * gate_up[:, inter:].float()
    error_ours = (triton_ops.silu_and_mul(gate_up).float() - exact).abs()
    error_compiled = (_silu_and_mul(gate_up).float() - exact).abs()
    assert error_ours.mean() <= 1.25 * error_compiled.mean() + 1e-6, (
        error_ours.mean(),
        error_compiled.mean(),
    )
    assert error_ours.max() <= 2 * error_compiled.max() + 1e-3, (error_ours.max(), error_compiled.max())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", [1, 7, 64])
@pytest.mark.parametrize("n, k", [(1024, 2048), (1024, 3072)])
def test_split_k_partials_norm_bf16_on_cuda_is_bitwise_the_two_kernels(rows, n, k):
    """In bf16 on the GPU, Qwen3-0.6B's o_proj and down_proj: the partial sums added in the norm
    (one kernel) give bitwise what ``small_gemm`` and the residual add + norm (two) give."""
    from minisgl_core.layers import triton_ops

    gen = torch.Generator("cuda").manual_seed(rows + k)
    x = torch.randn(rows, k, device="cuda", generator=gen).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=gen) * 0.05).bfloat16()
    residual = torch.randn(rows, n, device="cuda", generator=gen).bfloat16()
    weight = (torch.rand(n, device="cuda", generator=gen) + 0.5).bfloat16()
    partials = triton_ops.small_gemm_partials(x, w)
    assert isinstance(partials, triton_ops.SplitKPartials)
    normed, total = triton_ops.add_partials_rms_norm(partials, residual, weight, 1e-6)
    ref_normed, ref_total = triton_ops.rms_norm(triton_ops.small_gemm(x, w), weight, 1e-6, residual)
    assert torch.equal(total, ref_total) and torch.equal(normed, ref_normed)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", [1, 7, 32, 64])
@pytest.mark.parametrize("n, k", [(1024, 2048), (1024, 3072), (151936, 1024), (128256, 4096)])
def test_small_gemm_bf16_on_cuda_is_as_close_to_float32_as_cublas(rows, n, k):
    """In bf16 on the GPU, Qwen3-0.6B's o_proj and down_proj and both lm_heads: as close to a
    float32 product as cuBLAS's (``F.linear``) is, on average and at worst."""
    import torch.nn.functional as F

    from minisgl_core.layers import triton_ops

    gen = torch.Generator("cuda").manual_seed(rows + n)
    x = torch.randn(rows, k, device="cuda", generator=gen).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=gen) * 0.05).bfloat16()
    assert triton_ops.small_gemm_enabled(x, w)
    exact = x.float() @ w.float().T
    error_ours = (triton_ops.small_gemm(x, w).float() - exact).abs()
    error_cublas = (F.linear(x, w).float() - exact).abs()
    assert error_ours.mean() <= 1.1 * error_cublas.mean() + 1e-6, (error_ours.mean(), error_cublas.mean())
    assert error_ours.max() <= 1.5 * error_cublas.max() + 1e-3, (error_ours.max(), error_cublas.max())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens, hidden", [(1, 1024), (300, 4096), (8192, 1024), (5, 5120)])
@pytest.mark.parametrize("add", [False, True])
def test_rms_norm_bf16_on_cuda_matches_the_eager_arithmetic(tokens, hidden, add):
    """In bf16 on the GPU the Triton norm rounds where Hugging Face's eager code does (the residual
    sum, the normalized row, the product): within two bf16 steps of eager torch everywhere (one
    rounding step each), equal almost everywhere (the float32 sum's order differs, which moves a
    rounding now and then), and as far from float32 as eager is. (The
    compiled kernel is *closer* to float32: Inductor skips the intermediate bf16 rounding.)"""
    from minisgl_core.layers import triton_ops
    from minisgl_core.layers.fused import _normalize

    gen = torch.Generator("cuda").manual_seed(tokens + hidden)
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).bfloat16()
    residual = (torch.randn(tokens, hidden, device="cuda", generator=gen) * 4).bfloat16()
    weight = (torch.rand(hidden, device="cuda", generator=gen) + 0.5).bfloat16()
    if add:
        ours, total = triton_ops.rms_norm(x, weight, 1e-6, residual)
        assert torch.equal(total, x + residual)
        source = total
    else:
        ours, source = triton_ops.rms_norm(x, weight, 1e-6), x
    eager = _normalize(source, weight, 1e-6).float()
    ours = ours.float()
    step = eager.abs() * 2.0**-7 + 1e-30  # about one bf16 step (8 significant bits)
    assert ((ours - eager).abs() <= 2 * step).all(), (ours - eager).abs().max()
    assert (ours != eager).float().mean() < 0.05, (ours != eager).float().mean()
    exact = _normalize(source.float(), weight.float(), 1e-6)
    error_ours, error_eager = (ours - exact).abs(), (eager - exact).abs()
    assert error_ours.mean() <= 1.05 * error_eager.mean() + 1e-6, (error_ours.mean(), error_eager.mean())


# ---------------------------------------------------------------- the child process


def check_kernel() -> None:
    from minisgl_core.api import KVCache
    from minisgl_core.layers.fused import qkv_norm_rope
    from minisgl_core.layers.triton_ops import rope_store_kv

    gen = torch.Generator().manual_seed(0)
    for norm in (False, True):
        for q_heads, kv_heads, head_dim, page_size in (
            (4, 2, 8, 4),
            (8, 2, 80, 1),
            (6, 3, 128, 16),
            (2, 2, 16, 2),
        ):
            tokens, num_pages = 9, 12
            slots = num_pages * page_size
            heads = q_heads + 2 * kv_heads
            # a token stride wider than the heads (a view into a larger row), as any strided input
            wide = torch.randn(tokens, heads + 1, head_dim, generator=gen)
            qkv = wide[:, :heads]
            positions = torch.randint(0, 5000, (tokens,), generator=gen)
            inv_freq = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2).float() / head_dim))
            q_w = torch.rand(head_dim, generator=gen) + 0.5 if norm else None
            k_w = torch.rand(head_dim, generator=gen) + 0.5 if norm else None
            loc = torch.randperm(slots, generator=gen)[:tokens]
            cache = KVCache(num_layers=2, num_pages=num_pages, page_size=page_size, num_kv_heads=kv_heads,
                            head_dim=head_dim, dtype=torch.float32, device="cpu")  # fmt: skip
            cache.buffer.normal_(generator=gen)
            expected_pool = cache.buffer.clone()
            ref = qkv_norm_rope.__wrapped__(qkv, positions, inv_freq, q_w, k_w, q_heads, kv_heads, 1e-6)
            flat = expected_pool[1].view(2, slots, kv_heads, head_dim)
            flat[0, loc] = ref[:, q_heads : q_heads + kv_heads]
            flat[1, loc] = ref[:, q_heads + kv_heads :]
            start_pool = cache.buffer.clone()
            # one token a program, and the tiled kernel's blocks of 2 and 4 (9 tokens: the last partial)
            for tiles in (False, True, (2, 4), (4, 2)):
                cache.buffer.copy_(start_pool)
                q = rope_store_kv(qkv, positions, inv_freq, q_w, k_w, q_heads, kv_heads, 1e-6, cache, 1, loc,
                                  tiles=tiles)  # fmt: skip
                torch.testing.assert_close(q, ref[:, :q_heads], atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(
                    cache.buffer, expected_pool, atol=1e-5, rtol=1e-5
                )  # only loc changed
            print("ok", norm, head_dim)


def check_silu() -> None:
    import torch.nn.functional as F

    from minisgl_core.layers.fused import silu_and_mul

    gen = torch.Generator().manual_seed(0)
    for tokens, inter in ((1, 8), (5, 1500), (3, 2048)):  # 1500: a partial last block
        wide = torch.randn(tokens, 2 * inter + 3, generator=gen)
        gate_up = wide[:, : 2 * inter]  # a row stride wider than the row
        out = silu_and_mul(gate_up)
        expected = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        assert out.shape == (tokens, inter) and out.is_contiguous()
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
        print("ok", tokens, inter)


def check_gemm() -> None:
    """In float16 (the interpreter computes bfloat16 wrongly): every tile shape and split of
    ``small_gemm_config`` against a float32 product, rounded once; a row stride wider than the
    row; and a RowParallelLinear and an lm_head routed through it."""
    from minisgl_core.api.parallel import ParallelContext
    from minisgl_core.layers import triton_ops
    from minisgl_core.layers.embedding import ParallelLMHead
    from minisgl_core.layers.linear import RowParallelLinear

    gen = torch.Generator().manual_seed(0)
    cases = [(1, 100, 700), (5, 96, 1100), (16, 64, 2200), (37, 200, 1536), (3, 33000, 64), (64, 33000, 96)]
    for rows, n, k in cases:
        wide = torch.randn(rows, k + 8, generator=gen).half()
        x = wide[:, :k]  # a row stride wider than the row
        w = (torch.randn(n, k, generator=gen) * 0.05).half()
        assert triton_ops.small_gemm_enabled(x, w), (rows, n, k)
        got = triton_ops.small_gemm(x, w)
        exact = x.float() @ w.float().T
        assert got.dtype == torch.float16 and got.shape == (rows, n)
        torch.testing.assert_close(got.float(), exact, atol=2e-3, rtol=2e-3)
        print("ok")
    layer = RowParallelLinear(1100, 96, parallel=ParallelContext(), dtype=torch.float16, device="cpu")
    head = ParallelLMHead(33000, 64, parallel=ParallelContext(), dtype=torch.float16, device="cpu")
    x = torch.randn(3, 1100, generator=gen).half()
    h = torch.randn(3, 64, generator=gen).half()
    with torch.no_grad():
        layer.weight.copy_(torch.randn(96, 1100, generator=gen) * 0.05)
        head.weight.copy_(torch.randn(33000, 64, generator=gen) * 0.05)
        got = (layer(x), head(h))
    torch.testing.assert_close(got[0].float(), x.float() @ layer.weight.float().T, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(got[1].float(), h.float() @ head.weight.float().T, atol=2e-3, rtol=2e-3)
    assert triton_ops.small_gemm_enabled(x, layer.weight) and triton_ops.small_gemm_enabled(h, head.weight)
    print("ok")


def check_split_k() -> None:
    """In float16: the split-K partial sums left to the norm (``add_partials_rms_norm``, one kernel)
    against ``small_gemm`` then the residual add and norm (two), bitwise; their ``total()`` against
    ``small_gemm``'s sum, bitwise; a residual with a row stride wider than the row."""
    from minisgl_core.layers import triton_ops

    gen = torch.Generator().manual_seed(1)
    for rows, n, k in ((1, 1024, 2048), (5, 96, 1100), (37, 200, 1536), (64, 64, 1024)):
        x = torch.randn(rows, k, generator=gen).half()
        w = (torch.randn(n, k, generator=gen) * 0.05).half()
        residual = (torch.randn(rows, n + 3, generator=gen) * 2).half()[:, :n]
        weight = (torch.rand(n, generator=gen) + 0.5).half()
        partials = triton_ops.small_gemm_partials(x, w)
        split = triton_ops.small_gemm_config(rows, n, k)[3]
        assert isinstance(partials, triton_ops.SplitKPartials) and partials.parts.shape == (split, rows, n), (
            split
        )
        assert split > 1 and partials.shape == (rows, n) and partials.dtype == torch.float16
        summed = triton_ops.small_gemm(x, w)
        assert torch.equal(partials.total(), summed)
        normed, total = triton_ops.add_partials_rms_norm(partials, residual, weight, 1e-6)
        ref_normed, ref_total = triton_ops.rms_norm(summed, weight, 1e-6, residual)
        assert torch.equal(total, ref_total) and torch.equal(normed, ref_normed)
        assert normed.dtype == torch.float16 and normed.shape == (rows, n)
        print("ok")
    # RowParallelLinear hands out the partials only when asked (split_k): reduce=False alone stays a tensor
    from minisgl_core.api.parallel import ParallelContext
    from minisgl_core.layers.linear import RowParallelLinear

    layer = RowParallelLinear(1100, 96, parallel=ParallelContext(), dtype=torch.float16, device="cpu")
    x = torch.randn(5, 1100, generator=gen).half()
    with torch.no_grad():
        layer.weight.copy_(torch.randn(96, 1100, generator=gen) * 0.05)
        summed, plain = layer(x), layer(x, reduce=False)
        deferred = layer(x, reduce=False, split_k=True)
    assert isinstance(plain, torch.Tensor) and torch.equal(plain, summed)
    assert isinstance(deferred, triton_ops.SplitKPartials) and torch.equal(deferred.total(), summed)
    print("ok")


def _on_and_off(model, dtype: str, switches: tuple[str, ...], calls: list, prompts, params) -> dict:
    """A CPU LLM's outputs with the fast-path ``switches`` (environment variables) on ("1") and off
    ("0"); ``calls`` counts the fast path's calls, which must happen exactly when it is on."""
    from minisgl_core.llm import LLM

    runs = {}
    for flag in ("1", "0"):
        for name in switches:
            os.environ[name] = flag
        calls.clear()
        llm = LLM(model, device="cpu", dtype=dtype, attn="torch", page_size=4)
        runs[flag] = llm.generate(prompts, params, use_tqdm=False)
        llm.close()
        assert bool(calls) == (flag == "1"), (flag, len(calls))
    return runs


def check_split_k_model(tmp: str) -> None:
    """A float16 Qwen3 whose o_proj and down_proj split K (K of 1024) generates the same tokens
    and logprobs, bitwise, with the split-K sums added in the norms after them and without."""
    import minisgl_core.layers.fused as fused
    import minisgl_core.layers.norm as norm
    from minisgl_core.demo.factories import make_model_dir
    from minisgl_core.sampling import SamplingParams

    calls = []
    kernel = fused.add_partials_rms_norm
    norm.add_partials_rms_norm = lambda *a, **kw: calls.append(1) or kernel(*a, **kw)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=3)
    prompts = [list(range(5, 30)), [7, 8, 9]]
    model = make_model_dir(
        Path(tmp) / "qwen3", "Qwen3ForCausalLM", dtype="float16", max_position_embeddings=128,
        num_attention_heads=8, head_dim=128, intermediate_size=1024,
    )  # fmt: skip
    runs = _on_and_off(model, "float16", ("MINISGL_SPLIT_K_NORM",), calls, prompts, params)
    for fused_run, plain in zip(runs["1"], runs["0"], strict=True):
        assert fused_run.token_ids == plain.token_ids, (fused_run.token_ids, plain.token_ids)
        assert [a.logprob for a in fused_run.logprobs] == [b.logprob for b in plain.logprobs]
    print("same")


def check_norm() -> None:
    """The Triton RMS norm (through ``fused.rms_norm`` / ``add_rms_norm``, which pick it under the
    interpreter) against the eager arithmetic in float32: rows wider than a block's power of two,
    strided rows, a [tokens, heads, dim] input, no rows."""
    from minisgl_core.layers import fused, triton_ops

    gen = torch.Generator().manual_seed(0)
    for shape in ((1, 8), (7, 1500), (3, 4, 96), (0, 64)):
        wide = torch.randn(*shape[:-1], shape[-1] + 5, generator=gen)
        x = wide[..., : shape[-1]]  # a row stride wider than the row
        residual = torch.randn(shape, generator=gen) * 3
        weight = torch.rand(shape[-1], generator=gen) + 0.5
        assert triton_ops.norm_enabled(x, weight)
        out = fused.rms_norm(x, weight, 1e-6)
        assert out.shape == x.shape and out.is_contiguous()
        torch.testing.assert_close(out, fused._normalize(x, weight, 1e-6), atol=1e-5, rtol=1e-5)
        print("ok", shape)
        normed, total = fused.add_rms_norm(x, residual, weight, 1e-6)
        assert torch.equal(total, x + residual)
        torch.testing.assert_close(normed, fused._normalize(x + residual, weight, 1e-6), atol=1e-5, rtol=1e-5)
        # a residual of another dtype is not the kernel's case: torch's promotion, as before
        _, wide_total = fused.add_rms_norm(x, residual.double(), weight, 1e-6)
        assert wide_total.dtype == torch.float64 and torch.equal(wide_total, x + residual.double())
        # a residual whose last dimension is strided (a transposed view) is read correctly
        strided = (
            residual.transpose(-1, -2).contiguous().transpose(-1, -2) if residual.dim() > 1 else residual
        )
        normed_s, total_s = fused.add_rms_norm(x, strided, weight, 1e-6)
        assert torch.equal(total_s, total) and torch.equal(normed_s, normed)
        print("ok", shape, "residual")


def check_model(tmp: str) -> None:
    import minisgl_core.layers.decoder as decoder
    from minisgl_core.demo.factories import make_model_dir
    from minisgl_core.sampling import SamplingParams

    calls = []
    kernel = decoder.rope_store_kv
    decoder.rope_store_kv = lambda *a, **kw: calls.append(1) or kernel(*a, **kw)  # count the fused calls

    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=3)
    prompts = [list(range(5, 40)), [7, 8, 9]]
    for arch in ("Qwen3ForCausalLM", "LlamaForCausalLM"):
        model = make_model_dir(Path(tmp) / arch, arch, max_position_embeddings=256)
        switches = ("MINISGL_FUSED_KV", "MINISGL_TRITON_SILU", "MINISGL_TRITON_NORM")
        runs = _on_and_off(model, "float32", switches, calls, prompts, params)
        for fused, plain in zip(runs["1"], runs["0"], strict=True):
            assert fused.token_ids == plain.token_ids, (fused.token_ids, plain.token_ids)
            for a, b in zip(fused.logprobs, plain.logprobs, strict=True):
                assert abs(a.logprob - b.logprob) < 1e-4, (a, b)
        print("same", arch)


def check_collective() -> None:
    """The wide all-reduce's sum (``SymmMemAllReduce``): every rank's buffer, found through a table
    of pointers, summed in rank order into the output; sizes not a multiple of the block."""
    from minisgl_core.layers._triton_collectives import sum_peer_buffers_kernel

    gen = torch.Generator().manual_seed(3)
    for world, n, block in ((2, 10_000, 4096), (3, 5, 64), (4, 4096, 1024)):
        buffers = [torch.randn(n + 7, generator=gen) for _ in range(world)]  # larger than the tensor
        ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
        out = torch.full((n,), float("nan"))
        sum_peer_buffers_kernel[(-(-n // block),)](ptrs, out, n, WORLD=world, BLOCK=block)
        expected = buffers[0][:n].clone()
        for b in buffers[1:]:
            expected += b[:n]
        assert torch.equal(out, expected), (out - expected).abs().max()
        print("ok")
    # the sum fused with the residual add and RMS norm after it (SymmMemAllReduce.add_rms_norm):
    # bit for bit the wide sum, then the Triton add + norm
    from minisgl_core.layers import triton_ops
    from minisgl_core.layers._triton_collectives import sum_add_rms_norm_kernel

    for world, rows, n in ((2, 5, 1500), (3, 1, 64)):
        buffers = [torch.randn(rows * n + 9, generator=gen) for _ in range(world)]
        ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
        residual = torch.randn(rows, n, generator=gen) * 3
        weight = torch.rand(n, generator=gen) + 0.5
        summed = torch.empty(rows * n)
        sum_peer_buffers_kernel[(-(-rows * n // 1024),)](ptrs, summed, rows * n, WORLD=world, BLOCK=1024)
        expected_out, expected_total = triton_ops.rms_norm(summed.view(rows, n), weight, 1e-6, residual)
        # a program per row, then fewer programs than rows (each takes every programs-th row); with
        # the barrier inside the kernel (symm_mem_norm_barrier) the peers' flags are raised in
        # advance, as they would be by the peers' programs (the interpreter runs one rank)
        for programs, barrier in ((rows, False), (2, False), (rows, True), (2, True)):
            rank = world - 1
            pads = [torch.zeros(programs * world + 3, dtype=torch.int32) for _ in range(world)]
            for p in range(programs):
                pads[rank][p * world : (p + 1) * world] = 1  # every peer's flag raised
                pads[rank][p * world + rank] = 0  # (our own slot is never raised)
            signals = torch.tensor([t.data_ptr() for t in pads], dtype=torch.int64)
            out, total = torch.full((rows, n), float("nan")), torch.full((rows, n), float("nan"))
            sum_add_rms_norm_kernel[(programs,)](
                ptrs, signals, rank, residual, weight, 1e-6, out, total, rows, programs, n,
                WORLD=world, BLOCK=triton_ops._pow2(n), BARRIER=barrier,
            )  # fmt: skip
            assert torch.equal(total, expected_total), (total - expected_total).abs().max()
            assert torch.equal(out, expected_out), (out - expected_out).abs().max()
            # with the barrier every program took its peers' flags down in our pad and raised ours in
            # each peer's, on its own channel; without it the pads are untouched
            for r in range(world):
                for p in range(programs):
                    got = pads[r][p * world : (p + 1) * world].tolist()
                    if r == rank:
                        want = [0] * world if barrier else [int(q != rank) for q in range(world)]
                    else:
                        want = [int(barrier and q == rank) for q in range(world)]
                    assert got == want, (programs, barrier, r, p, got, want)
                assert pads[r][programs * world :].tolist() == [0, 0, 0]
        print("ok")


def check_layout() -> None:
    """``runner.layout.build_layout`` (host offsets, the page ids by the Triton kernel) equals the
    API's ``paged_layout`` on batches of scattered pages: prefill, decode, one sequence; a
    ``FastLayoutBatch`` builds it once, when first read, and not before."""
    import dataclasses

    from minisgl_core.api import KVSpec
    from minisgl_core.runner import layout as layout_module
    from minisgl_core.runner.layout import FastLayoutBatch, build_layout, paged_layout, set_layout
    from minisgl_core.testing.harness import PagedSequences, make_attention
    from minisgl_core.testing.policy_suite import resolve

    spec = KVSpec(num_layers=1, num_qo_heads=2, num_kv_heads=1, head_dim=8, scale=1.0)
    gen = torch.Generator().manual_seed(5)
    for page_size, lens in ((1, [3, 70, 1]), (4, [5, 130, 64, 2]), (16, [300])):
        attn = make_attention(resolve("attention", "torch"), spec, page_size=page_size,
                              num_pages=2048 // page_size, max_requests=8, max_context_len=512)  # fmt: skip
        sequences = PagedSequences(attn, seed=page_size)
        rows = [sequences.new_row() for _ in lens]
        steps = [[torch.randint(100, (n,), generator=gen).tolist() for n in lens], [[1]] * len(lens)]
        for tokens in steps:
            batch = sequences.extend(rows, tokens)
            expected = paged_layout(batch, page_size)
            actual = build_layout(batch)
            for name, a, b in zip(expected._fields, actual, expected, strict=True):
                assert a.dtype == b.dtype == torch.int32 and torch.equal(a, b), (name, page_size, a, b)
            batch.__dict__.pop("layout", None)
            set_layout(batch)  # the interpreter counts as "Triton runs": the fast layout is set
            assert torch.equal(batch.__dict__["layout"].kv_indices, expected.kv_indices)
            # a decode graph's replay batch builds it on first read only, the fast way
            lazy = FastLayoutBatch(**{f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)})
            built = []
            layout_module.build_layout = lambda b, built=built: built.append(b) or build_layout(b)
            try:
                assert "layout" not in lazy.__dict__ and not built
                first, again = lazy.layout, lazy.layout
            finally:
                layout_module.build_layout = build_layout
            assert built == [lazy] and first is again
            for name, a, b in zip(expected._fields, first, expected, strict=True):
                assert torch.equal(a, b), (name, page_size, a, b)
            print("ok")


if __name__ == "__main__":
    if sys.argv[1] == "checks":  # e.g. ``checks norm,gemm``
        kernel_check_functions = {
            "kernel": check_kernel, "silu": check_silu, "layout": check_layout, "norm": check_norm,
            "gemm": check_gemm, "split_k": check_split_k, "collective": check_collective,
        }  # fmt: skip
        run_checks(kernel_check_functions, sys.argv[2])
    elif sys.argv[1] == "split_k_model":
        check_split_k_model(sys.argv[2])
    else:
        check_model(sys.argv[2])
