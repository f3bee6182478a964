"""The mixture-of-experts block (``minisgl_core.layers.moe``): the grouped GEMMs' schedule on the
device, the Triton experts against the loop over experts (on the CPU under Triton's interpreter,
in a child process; bf16 and CUDA graphs on a GPU), and the block under tensor parallelism. The
model around it is checked against transformers in ``plugins/models/qwen3-moe``."""

from __future__ import annotations

import contextlib
import sys

import pytest
import torch
import torch.nn.functional as F

from minisgl_core.layers.moe import align_blocks, block_rows, experts_reference, route


@contextlib.contextmanager
def fast_path_off(name: str):
    """Fast path ``name`` off inside the block, as ``--disable-fast-path name`` turns it off: this
    process configured with its current switches but that one (a test child is not configured
    otherwise: the environment's), then as before."""
    import dataclasses

    from minisgl_core import fast_paths

    before = fast_paths._configured
    fast_paths.configure(dataclasses.replace(fast_paths.current(), **{name: False}))
    try:
        yield
    finally:
        fast_paths._configured = before


def random_ids(
    tokens: int, top_k: int, experts: int, gen: torch.Generator, skew: bool = False
) -> torch.Tensor:
    """Distinct experts per token; ``skew``: most tokens pick from the first few experts."""
    scores = torch.rand(tokens, experts, generator=gen)
    if skew:
        scores[:, : max(top_k, 2)] += 1.0
    return scores.topk(top_k, dim=1).indices


#: (tokens, top_k, experts, block rows) of the schedule's checks
ALIGN_CASES = [(1, 1, 4, 16), (3, 2, 8, 16), (37, 8, 16, 16), (200, 4, 8, 64), (50, 3, 64, 32), (9, 2, 3, 64),
               (300, 8, 128, 32), (600, 2, 8, 128)]  # fmt: skip


@pytest.mark.parametrize("tokens, top_k, experts, block", ALIGN_CASES)
@pytest.mark.parametrize("skew", [False, True])
def test_align_blocks_covers_every_pair_once_with_its_expert(tokens, top_k, experts, block, skew):
    gen = torch.Generator().manual_seed(tokens * 31 + experts)
    ids = random_ids(tokens, top_k, experts, gen, skew)
    sorted_pairs, block_expert = align_blocks(ids, experts, block)
    check_alignment(ids, experts, block, sorted_pairs, block_expert)
    # torch's path sorts stably: each run holds its pairs in order
    flat = ids.reshape(-1)
    real = sorted_pairs[sorted_pairs < flat.numel()]
    assert torch.equal(real, torch.argsort(flat, stable=True))


