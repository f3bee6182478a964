"""The hand-written Triton kernels compile for the GPUs we run on (sm_90, sm_80), on a machine
without one: Triton type-checks and lowers to a cubin without a device. The CPU tests run these
kernels under Triton's interpreter, which does not type-check (a name assigned with two shapes
in the two branches of an ``if`` ran there and failed to compile on the GPU)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("triton")

from triton import compile as triton_compile  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TARGETS = [GPUTarget("cuda", 90, 32), GPUTarget("cuda", 80, 32)]


#: shared memory a block of one program may use (bytes): sm_90's 227 KiB, sm_89's 99, sm_80's 163
SHARED_LIMIT = {90: 232448, 89: 101376, 80: 166912}


def compiles(kernel, signature: dict[str, str], constants: dict[str, object], target: GPUTarget, **options):
    """``kernel`` compiles to a cubin for ``target`` (``options``: num_warps, num_stages as
    launched) and its shared memory fits the target's (a launch past it fails only on the GPU)."""
    signature = {**signature, **dict.fromkeys(constants, "constexpr")}
    compiled = triton_compile(
        ASTSource(kernel, signature, constexprs=constants), target=target, options=options
    )
    assert compiled.asm["cubin"], "no cubin"
    assert compiled.metadata.shared <= SHARED_LIMIT[target.arch], (
        f"{compiled.metadata.shared} bytes of shared memory"
    )
    return compiled


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"sm{t.arch}")
@pytest.mark.parametrize(
    "heads, half, norm, dtype",
    [
        ((16, 8), 64, True, "bf16"),
        ((32, 8), 64, False, "bf16"),
        ((4, 2), 40, True, "fp16"),
        ((6, 1), 8, False, "fp32"),
    ],
)
def test_rope_store_kernel_compiles(target, heads, half, norm, dtype):
    import triton

    from minisgl_core.layers._triton_kernels import rope_store_kernel

    t = f"*{dtype}"
    signature = {"qkv": t, "qkv_token_stride": "i64", "positions": "*i64", "inv_freq": "*fp32", "q_weight": t,
                 "k_weight": t, "eps": "fp32", "q_out": t, "k_pool": t, "v_pool": t, "loc": "*i64",
                 "n_tokens": "i32"}  # fmt: skip
    q_heads, kv_heads = heads
    constants = {"NUM_Q": q_heads, "NUM_KV": kv_heads, "HALF": half, "BLOCK": triton.next_power_of_2(half),
                 "BLOCK_Q": triton.next_power_of_2(q_heads), "BLOCK_KV": triton.next_power_of_2(kv_heads),
                 "NORM": norm}  # fmt: skip
    for tokens in (1, 2, 4):  # one token a program (the fast path off), and the rule's tiles
        compiles(rope_store_kernel, signature, {**constants, "TOKENS": tokens}, target)


def test_rope_store_kernel_into_a_float8_pool():
    """``--kv-cache-dtype fp8_e4m3`` (sm89+): k and v rounded to the model's dtype, clamped, then
    converted with saturation (``cvt.rn.satfinite``): what ``KVCache.store`` writes. The CUDA
    test in test_triton_ops.py compares the bytes."""
    import re

    from minisgl_core.layers._triton_kernels import rope_store_kernel

    signature = {"qkv": "*bf16", "qkv_token_stride": "i64", "positions": "*i64", "inv_freq": "*fp32",
                 "q_weight": "*bf16", "k_weight": "*bf16", "eps": "fp32", "q_out": "*bf16", "k_pool": "*fp8e4nv",
                 "v_pool": "*fp8e4nv", "loc": "*i64", "n_tokens": "i32"}  # fmt: skip
    constants = {"NUM_Q": 16, "NUM_KV": 8, "HALF": 64, "BLOCK": 64, "BLOCK_Q": 16, "BLOCK_KV": 8, "NORM": True,
                 "TOKENS": 2}  # fmt: skip
    signature = {**signature, **dict.fromkeys(constants, "constexpr")}
    compiled = triton_compile(
        ASTSource(rope_store_kernel, signature, constexprs=constants), target=GPUTarget("cuda", 90, 32)
    )
    ptx = compiled.asm["ptx"]
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx
    assert re.search(r"(min|max)\.[a-z.]*f32", ptx)  # the clamp at ±448
    # not for sm_80 (Triton has no e4m3 there): the decoder keeps KVCache.store on such GPUs
    with pytest.raises(Exception, match="fp8e4nv"):
        triton_compile(
            ASTSource(rope_store_kernel, signature, constexprs=constants), target=GPUTarget("cuda", 80, 32)
        )


def test_float8_stores_only_on_sm89_and_newer(monkeypatch):
    import torch

    from minisgl_core.layers import triton_ops

    assert not triton_ops.float8_stores(torch.device("cpu"))
    for capability, fused in (
        ((8, 0), False),
        ((8, 6), False),
        ((8, 9), True),
        ((9, 0), True),
        ((10, 0), True),
    ):
        triton_ops._float8_supported.cache_clear()
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index, c=capability: c)
        assert triton_ops.float8_stores(torch.device("cuda", 0)) is fused, capability
    triton_ops._float8_supported.cache_clear()


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"sm{t.arch}")
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize(
    "rows, n, k", [(1, 1024, 2048), (64, 1024, 3072), (8, 151936, 1024), (48, 128256, 4096)]
)
def test_small_gemm_kernels_compile(target, dtype, rows, n, k):
    """Every tile :func:`small_gemm_config` picks for Qwen3-0.6B's o_proj / down_proj and the two
    lm_heads, and the split-K sum."""
    from minisgl_core.layers._triton_kernels import small_gemm_kernel, split_sum_kernel
    from minisgl_core.layers.triton_ops import _SPLIT_SUM_BLOCK, small_gemm_config, small_gemm_k_per_split

    block_m, block_n, block_k, split = small_gemm_config(rows, n, k)
    out = f"*{dtype}" if split == 1 else "*fp32"
    signature = {"x": f"*{dtype}", "x_stride": "i64", "w": f"*{dtype}", "out": out, "m": "i32", "n": "i32",
                 "k": "i32"}  # fmt: skip
    constants = {"K_PER_SPLIT": small_gemm_k_per_split(k, block_k, split), "BLOCK_M": block_m,
                 "BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT": split}  # fmt: skip
    compiles(small_gemm_kernel, signature, constants, target)
    if split > 1:
        signature = {"partials": "*fp32", "out": f"*{dtype}", "size": "i32"}
        compiles(split_sum_kernel, signature, {"SPLIT": split, "BLOCK": _SPLIT_SUM_BLOCK}, target)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"sm{t.arch}")
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_gumbel_kernels_compile(target, dtype):
    from triton import next_power_of_2

    from minisgl_core.runner._sampler_triton import chunk_race_kernel, chunk_stats_kernel
    from minisgl_core.runner.sampler import _CHUNK, _TINY, SAMPLER_SPANS

    signature = {"logits": f"*{dtype}", "row_stride": "i64", "scale": "*fp32", "chunk_max": "*fp32",
                 "chunk_sum": "*fp32", "vocab": "i32", "chunks": "i32"}  # fmt: skip
    for span in SAMPLER_SPANS:
        compiles(chunk_stats_kernel, signature, {"CHUNK": _CHUNK, "SPAN": span}, target)
    signature = {"logits": f"*{dtype}", "row_stride": "i64", "scale": "*fp32", "noise_scale": "*fp32", "seed": "i32",
                 "vocab": "i32", "chunk_max": "*fp32", "chunk_sum": "*fp32", "chunks": "i32", "best_value": "*fp32",
                 "best_index": "*i64"}  # fmt: skip
    for vocab in (151936, 128256 // 2):  # a model's and a TP rank's slice
        constants = {
            "TINY": _TINY,
            "CHUNK": _CHUNK,
            "CHUNKS_P2": next_power_of_2(-(-vocab // _CHUNK)),
            "FAST_LOG": True,
        }
        compiles(chunk_race_kernel, signature, constants, target)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"sm{t.arch}")
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_silu_mul_kernel_compiles(target, dtype):
    from minisgl_core.layers._triton_kernels import silu_mul_kernel
    from minisgl_core.layers.triton_ops import _SILU_BLOCK

    signature = {"gate_up": f"*{dtype}", "row_stride": "i64", "out": f"*{dtype}", "inter": "i32"}
    compiles(silu_mul_kernel, signature, {"BLOCK": _SILU_BLOCK}, target)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"sm{t.arch}")
@pytest.mark.parametrize(
    "dtype, hidden, add", [("bf16", 1024, True), ("bf16", 4096, False), ("fp32", 96, True)]
)
def test_rms_norm_kernel_compiles(target, dtype, hidden, add):
    from minisgl_core.layers._triton_kernels import rms_norm_kernel
    from minisgl_core.layers.triton_ops import _pow2

    t = f"*{dtype}"
    signature = {"x": t, "x_stride": "i64", "residual": t, "residual_stride": "i64", "weight": t, "eps": "fp32",
                 "out": t, "total": t, "n": "i32"}  # fmt: skip
    compiles(rms_norm_kernel, signature, {"BLOCK": _pow2(hidden), "ADD": add}, target)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"sm{t.arch}")