def check_alignment(
    ids: torch.Tensor, experts: int, block: int, sorted_pairs: torch.Tensor, block_expert: torch.Tensor
) -> None:
    """The grouped GEMMs' schedule is right for ``ids``: every pair once, in a block of its
    expert's; padding the no-pair index; the runs' blocks first, then blocks of no expert."""
    ids, sorted_pairs, block_expert = ids.cpu(), sorted_pairs.cpu(), block_expert.cpu()
    pairs = ids.numel()
    assert sorted_pairs.numel() == block_expert.numel() * block
    blocks_needed = -(-(pairs + min(experts, pairs) * (block - 1)) // block)
    assert block_expert.numel() == blocks_needed, "the worst case's blocks, from the shape alone"
    real = sorted_pairs[sorted_pairs < pairs]
    assert sorted(real.tolist()) == list(range(pairs)), "every pair exactly once"
    assert set(sorted_pairs[sorted_pairs >= pairs].tolist()) <= {pairs}, "padding is the no-pair index"
    flat = ids.reshape(-1)
    for b, expert in enumerate(block_expert.tolist()):
        rows = sorted_pairs[b * block : (b + 1) * block]
        rows = rows[rows < pairs]
        if expert == experts:
            assert rows.numel() == 0, "a block past the last run holds no pair"
        else:
            assert rows.numel() > 0 and bool((flat[rows] == expert).all()), (b, expert)
    # each expert's run takes whole blocks, as few as hold its pairs, in the experts' order
    counts = torch.bincount(flat, minlength=experts)
    per_block = (counts + block - 1) // block
    assert torch.equal(torch.bincount(block_expert, minlength=experts + 1)[:experts], per_block)
    assert bool((block_expert[1:] >= block_expert[:-1]).all())


def test_interpreted_align_kernels_build_a_valid_schedule():
    """The Triton path's three kernels (atomic counts, the runs' starts, the scatter) under the
    interpreter, through align_blocks, on the same cases."""
    pytest.importorskip("triton")
    from minisgl_core.testing.triton_interpreter import run_under_interpreter

    out = run_under_interpreter(__file__, "align")
    assert out.count("ok") == 4 * len(ALIGN_CASES), out


def check_align_kernels() -> None:
    """Child under TRITON_INTERPRET=1 (and on the GPU): the kernels' schedule for every case, from
    the three kernels and from one program (``_triton_moe.ONE_PROGRAM_PAIRS``)."""
    from minisgl_core.layers import _triton_moe
    from minisgl_core.layers.moe import moe_enabled

    device = "cuda" if torch.cuda.is_available() else "cpu"
    default = _triton_moe.ONE_PROGRAM_PAIRS
    for one_program in (0, 4096):
        _triton_moe.ONE_PROGRAM_PAIRS = one_program
        try:
            for tokens, top_k, experts, block in ALIGN_CASES:
                for skew in (False, True):
                    gen = torch.Generator().manual_seed(tokens * 31 + experts)
                    ids = random_ids(tokens, top_k, experts, gen, skew).to(device)
                    assert moe_enabled(ids)
                    sorted_pairs, block_expert = align_blocks(ids, experts, block)
                    check_alignment(ids, experts, block, sorted_pairs, block_expert)
                    print("ok", tokens, top_k, experts, block, skew, one_program)
        finally:
            _triton_moe.ONE_PROGRAM_PAIRS = default


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_align_kernels_on_the_gpu():
    from minisgl_core.layers import _triton_moe

    check_align_kernels()
    # a decode step's size at Qwen3-30B-A3B's shape, captured and replayed on new routing, by the
    # three kernels and by one program
    gen = torch.Generator(device="cuda").manual_seed(5)
    default = _triton_moe.ONE_PROGRAM_PAIRS
    for one_program in (0, 4096):
        _triton_moe.ONE_PROGRAM_PAIRS = one_program
        try:
            ids = torch.rand(256, 128, generator=gen, device="cuda").topk(8, dim=1).indices
            static = ids.clone()
            align_blocks(static, 128, 32)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                sorted_pairs, block_expert = align_blocks(static, 128, 32)
            ids2 = torch.rand(256, 128, generator=gen, device="cuda").topk(8, dim=1).indices
            static.copy_(ids2)
            graph.replay()
            check_alignment(ids2, 128, 32, sorted_pairs, block_expert)
        finally:
            _triton_moe.ONE_PROGRAM_PAIRS = default


def test_block_rows_grow_with_the_pairs_an_expert_gets():
    assert block_rows(8, 128) == 16 and block_rows(1024, 128) == 16  # decode steps of 1 and 128 tokens
    assert block_rows(2048, 128) == 32 and block_rows(16384, 128) == 64  # 256 tokens; a 2,048-token prefill
    assert block_rows(65536, 128) == 128  # an 8,192-token prefill step


def test_route_matches_transformers_router():
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    gen = torch.Generator().manual_seed(0)
    for renormalize in (False, True):
        config = Qwen3MoeConfig(
            hidden_size=32, num_experts=8, num_experts_per_tok=3, norm_topk_prob=renormalize
        )
        router = Qwen3MoeTopKRouter(config)
        with torch.no_grad():
            router.weight.copy_(torch.randn(8, 32, generator=gen))
        x = torch.randn(5, 32, generator=gen)
        _, want_weights, want_ids = router(x)
        weights, ids = route(F.linear(x, router.weight), 3, renormalize)
        assert torch.equal(ids, want_ids)
        torch.testing.assert_close(weights, want_weights)


#: (tokens, experts, top_k, renormalize, float32 weights, logits dtype) of the router kernel's checks
ROUTE_CASES = [(1, 8, 2, False, True, torch.float32), (7, 128, 8, True, False, torch.bfloat16),
               (300, 128, 8, True, False, torch.bfloat16), (33, 60, 6, True, False, torch.float16),
               (5, 3, 3, False, False, torch.float32), (64, 8, 1, True, True, torch.bfloat16)]  # fmt: skip


def check_route_kernel(device: str = "cpu") -> None:
    """Child under TRITON_INTERPRET=1 (and on the GPU): ``_triton_moe.route`` against ``route`` on
    every case. Logits rounded to 16 bits tie now and then, and which of two equal experts torch's
    top-k takes is not specified: the kernel must choose experts with the same probabilities, in
    the same order, distinct, with the same weights; where no two logits of a row are equal, the
    same ids."""
    from minisgl_core.layers import _triton_moe

    gen = torch.Generator().manual_seed(11)
    for tokens, experts, top_k, renormalize, f32, dtype in ROUTE_CASES:
        logits = (torch.randn(tokens, experts, generator=gen) * 3).to(dtype).to(device)
        want_w, want_ids = route(logits, top_k, renormalize, f32)
        got_w, got_ids = _triton_moe.route(logits, top_k, renormalize, f32)
        assert got_w.dtype == want_w.dtype and got_ids.dtype == torch.int64
        torch.testing.assert_close(
            got_w, want_w, atol=1e-6, rtol=2e-6 if got_w.dtype == torch.float32 else 1e-2
        )
        probs = torch.softmax(logits.float(), dim=-1)
        torch.testing.assert_close(probs.gather(1, got_ids), probs.gather(1, want_ids), atol=0, rtol=0)
        assert all(len(set(r)) == top_k for r in got_ids.tolist())
        no_ties = torch.tensor([len(set(r)) == experts for r in logits.float().tolist()], device=device)
        assert torch.equal(got_ids[no_ties], want_ids[no_ties])
        print("ok", tokens, experts, top_k, int(no_ties.sum()))
    # a strided view of the logits (a column slice) and no tokens at all
    wide = torch.randn(9, 20, generator=gen).to(device)
    torch.testing.assert_close(_triton_moe.route(wide[:, :16], 4, True), route(wide[:, :16], 4, True))
    empty_w, empty_ids = _triton_moe.route(wide[:0, :16], 4, True)
    assert empty_w.shape == (0, 4) and empty_ids.shape == (0, 4)
    print("ok strided, empty")
    # a block's forward with the kernel as its router (fast path moe_route) against the torch router
    from minisgl_core.api.parallel import ParallelContext
    from minisgl_core.layers.moe import SparseMoE

    block = SparseMoE(48, 24, 6, 2, renormalize=True, parallel=ParallelContext(), dtype=torch.float32,
                      device=device)  # fmt: skip
    for param in block.parameters():
        param.data.copy_(torch.randn(param.shape, generator=gen).to(device) * 0.2)
    x = torch.randn(13, 48, generator=gen).to(device)
    with fast_path_off("moe_route"):
        want = block(x)
    got = block(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    print("ok block")


def test_interpreted_route_kernel_matches_route():
    pytest.importorskip("triton")
    from minisgl_core.testing.triton_interpreter import run_under_interpreter

    out = run_under_interpreter(__file__, "route")
    assert out.count("ok") == len(ROUTE_CASES) + 2, out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_route_kernel_on_the_gpu():
    check_route_kernel("cuda")


def check_sum_in_norm(device: str = "cpu") -> None:
    """Child under TRITON_INTERPRET=1: with fast path ``moe_sum_in_norm`` a block's ``reduce=False`` output
    is its tokens' expert rows (``SplitKPartials`` over ``[tokens, top_k, hidden]``), whose total
    is the summed block's output and which ``RMSNorm`` adds with the residual in one kernel,
    bitwise what summing first and then the add + norm give (float16 under the interpreter, whose
    bfloat16 is unreliable; bfloat16 on the GPU). With the switch off, a plain tensor."""
    from minisgl_core.api.parallel import ParallelContext
    from minisgl_core.layers import triton_ops
    from minisgl_core.layers.moe import SparseMoE
    from minisgl_core.layers.norm import RMSNorm

    gen = torch.Generator().manual_seed(12)
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    for tokens, experts, top_k in ((1, 4, 2), (9, 8, 3), (37, 16, 8)):
        block = SparseMoE(64, 24, experts, top_k, renormalize=True, parallel=ParallelContext(),
                          dtype=dtype, device=device)  # fmt: skip
        for param in block.parameters():
            param.data.copy_(torch.randn(param.shape, generator=gen).to(device) * 0.2)
        norm = RMSNorm(64, 1e-6, dtype=dtype, device=device)
        norm.weight.data.copy_(torch.rand(64, generator=gen).to(device) + 0.5)
        x = torch.randn(tokens, 64, generator=gen).to(device, dtype)
        residual = torch.randn(tokens, 64, generator=gen).to(device, dtype)
        with fast_path_off("moe_sum_in_norm"):
            summed = block(x, reduce=False)
        rows = block(x, reduce=False)
        whole = block(x)  # reduce=True: summed whatever the switch
        assert isinstance(summed, torch.Tensor) and isinstance(whole, torch.Tensor)
        assert isinstance(rows, triton_ops.SplitKPartials) and rows.parts.shape == (top_k, tokens, 64)
        tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
        torch.testing.assert_close(rows.total(), summed, atol=tol, rtol=tol)
        normed, total = norm(rows, residual)
        want_normed, want_total = norm(rows.total(), residual)
        assert torch.equal(total, want_total) and torch.equal(normed, want_normed)
        print("ok", tokens, experts, top_k)


def test_interpreted_sum_in_norm_matches_the_summed_block():
    pytest.importorskip("triton")
    from minisgl_core.testing.triton_interpreter import run_under_interpreter

    out = run_under_interpreter(__file__, "sum_in_norm")
    assert out.count("ok") == 3, out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_sum_in_norm_on_the_gpu():
    check_sum_in_norm("cuda")


def test_reference_matches_a_dense_sum_over_experts():
    """The loop's sum equals computing every expert for every token and weighting by the router."""
    gen = torch.Generator().manual_seed(1)
    tokens, hidden, inter, experts, top_k = 7, 24, 10, 5, 2
    x = torch.randn(tokens, hidden, generator=gen, dtype=torch.float64)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen, dtype=torch.float64)
    w2 = torch.randn(experts, hidden, inter, generator=gen, dtype=torch.float64)
    weights, ids = route(torch.randn(tokens, experts, generator=gen, dtype=torch.float64), top_k, True)
    out = experts_reference(x, w13, w2, weights, ids)
    dense = torch.zeros_like(x)
    for t in range(tokens):
        for j in range(top_k):
            e = int(ids[t, j])
            g, u = (w13[e] @ x[t]).chunk(2)
            dense[t] += weights[t, j] * (w2[e] @ (F.silu(g) * u))
    torch.testing.assert_close(out, dense)


#: the dtypes experts may be quantized to (minisgl_core.layers.moe.QUANTIZED_EXPERT_DTYPES)
QUANTIZED = [torch.int8, torch.float8_e4m3fn]


def quantize_experts_rows(w: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, float32 scales ``[experts, rows]``) of ``w`` ``[experts, rows, cols]``: each row's
    largest magnitude maps to the dtype's largest value (what the int8 and fp8 methods do)."""
    top = 127.0 if dtype == torch.int8 else torch.finfo(dtype).max
    scale = (w.float().abs().amax(dim=-1) / top).clamp(min=1e-12)
    v = w.float() / scale[..., None]
    return (v.round() if dtype == torch.int8 else v).clamp(-top, top).to(dtype), scale


def random_experts(seed: int, *, tokens: int, hidden: int, inter: int, experts: int, top_k: int):
    """(x, w13, w2, weights, ids): float32 inputs, experts of unit-scale outputs, random routing."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) * hidden**-0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) * inter**-0.5
    weights, ids = route(torch.randn(tokens, experts, generator=gen), top_k, True)
    return x, w13, w2, weights, ids


def w8a8_by_token(x, q13, s13, q2, s2, weights, ids) -> torch.Tensor:
    """e4m3 experts as W8A8, token by token, choice by choice: each GEMM's input row rounded to
    e4m3 with its own scale and dequantized, times the dequantized weights (float32)."""
    from minisgl_core.layers.e4m3 import quantize_rows

    def rounded(row):
        q, scale = quantize_rows(row[None])
        return q.float()[0] * scale[0]

    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t].tolist()):
            gate, up = ((q13[e].float() * s13[e][:, None]) @ rounded(x[t])).chunk(2)
            y = (q2[e].float() * s2[e][:, None]) @ rounded(F.silu(gate) * up)
            out[t] += weights[t, j] * y
    return out


@pytest.mark.parametrize("dtype", QUANTIZED, ids=["int8", "fp8"])
def test_quantized_experts_compute_with_the_values_they_stand_for(dtype):
    """The loop over quantized experts equals the loop over their dequantized weights (int8:
    weight-only; e4m3: W8A8, every GEMM's input rows rounded to e4m3 too, checked token by token),
    and stays near the unquantized one (int8 within 2%, e4m3 within 10% of the output's scale)."""
    x, w13, w2, weights, ids = random_experts(5, tokens=13, hidden=32, inter=24, experts=6, top_k=2)
    (q13, s13), (q2, s2) = quantize_experts_rows(w13, dtype), quantize_experts_rows(w2, dtype)
    got = experts_reference(x, q13, q2, weights, ids, (s13, s2))
    if dtype == torch.int8:
        want = experts_reference(x, q13.float() * s13[..., None], q2.float() * s2[..., None], weights, ids)
    else:
        want = w8a8_by_token(x, q13, s13, q2, s2, weights, ids)
        weight_only = experts_reference(
            x, q13.float() * s13[..., None], q2.float() * s2[..., None], weights, ids
        )
        assert (got - weight_only).abs().max() > 1e-3  # the activations' rounding is there
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    exact = experts_reference(x, w13, w2, weights, ids)
    error = (got - exact).abs().max() / exact.abs().max()
    assert 0 < error < (0.02 if dtype == torch.int8 else 0.1), error


def test_experts_take_quantized_weights_and_refuse_what_does_not_fit():
    from minisgl_core.api.parallel import ParallelContext
    from minisgl_core.layers.moe import SparseMoE

    gen = torch.Generator().manual_seed(6)
    block = SparseMoE(
        32, 16, 4, 2, renormalize=True, parallel=ParallelContext(), dtype=torch.float32, device="cpu"
    )
    for param in block.parameters():
        param.data.copy_(torch.randn(param.shape, generator=gen) * 0.2)
    experts = block.experts
    w13, w2 = experts.w13.data.clone(), experts.w2.data.clone()
    q13, q2 = quantize_experts_rows(w13, torch.int8), quantize_experts_rows(w2, torch.int8)
    with pytest.raises(ValueError, match=r"my-method quantized the experts' w13 \(4, 32, 32\) into bfloat16"):
        experts.quantize([(w13.bfloat16(), q13[1]), q2], "my-method")
    with pytest.raises(ValueError, match=r"float32 scales \(4, 32\)"):
        experts.quantize([(q13[0], q13[1][:, :5]), q2], "my-method")
    with pytest.raises(ValueError, match=r"w2 \(4, 32, 16\)"):
        experts.quantize([q13, (q2[0].transpose(1, 2), q2[1])], "my-method")
    with pytest.raises(ValueError, match=r"into int8 \(4, 32, 32\) on cpu with scales NoneType"):
        experts.quantize([q13[0], q2], "my-method")  # values alone, no scales
    assert experts.scales is None and experts.w13.dtype == torch.float32  # nothing replaced
    experts.quantize([q13, q2], "my-method")
    assert experts.w13.dtype == experts.w2.dtype == torch.int8 and experts.scales is not None
    x = torch.randn(5, 32, generator=gen)
    weights, ids = route(block.gate(x), 2, True)
    want = experts_reference(
        x, q13[0].float() * q13[1][..., None], q2[0].float() * q2[1][..., None], weights, ids
    )
    torch.testing.assert_close(block(x), want, atol=1e-5, rtol=1e-4)


def test_interpreted_quantized_grouped_experts_match_the_loop():
    pytest.importorskip("triton")
    from minisgl_core.testing.triton_interpreter import run_under_interpreter

    out = run_under_interpreter(__file__, "quantized")
    assert out.count("ok") == 8, out


def check_quantized() -> None:
    """Child under TRITON_INTERPRET=1: int8 and e4m3 experts through the grouped GEMMs (SiLU·mul
    fused or not; e4m3 as W8A8, its products taken transposed and not, and weight-only) against the
    loop over the same values, in float32 and float16."""
    from minisgl_core.layers import _triton_moe, moe
    from minisgl_core.layers.moe import experts_grouped

    x, w13, w2, weights, ids = random_experts(7, tokens=37, hidden=48, inter=40, experts=8, top_k=2)
    default = moe.FUSED_GATE_UP
    for dtype in QUANTIZED:
        (q13, s13), (q2, s2) = quantize_experts_rows(w13, dtype), quantize_experts_rows(w2, dtype)
        want = experts_reference(x, q13, q2, weights, ids, (s13, s2))
        want_half = experts_reference(x.half(), q13, q2, weights.half(), ids, (s13, s2))
        for fused in (True, False):
            moe.FUSED_GATE_UP = fused
            got = experts_grouped(x, q13, q2, weights, ids, (s13, s2))
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
            half = experts_grouped(x.half(), q13, q2, weights.half(), ids, (s13, s2))
            assert half.dtype == torch.float16
            torch.testing.assert_close(half, want_half, atol=2e-2, rtol=2e-2)
            print("ok", dtype, fused)
        moe.FUSED_GATE_UP = default
        if dtype == torch.float8_e4m3fn:  # the other SWAP_AB than the default's, fused or not
            below = _triton_moe.SWAP_AB_BELOW
            _triton_moe.SWAP_AB_BELOW = 0 if below else 1 << 30
            try:
                for fused in (True, False):
                    moe.FUSED_GATE_UP = fused
                    got = experts_grouped(x, q13, q2, weights, ids, (s13, s2))
                    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
            finally:
                _triton_moe.SWAP_AB_BELOW, moe.FUSED_GATE_UP = below, default
            print("ok transposed or not")
        if dtype == torch.float8_e4m3fn:  # weight-only: run-dtype rows, the weights converted
            moe.W8A8_EXPERTS = False
            try:
                want = experts_reference(x, q13, q2, weights, ids, (s13, s2))
                got = experts_grouped(x, q13, q2, weights, ids, (s13, s2))
            finally:
                moe.W8A8_EXPERTS = True
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
            print("ok weight-only")
        # values without their scales (or scales for run-dtype weights) are refused
        for args in ((q13, q2, None), (w13, w2, (s13, s2))):
            with contextlib.suppress(ValueError):
                experts_grouped(x, args[0], args[1], weights, ids, args[2])
                raise AssertionError("accepted")
        print("ok refused", dtype)


def test_interpreted_grouped_experts_match_the_loop():
    pytest.importorskip("triton")
    from minisgl_core.testing.triton_interpreter import run_under_interpreter

    out = run_under_interpreter(__file__, "grouped")
    assert out.count("ok") == 9, out


def check_grouped() -> None:
    """Child under TRITON_INTERPRET=1: float32 (the interpreter's bf16 is unreliable) for every
    block size, uneven pairs, experts with no token, widths not a multiple of the tiles, SiLU·mul
    fused into the gate/up GEMM and after it; then the SparseMoE block routing through it
    (moe_enabled) against the loop."""
    from minisgl_core.api.parallel import ParallelContext
    from minisgl_core.layers import moe
    from minisgl_core.layers.moe import SparseMoE, experts_grouped, moe_enabled

    default = moe.FUSED_GATE_UP

    gen = torch.Generator().manual_seed(2)
    cases = [(1, 1, 4, 48, 40), (3, 2, 8, 64, 32), (40, 8, 16, 96, 24), (300, 4, 8, 80, 72), (700, 2, 4, 32, 16),
             (33, 3, 64, 40, 20)]  # fmt: skip
    for tokens, top_k, experts, hidden, inter in cases:
        x = torch.randn(tokens, hidden, generator=gen)
        w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) * hidden**-0.5
        w2 = torch.randn(experts, hidden, inter, generator=gen) * inter**-0.5
        weights, ids = route(torch.randn(tokens, experts, generator=gen), top_k, True)
        want = experts_reference(x, w13, w2, weights, ids)
        for fused in (True, False):
            moe.FUSED_GATE_UP = fused
            got = experts_grouped(x, w13, w2, weights, ids)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        moe.FUSED_GATE_UP = default
        print("ok", tokens, top_k, experts, block_rows(tokens * top_k, experts))
    block = SparseMoE(
        48, 24, 6, 2, renormalize=False, parallel=ParallelContext(), dtype=torch.float32, device="cpu"
    )
    for param in block.parameters():
        param.data.copy_(torch.randn(param.shape, generator=gen) * 0.2)
    x = torch.randn(11, 48, generator=gen)
    assert moe_enabled(x)
    weights, ids = route(block.gate(x), 2, False)
    torch.testing.assert_close(
        block(x), experts_reference(x, block.experts.w13, block.experts.w2, weights, ids)
    )
    print("ok block")
    empty = torch.zeros(0, 48)
    assert block(empty).shape == (0, 48)  # a forward of no tokens launches nothing
    # float16 weights and activations (the interpreter's bfloat16 is unreliable) with the router's
    # weights in float32 (Mixtral's router) or float16 (Qwen3-MoE's), against the float32 loop
    x = torch.randn(21, 64, generator=gen)
    w13 = torch.randn(6, 48, 64, generator=gen) * 0.125
    w2 = torch.randn(6, 64, 24, generator=gen) * 0.2
    for float32_weights in (True, False):
        weights, ids = route(torch.randn(21, 6, generator=gen).half(), 2, True, float32_weights)
        want = experts_reference(x, w13.half().float(), w2.half().float(), weights.float(), ids)
        got = {}
        for fused in (True, False):
            moe.FUSED_GATE_UP = fused
            got[fused] = experts_grouped(x.half(), w13.half(), w2.half(), weights, ids)
            assert got[fused].dtype == torch.float16
            torch.testing.assert_close(got[fused].float(), want, atol=2e-2, rtol=2e-2)
        moe.FUSED_GATE_UP = default
        # the fused gate/up rounds each half to float16 before SiLU·mul, as the kernel after the
        # unfused GEMM reads them: the same bits (the interpreter sums both GEMMs' tiles alike)
        assert torch.equal(got[True], got[False])
        print("ok half", float32_weights)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_grouped_experts_on_the_gpu_in_bf16_and_inside_a_cuda_graph():
    from minisgl_core.layers import moe
    from minisgl_core.layers.moe import experts_grouped

    gen = torch.Generator(device="cuda").manual_seed(3)
    hidden, inter, experts = 2048, 768, 128  # Qwen3-30B-A3B's expert shape
    w13 = (
        torch.randn(experts, 2 * inter, hidden, generator=gen, device="cuda", dtype=torch.bfloat16)
        * hidden**-0.5
    )
    w2 = torch.randn(experts, hidden, inter, generator=gen, device="cuda", dtype=torch.bfloat16) * inter**-0.5
    for tokens in (1, 7, 64, 256, 2048):
        x = torch.randn(tokens, hidden, generator=gen, device="cuda", dtype=torch.bfloat16)
        logits = torch.randn(tokens, experts, generator=gen, device="cuda", dtype=torch.bfloat16)
        weights, ids = route(logits, 8, True)
        want = experts_reference(x.float(), w13.float(), w2.float(), weights.float(), ids)
        got = experts_grouped(x, w13, w2, weights, ids)
        torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
        # SiLU·mul fused into the gate/up GEMM or after it (the default): a bf16 ulp apart at
        # most where the two launches' float32 sums differ in order
        default, moe.FUSED_GATE_UP = moe.FUSED_GATE_UP, True
        try:
            fused = experts_grouped(x, w13, w2, weights, ids)
            moe.FUSED_GATE_UP = False
            got = experts_grouped(x, w13, w2, weights, ids)
        finally:
            moe.FUSED_GATE_UP = default
        torch.testing.assert_close(fused, got, atol=1e-2, rtol=1e-2)
        # captured: the same numbers from a replay on new inputs
        graph = torch.cuda.CUDAGraph()
        static_x, static_w, static_ids = x.clone(), weights.clone(), ids.clone()
        experts_grouped(static_x, w13, w2, static_w, static_ids)  # warm
        with torch.cuda.graph(graph):
            static_out = experts_grouped(static_x, w13, w2, static_w, static_ids)
        x2 = torch.randn(tokens, hidden, generator=gen, device="cuda", dtype=torch.bfloat16)
        w_2, ids2 = route(
            torch.randn(tokens, experts, generator=gen, device="cuda", dtype=torch.bfloat16), 8, True
        )
        static_x.copy_(x2), static_w.copy_(w_2), static_ids.copy_(ids2)
        graph.replay()
        torch.testing.assert_close(static_out, experts_grouped(x2, w13, w2, w_2, ids2), atol=0, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", QUANTIZED, ids=["int8", "fp8"])
def test_quantized_grouped_experts_on_the_gpu(dtype):
    """bf16 activations by int8 / e4m3 experts of Qwen3-30B-A3B's shape against the loop over the
    same values, SiLU·mul fused and not (e4m3: W8A8, its small blocks' products also taken
    transposed, and weight-only unfused), at a decode step's and a prefill step's tokens (64-row
    blocks and up: the e4m3 wgmma)."""
    from minisgl_core.layers import _triton_moe, moe
    from minisgl_core.layers.moe import experts_grouped

    gen = torch.Generator(device="cuda").manual_seed(8)
    hidden, inter, experts = 2048, 768, 128
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen, device="cuda") * hidden**-0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen, device="cuda") * inter**-0.5
    (q13, s13), (q2, s2) = quantize_experts_rows(w13, dtype), quantize_experts_rows(w2, dtype)
    del w13, w2
    for tokens in (1, 64, 2048):
        x = torch.randn(tokens, hidden, generator=gen, device="cuda", dtype=torch.bfloat16)
        weights, ids = route(torch.randn(tokens, experts, generator=gen, device="cuda"), 8, True)
        weights = weights.bfloat16()
        for w8a8, fused, below in ((True, False, 0), (True, True, 0), (True, False, 64), (True, True, 64),
                                   (False, False, 0)):  # fmt: skip
            if dtype == torch.int8 and (not w8a8 or below):
                continue
            defaults = moe.FUSED_GATE_UP, moe.W8A8_EXPERTS, _triton_moe.SWAP_AB_BELOW
            moe.FUSED_GATE_UP, moe.W8A8_EXPERTS, _triton_moe.SWAP_AB_BELOW = fused, w8a8, below
            try:
                want = experts_reference(x, q13, q2, weights, ids, (s13, s2)).float()
                got = experts_grouped(x, q13, q2, weights, ids, (s13, s2)).float()
            finally:
                moe.FUSED_GATE_UP, moe.W8A8_EXPERTS, _triton_moe.SWAP_AB_BELOW = defaults
            if dtype == torch.float8_e4m3fn and w8a8:
                # an activation the two sides sum in another order can round to the next e4m3 value
                # (one in 131,072 outputs moved by 0.021 at 2,048 tokens): bounded, and rare. The
                # loop adds a token's 8 expert rows into bf16 one by one (8 roundings): 1.1% apart
                # in norm at 1 token on an H200 (54b2990), against 0.5% asked there before
                off = ((got - want).abs() > 2e-2 + 2e-2 * want.abs()).float().mean().item()
                assert off < 1e-3 and (got - want).abs().max() < 0.1, (tokens, fused, off)
                assert (got - want).norm() / want.norm() < 2e-2
            else:
                torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


class _Launcher:
    """A stand-in for a Triton kernel: ``kernel[grid](...)`` records the kernel's name."""

    def __init__(self, name: str, launched: list[str]) -> None:
        self.name, self.launched = name, launched

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launched.append(self.name)


def test_moe_fast_paths_choose_the_kernels(monkeypatch):
    """``--disable-fast-path moe_route / moe_one_program / moe_sum_in_norm`` (their environment
    variables here) each put back the path its kernel replaced: the torch router, the schedule's
    three kernels, the block's own sum of each token's rows."""
    from minisgl_core import fast_paths
    from minisgl_core.api.parallel import ParallelContext
    from minisgl_core.layers import _triton_moe, moe, triton_ops
    from minisgl_core.layers.moe import SparseMoE

    monkeypatch.setattr(fast_paths, "_configured", None)
    for var in ("MINISGL_MOE_ROUTE", "MINISGL_MOE_ONE_PROGRAM", "MINISGL_MOE_SUM_IN_NORM", "MINISGL_COMPILE"):
        monkeypatch.delenv(var, raising=False)
    # the schedule: one program for a decode step's pairs, or three kernels
    launched: list[str] = []
    for name in (
        "align_one_program_kernel",
        "count_pairs_kernel",
        "run_starts_kernel",
        "scatter_pairs_kernel",
    ):
        monkeypatch.setattr(_triton_moe, name, _Launcher(name, launched))
    ids = torch.zeros(4, 2, dtype=torch.int64)
    _triton_moe.align(ids, 8, 16, 9)
    assert launched == ["align_one_program_kernel"]
    launched.clear()
    monkeypatch.setenv("MINISGL_MOE_ONE_PROGRAM", "0")
    _triton_moe.align(ids, 8, 16, 9)
    assert launched == ["count_pairs_kernel", "run_starts_kernel", "scatter_pairs_kernel"]
    # the router and the sum, in a block whose experts "run in Triton" (stand-ins for the kernels)
    calls: list[str] = []
    monkeypatch.setattr(moe, "moe_enabled", lambda x: True)
    monkeypatch.setattr(triton_ops, "split_k_norm_enabled", lambda device: True)
    monkeypatch.setattr(_triton_moe, "route", lambda *a: (calls.append("kernel"), route(*a))[1])
    monkeypatch.setattr(moe, "route", lambda *a: (calls.append("torch"), route(*a))[1])

    def experts(x, w13, w2, weights, ids, scales=None, *, sum_rows=True):
        calls.append("summed" if sum_rows else "rows")
        return (
            torch.zeros(x.shape[0], w2.shape[1])
            if sum_rows
            else torch.zeros(x.shape[0], ids.shape[1], w2.shape[1])
        )

    monkeypatch.setattr(moe, "experts_grouped", experts)
    block = SparseMoE(
        16, 8, 4, 2, renormalize=True, parallel=ParallelContext(), dtype=torch.float32, device="cpu"
    )
    x = torch.randn(3, 16)
    assert isinstance(block(x, reduce=False), triton_ops.SplitKPartials)
    assert calls == ["kernel", "rows"]
    calls.clear()
    monkeypatch.setenv("MINISGL_MOE_ROUTE", "0")
    monkeypatch.setenv("MINISGL_MOE_SUM_IN_NORM", "0")
    assert isinstance(block(x, reduce=False), torch.Tensor)
    assert calls == ["torch", "summed"]


def test_tensor_parallel_block_sums_to_the_whole():
    """Two gloo ranks, each holding half of every expert's intermediate size: their all-reduced
    outputs equal one rank's whole block. (The rendezvous store lives in this process, as in the
    engine's TP launch: a file store torn down by the rank that left first aborted its peer now
    and then.)"""
    import torch.multiprocessing as mp

    from minisgl_core.distributed import parent_store

    store = parent_store(2)  # kept until both ranks are done
    mp.spawn(_tp_worker, args=(2, store.port), nprocs=2, join=True)


def _tp_worker(rank: int, world: int, port: int) -> None:
    from minisgl_core.distributed import join_parent_store, leave_parent_store_group

    join_parent_store("gloo", rank, world, port)
    try:
        _tp_check(rank, world)
    finally:
        # the blocks holding the group went with _tp_check's frame; collected before the group is
        # destroyed, no gloo thread outlives it into the interpreter's teardown (CI's run at
        # 86267af aborted a rank there once: "terminate called without an active exception")
        leave_parent_store_group()


def _tp_check(rank: int, world: int) -> None:
    import torch.distributed as dist

    from minisgl_core.api.parallel import ParallelContext
    from minisgl_core.layers.moe import SparseMoE

    gen = torch.Generator().manual_seed(4)
    hidden, inter, experts = 32, 20, 6
    router = torch.randn(experts, hidden, generator=gen)
    gate = [torch.randn(inter, hidden, generator=gen) for _ in range(experts)]
    up = [torch.randn(inter, hidden, generator=gen) for _ in range(experts)]
    down = [torch.randn(hidden, inter, generator=gen) for _ in range(experts)]
    x = torch.randn(9, hidden, generator=gen)

    def build(parallel: ParallelContext) -> SparseMoE:
        block = SparseMoE(hidden, inter, experts, 3, renormalize=True, parallel=parallel, dtype=torch.float32,
                          device="cpu")  # fmt: skip
        block.gate.weight.weight_loader(block.gate.weight, router, None)
        w13, w2 = block.experts.w13, block.experts.w2
        for e in range(experts):
            w13.weight_loader(w13, gate[e], (e, 0))
            w13.weight_loader(w13, up[e], (e, 1))
            w2.weight_loader(w2, down[e], e)
        return block

    whole = build(ParallelContext())(x)
    sharded = build(ParallelContext(tp_rank=rank, tp_size=world, group=dist.group.WORLD))
    assert sharded.experts.w13.shape == (experts, inter, hidden)  # half of 2 * inter
    torch.testing.assert_close(sharded(x), whole, atol=1e-4, rtol=1e-4)
    partial = sharded(x, reduce=False)
    dist.all_reduce(partial)
    torch.testing.assert_close(partial, whole, atol=1e-4, rtol=1e-4)
    # both ranks past their last collective before either tears gloo down: without it one
    # rank aborted at exit now and then ("terminate called without an active exception",
    # 2-3 runs in 30-40 here and once on the GPU machine; 0 in 40 with the barrier)
    dist.barrier()


if __name__ == "__main__":
    if sys.argv[1] == "grouped":
        check_grouped()
    elif sys.argv[1] == "quantized":
        check_quantized()
    elif sys.argv[1] == "align":
        check_align_kernels()
    elif sys.argv[1] == "route":
        check_route_kernel()
    elif sys.argv[1] == "sum_in_norm":
        check_sum_in_norm()