@pytest.mark.parametrize(
    "dtype, parts, part_major", [("bf16", 4, True), ("fp16", 2, True), ("bf16", 8, False)]
)
def test_rms_norm_kernel_over_split_k_partials_compiles(target, dtype, parts, part_major):
    """The variant that adds a split-K GEMM's float32 partials (``add_partials_rms_norm``), and
    a mixture of experts' top-8 rows of a token in the model's dtype (``PART_MAJOR=False``)."""
    from minisgl_core.layers._triton_kernels import rms_norm_kernel

    t = f"*{dtype}"
    signature = {"x": "*fp32" if part_major else t, "x_stride": "i64", "residual": t, "residual_stride": "i64",
                 "weight": t, "eps": "fp32", "out": t, "total": t, "n": "i32"}  # fmt: skip
    constants = {"BLOCK": 2048, "ADD": True, "PARTS": parts, "PART_MAJOR": part_major}
    compiles(rms_norm_kernel, signature, constants, target)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"sm{t.arch}")
@pytest.mark.parametrize("dtype, world", [("bf16", 2), ("fp32", 4)])
def test_all_reduce_sum_kernel_compiles(target, dtype, world):
    from minisgl_core.distributed import SymmMemAllReduce
    from minisgl_core.layers._triton_collectives import sum_peer_buffers_kernel

    signature = {"buffer_ptrs": "*i64", "out": f"*{dtype}", "n": "i32"}
    compiles(
        sum_peer_buffers_kernel, signature, {"WORLD": world, "BLOCK": SymmMemAllReduce.WIDE_BLOCK}, target
    )


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"sm{t.arch}")
@pytest.mark.parametrize("hidden, barrier", [(4096, True), (1024, False)])
def test_all_reduce_norm_kernel_compiles(target, hidden, barrier):
    from minisgl_core.layers._triton_collectives import sum_add_rms_norm_kernel
    from minisgl_core.layers.triton_ops import _pow2

    t = "*bf16"
    signature = {
        "buffer_ptrs": "*i64",
        "signal_ptrs": "*i64",
        "rank": "i32",
        "residual": t,
        "weight": t,
        "eps": "fp32",
        "out": t,
        "total": t,
        "rows": "i32",
        "programs": "i32",
        "n": "i32",
    }
    compiles(
        sum_add_rms_norm_kernel, signature, {"WORLD": 2, "BLOCK": _pow2(hidden), "BARRIER": barrier}, target
    )


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"sm{t.arch}")
@pytest.mark.parametrize("page", [1, 16])
def test_kv_indices_kernel_compiles(target, page):
    from minisgl_core.runner._layout_triton import kv_indices_kernel
    from minisgl_core.runner.layout import _BLOCK

    signature = {"page_table": "*i32", "table_stride": "i32", "req_slots": "*i32", "kv_indptr": "*i32",
                 "kv_indices": "*i32"}  # fmt: skip
    compiles(kv_indices_kernel, signature, {"PAGE": page, "BLOCK": _BLOCK}, target)


def _ptx(kernel, signature: dict[str, str], constants: dict[str, object], options: dict) -> str:
    signature = {**signature, **dict.fromkeys(constants, "constexpr")}
    compiled = triton_compile(
        ASTSource(kernel, signature, constexprs=constants), target=TARGETS[0], options=options
    )
    return compiled.asm["ptx"]


def test_pdl_variants_wait_for_the_kernel_before():
    """``MINISGL_PDL=1`` (``triton_ops.pdl_options``): every kernel launched with programmatic
    dependent launch compiles for sm_90 with ``griddepcontrol.wait`` (the wait for the kernel before
    it, without which it could read that kernel's output too early), and without the option none
    has it; the decoder's kernels then release the kernel after them
    (``griddepcontrol.launch_dependents``, after the wait)."""
    from minisgl_core.layers._triton_collectives import sum_add_rms_norm_kernel
    from minisgl_core.layers._triton_kernels import rms_norm_kernel, rope_store_kernel, silu_mul_kernel

    t = "*bf16"
    kernels = [
        (silu_mul_kernel, {"gate_up": t, "row_stride": "i64", "out": t, "inter": "i32"}, {"BLOCK": 1024}),
        (rms_norm_kernel, {"x": t, "x_stride": "i64", "residual": t, "residual_stride": "i64", "weight": t,
                           "eps": "fp32", "out": t, "total": t, "n": "i32"}, {"BLOCK": 4096, "ADD": True}),
        (rope_store_kernel, {"qkv": t, "qkv_token_stride": "i64", "positions": "*i64", "inv_freq": "*fp32",
                             "q_weight": t, "k_weight": t, "eps": "fp32", "q_out": t, "k_pool": t, "v_pool": t,
                             "loc": "*i64", "n_tokens": "i32"},
         {"NUM_Q": 32, "NUM_KV": 8, "HALF": 64, "BLOCK": 64, "BLOCK_Q": 32, "BLOCK_KV": 8, "NORM": False,
          "TOKENS": 2}),
        (sum_add_rms_norm_kernel, {"buffer_ptrs": "*i64", "signal_ptrs": "*i64", "rank": "i32", "residual": t,
                                   "weight": t, "eps": "fp32", "out": t, "total": t, "rows": "i32",
                                   "programs": "i32", "n": "i32"},
         {"WORLD": 2, "BLOCK": 4096, "BARRIER": True}),
    ]  # fmt: skip
    for kernel, signature, constants in kernels:
        ptx = _ptx(kernel, signature, {**constants, "PDL": True}, {"launch_pdl": True})
        assert "griddepcontrol.wait" in ptx, kernel.fn.__name__
        if kernel is not sum_add_rms_norm_kernel:
            assert ptx.index("griddepcontrol.wait") < ptx.index("griddepcontrol.launch_dependents")
        plain = _ptx(kernel, signature, constants, {})
        assert "griddepcontrol" not in plain, kernel.fn.__name__


def test_pdl_is_off_unless_asked_and_on_cuda(monkeypatch):
    from minisgl_core.layers import triton_ops

    monkeypatch.delenv("MINISGL_PDL", raising=False)
    assert triton_ops.pdl_options(__import__("torch").device("cpu")) == {}
    monkeypatch.setenv("MINISGL_PDL", "1")
    assert triton_ops.pdl_options(__import__("torch").device("cpu")) == {}  # only CUDA launches with it


def test_pdl_follows_the_scope_where_the_variable_is_unset(monkeypatch):
    """``MINISGL_PDL`` unset: the kernels take programmatic dependent launch inside
    ``pdl_scope(True)`` only (the CUDA graph runner's small decode graphs); ``1`` or ``0`` decides
    everywhere, scope or not."""
    import torch

    from minisgl_core.layers import triton_ops

    monkeypatch.setattr(triton_ops, "_pdl_supported", lambda index: True)  # (no GPU here)
    gpu = torch.device("cuda", 0)
    monkeypatch.delenv("MINISGL_PDL", raising=False)
    assert triton_ops.pdl_options(gpu) == {}
    with triton_ops.pdl_scope(True):
        assert triton_ops.pdl_options(gpu) == {"PDL": True, "launch_pdl": True}
        with triton_ops.pdl_scope(False):
            assert not triton_ops.pdl_enabled(gpu)
        assert triton_ops.pdl_enabled(gpu)
    assert not triton_ops.pdl_enabled(gpu)
    monkeypatch.setenv("MINISGL_PDL", "0")
    with triton_ops.pdl_scope(True):
        assert not triton_ops.pdl_enabled(gpu)
    monkeypatch.setenv("MINISGL_PDL", "1")
    assert triton_ops.pdl_enabled(gpu)
    with triton_ops.pdl_scope(False):
        assert triton_ops.pdl_enabled(gpu)
    with triton_ops.pdl_scope(True):
        assert not triton_ops.pdl_enabled(torch.device("cpu"))


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"sm{t.arch}")
@pytest.mark.parametrize("block", [16, 32, 64, 128])
@pytest.mark.parametrize(
    "dtype, scale, weights",
    [("bf16", None, None), ("bf16", "bf16", None), ("bf16", "fp32", None), ("fp32", None, None),
     ("bf16", None, "fp8e4nv"), ("bf16", "bf16", "fp8e4nv"), ("bf16", None, "i8"), ("bf16", "bf16", "i8")],
)  # fmt: skip
def test_moe_grouped_gemm_compiles(target, block, dtype, scale, weights):
    """The mixture-of-experts grouped GEMM at each block size its launch picks, its uses (gate/up
    without a scale, SiLU·mul fused in or not; down scaled by the router's weight: in the model's
    dtype for Qwen3-MoE, float32 for Mixtral), Qwen3-30B-A3B's shapes, and experts quantized to
    e4m3 or int8 (``weights``: a float32 scale a row; int8 converted in the kernel, e4m3 multiplied
    by e4m3 activation rows: on sm_90 from 64-row blocks an e4m3 wgmma, below that Triton's
    ``mma.sync`` of both tiles converted to float16, exactly)."""
    from minisgl_core.layers._triton_moe import grouped_gemm_kernel, launch_config

    if weights == "fp8e4nv" and target.arch < 89:
        pytest.skip("e4m3 needs sm_89 or newer (Experts.quantize refuses it on older GPUs)")
    t = f"*{dtype}"
    w8a8 = weights == "fp8e4nv"  # the rows e4m3 as well, a float32 scale each
    signature = {"a": "*fp8e4nv" if w8a8 else t, "a_stride": "i64", "w": f"*{weights or dtype}", "w_stride_e": "i64",
                 "w_stride_n": "i64", "c": t, "c_stride": "i64", "sorted_pairs": "*i64", "block_expert": "*i64",
                 "scale": f"*{scale or dtype}", "w_scale": "*fp32", "w_scale_stride": "i64", "a_scale": "*fp32",
                 "pairs": "i32", "n": "i32", "k": "i32", "num_experts": "i32"}  # fmt: skip
    # (output columns, inner size, gated): gate/up fused (columns of each half) or not, then down
    uses = [(2048, 768, False)] if scale else [(768, 2048, True), (1536, 2048, False)]
    for n, k, gated in uses:
        block_n, block_k, warps, stages = launch_config(
            block, n, k, pairs=8 if block == 16 else 4096, gated=gated, w8a8=w8a8
        )
        constants = {"ROW_DIV": 1 if scale else 8, "HAS_SCALE": scale is not None, "HAS_W_SCALE": weights is not None,
                     "IEEE": dtype == "fp32", "GATED": gated, "HAS_A_SCALE": w8a8,
                     "FP8_DOT": w8a8, "SWAP_AB": False, "BLOCK_M": block, "BLOCK_N": block_n,
                     "BLOCK_K": block_k}  # fmt: skip
        compiled = compiles(
            grouped_gemm_kernel, signature, constants, target, num_warps=warps, num_stages=stages
        )
        mma = set(re.findall(r"mma\.[.\w]*?\.f32\.(\w+)\.", compiled.asm["ptx"]))
        if weights == "fp8e4nv" and target.arch == 90:
            assert mma == ({"e4m3"} if block >= 64 else {"f16"}), mma
        if w8a8 and block < 64:  # the product transposed: the weights' columns fill wgmma's M side
            compiled = compiles(
                grouped_gemm_kernel, signature, {**constants, "SWAP_AB": True}, target, num_warps=warps,
                num_stages=stages,
            )  # fmt: skip
            ptx = compiled.asm["ptx"]
            if target.arch == 90:
                assert set(re.findall(r"wgmma\.[.\w]*?\.f32\.(\w+)\.", ptx)) == {"e4m3"}


@pytest.mark.parametrize("block", [16, 32, 64, 128])
def test_w8a8_grouped_gemm_compiles_for_ada(block):
    """e4m3 experts on Ada (sm_89, the oldest GPU ``Experts.quantize`` accepts e4m3 on): every use
    of the W8A8 launch compiles to Ada's e4m3 ``mma.sync`` and fits its 99 KiB of shared memory."""
    from minisgl_core.layers._triton_moe import grouped_gemm_kernel, launch_config

    target = GPUTarget("cuda", 89, 32)
    signature = {"a": "*fp8e4nv", "a_stride": "i64", "w": "*fp8e4nv", "w_stride_e": "i64", "w_stride_n": "i64",
                 "c": "*bf16", "c_stride": "i64", "sorted_pairs": "*i64", "block_expert": "*i64", "scale": "*bf16",
                 "w_scale": "*fp32", "w_scale_stride": "i64", "a_scale": "*fp32", "pairs": "i32", "n": "i32",
                 "k": "i32", "num_experts": "i32"}  # fmt: skip
    for n, k, gated, scaled in [
        (768, 2048, True, False),
        (1536, 2048, False, False),
        (2048, 768, False, True),
    ]:
        block_n, block_k, warps, stages = launch_config(
            block, n, k, pairs=8 if block == 16 else 4096, gated=gated, w8a8=True
        )
        constants = {"ROW_DIV": 1 if scaled else 8, "HAS_SCALE": scaled, "HAS_W_SCALE": True, "IEEE": False,
                     "GATED": gated, "HAS_A_SCALE": True, "FP8_DOT": True, "BLOCK_M": block, "BLOCK_N": block_n,
                     "BLOCK_K": block_k}  # fmt: skip
        for swap in (False, True) if block < 64 else (False,):
            compiled = compiles(
                grouped_gemm_kernel, signature, {**constants, "SWAP_AB": swap}, target, num_warps=warps,
                num_stages=stages,
            )  # fmt: skip
            assert set(re.findall(r"mma\.[.\w]*?\.f32\.(\w+)\.", compiled.asm["ptx"])) == {"e4m3"}


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"sm{t.arch}")
@pytest.mark.parametrize("experts, rows", [(128, 16), (128, 128), (8, 64)])
def test_moe_align_kernels_compile(target, experts, rows):
    """The three kernels of the experts' schedule (``_triton_moe.align``): Qwen3-30B-A3B's 128
    experts and Mixtral's 8, at a decode step's and a prefill step's block rows."""
    import triton

    from minisgl_core.layers._triton_moe import count_pairs_kernel, run_starts_kernel, scatter_pairs_kernel

    compiles(count_pairs_kernel, {"ids": "*i64", "counts": "*i32", "slot": "*i32", "sorted_pairs": "*i64",
                                  "pairs": "i32", "slots": "i32"}, {"BLOCK": 1024}, target)  # fmt: skip
    compiles(run_starts_kernel, {"counts": "*i32", "starts": "*i32", "block_expert": "*i64", "num_experts": "i32",
                                 "blocks": "i32"},
             {"ROWS": rows, "EXPERTS": max(16, triton.next_power_of_2(experts)), "BLOCKS": 32}, target)  # fmt: skip
    compiles(scatter_pairs_kernel, {"ids": "*i64", "starts": "*i32", "slot": "*i32", "sorted_pairs": "*i64",
                                    "pairs": "i32"}, {"BLOCK": 1024}, target)  # fmt: skip


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"sm{t.arch}")
@pytest.mark.parametrize(
    "experts, top_k, logits, weights",
    [(128, 8, "bf16", "bf16"), (8, 2, "bf16", "fp32"), (60, 6, "fp16", "fp16"), (512, 10, "bf16", "bf16")],
)
def test_moe_route_kernel_compiles(target, experts, top_k, logits, weights):
    """The router in one kernel (``_triton_moe.route``): Qwen3-30B-A3B's 128 experts and top 8,
    Mixtral's 8 and top 2 with float32 weights, a count that is no power of two, and 512 experts
    (four warps), as ``route`` launches it."""
    import triton

    from minisgl_core.layers._triton_moe import route_kernel

    block = max(16, triton.next_power_of_2(experts))
    compiles(
        route_kernel,
        {
            "logits": f"*{logits}",
            "logits_stride": "i64",
            "weights": f"*{weights}",
            "ids": "*i64",
            "num_experts": "i32",
        },
        {
            "TOP_K": top_k,
            "K_POW2": max(2, triton.next_power_of_2(top_k)),
            "EXPERTS": block,
            "RENORMALIZE": True,
        },
        target,
        num_warps=1 if block <= 256 else 4,
    )


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"sm{t.arch}")
@pytest.mark.parametrize("experts, pairs, rows", [(128, 2048, 32), (128, 8, 16), (8, 4096, 64)])
def test_moe_align_one_program_kernel_compiles(target, experts, pairs, rows):
    """The schedule in one program (``_triton_moe.ONE_PROGRAM_PAIRS``): a 256-token and a 1-token
    decode step of Qwen3-30B-A3B, and Mixtral's 8 experts at the most pairs it takes, as ``align``
    launches it."""
    import triton

    from minisgl_core.layers._triton_moe import align_one_program_kernel

    signature = {"ids": "*i64", "counts": "*i32", "starts": "*i32", "sorted_pairs": "*i64", "block_expert": "*i64",
                 "pairs": "i32", "slots": "i32", "num_experts": "i32", "blocks": "i32"}  # fmt: skip
    constants = {"ROWS": rows, "EXPERTS": max(16, triton.next_power_of_2(experts)),
                 "PAIRS": max(16, triton.next_power_of_2(pairs)), "FILL": 1024, "BLOCKS": 32}  # fmt: skip
    compiles(align_one_program_kernel, signature, constants, target, num_warps=4)
