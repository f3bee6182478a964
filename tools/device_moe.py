"""The mixture-of-experts grouped GEMMs timed on the GPU over launch choices (block rows, tile
width and depth, warps, stages), at Qwen3-30B-A3B's expert shape, for the token counts of decode
steps and a prefill step; routing uniform at random, as random weights route.

    python3 tools/device_moe.py [--tokens 1,8,64,256,8192] [--out moe.jsonl]
                                [--profile | --gemms | --small-kernels]
                                [--experts bf16|int8|fp8] [--blocks 16,32,64,128] [--swap-below 64]
                                [--widths 64,128] [--depths 64,128] [--warps 4,8] [--stages 3,4]
                                [--default-only] [--rounding-apart]

Each row: tokens, the launch, microseconds a layer's experts take (median of CUDA-graph replays),
and the bytes of the experts the step's tokens chose over that time (TB/s). ``--gemms``: each
grouped GEMM alone over its own launches (gate/up with SiLU·mul after it or fused into it, down),
at the block size the engine picks. ``--small-kernels``: the router and the schedule, each both
ways (fast path ``moe_route``, ``_triton_moe.ONE_PROGRAM_PAIRS``). ``--experts int8|fp8``: the experts quantized as
``--quantization int8`` / ``fp8`` quantizes them (a scale a row; int8 weight-only, e4m3 W8A8: each
GEMM's input rows rounded to e4m3 first, that kernel timed with its GEMM unless ``--rounding-apart``
(``--gemms``: timed as rows of its own); ``--weight-only``: e4m3
converted in the kernel instead, ``moe.W8A8_EXPERTS = False``; ``--swap-below``: W8A8 blocks of
fewer rows multiplied transposed, ``_triton_moe.SWAP_AB_BELOW``). ``--default-only``: the
engine's launch alone."""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import statistics

import torch

from minisgl_core.layers import _triton_moe, moe
from minisgl_core.layers.fused import silu_and_mul
from minisgl_core.layers.moe import align_blocks, block_rows, experts_grouped, route

HIDDEN, INTER, EXPERTS, TOP_K = 2048, 768, 128, 8


def time_graph(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(5):
            fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / 5)
    return statistics.median(times)


def quantized(w: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``w`` as the ``kind`` method's quantize_experts keeps it: (values, scales), or (w, None)."""
    if kind == "bf16":
        return w, None
    if kind == "fp8":
        from minisgl_plugin_fp8.method import Fp8Method as Method
    else:
        from minisgl_plugin_int8.method import Int8Method as Method
    return Method(device=w.device, dtype=torch.bfloat16).quantize_experts(w)


def sweep_gemms(
    tokens, x, w13, w2, weights, ids, touched, s13=None, s2=None, rounding_apart=False
) -> list[dict]:
    """Each GEMM of a layer's experts timed alone over a grid of launches (see the module).
    ``rounding_apart`` (W8A8): each GEMM's input rows rounded to e4m3 once, before the timing, and
    that rounding timed as rows of its own (``round x``, ``round act``)."""
    pairs = ids.numel()
    block = block_rows(pairs, EXPERTS)
    sorted_pairs, block_expert = align_blocks(ids, EXPERTS, block)
    w8a8 = w13.dtype == torch.float8_e4m3fn and moe.W8A8_EXPERTS
    launch = functools.partial(_triton_moe.grouped_gemm, sorted_pairs=sorted_pairs, block_expert=block_expert,
                               pairs=pairs, block=block, out_dtype=x.dtype)  # fmt: skip

    rounded: dict[int, tuple] = {}  # id of an input -> its e4m3 rows and scales (rounding_apart)

    def gemm(a, w, **kw):  # W8A8: the input's rounding (moe._gemm_input) is timed with it, unless apart
        a, a_scale = rounded[id(a)] if id(a) in rounded else moe._gemm_input(a, w8a8)
        return launch(a, w, a_scale=a_scale, **kw)

    act = silu_and_mul(gemm(x, w13, row_div=TOP_K, w_scale=s13))
    rows = []
    if rounding_apart and w8a8:
        for name, t in (("round x", x), ("round act", act)):
            rounded[id(t)] = moe._gemm_input(t, True)
            us = time_graph(functools.partial(moe._gemm_input, t, True))
            rows.append({"tokens": tokens, "gemm": name, "rows": t.shape[0], "us": round(us, 1)})
            print(json.dumps(rows[-1]), flush=True)
    scale = weights.reshape(-1)
    variants = {
        "gate_up+silu": (lambda c: silu_and_mul(gemm(x, w13, row_div=TOP_K, w_scale=s13, config=c)), w13, (64, 128)),
        "gate_up fused": (lambda c: gemm(x, w13, row_div=TOP_K, gated=True, w_scale=s13, config=c), w13, (32, 64, 128)),
        "down": (lambda c: gemm(act, w2, row_div=1, scale=scale, w_scale=s2, config=c), w2, (64, 128, 256)),
    }  # fmt: skip
    want = {
        "gate_up+silu": act,
        "gate_up fused": act,
        "down": gemm(act, w2, row_div=1, scale=scale, w_scale=s2),
    }
    for name, (fn, w, widths) in variants.items():
        mbytes = touched * w.shape[1] * w.shape[2] * w.element_size()
        for config in [None, *itertools.product(widths, (64, 128, 256), (4,), (3, 4, 5))]:
            try:
                got = fn(config)
                assert torch.allclose(got.float(), want[name].float(), atol=3e-2, rtol=3e-2)
                us = time_graph(functools.partial(fn, config))
            except Exception as exc:  # noqa: BLE001 - out of shared memory and the like
                rows.append({"tokens": tokens, "gemm": name, "config": config, "error": str(exc)[:120]})
                continue
            rows.append({"tokens": tokens, "gemm": name, "block": block, "config": config or "default",
                         "us": round(us, 1), "TBps": round(mbytes / us / 1e6, 2)})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        ok = [r for r in rows if r["gemm"] == name and r["tokens"] == tokens and "us" in r]
        if ok:
            best = min(ok, key=lambda r: r["us"])
            base = next((r for r in ok if r["config"] == "default"), None)
            print(json.dumps({"tokens": tokens, "gemm": name, "default": base, "best": best}), flush=True)
    return rows


def time_small_kernels(tokens: int, gen: torch.Generator) -> list[dict]:
    """The router (five torch kernels, or ``_triton_moe.route``) and the schedule (three kernels
    and a zeroed count, or one program, ``_triton_moe.ONE_PROGRAM_PAIRS``, at 4, 8 and 16 warps,
    ``ONE_PROGRAM_WARPS``), each way timed at ``tokens`` and checked against the three kernels."""
    logits = torch.randn(tokens, EXPERTS, generator=gen, device=gen.device, dtype=torch.bfloat16)
    want_w, want_ids = route(logits, TOP_K, True)
    got_w, got_ids = _triton_moe.route(logits, TOP_K, True)
    probs = torch.softmax(logits.float(), dim=-1)  # (equal logits: either expert may come first)
    assert torch.allclose(got_w.float(), want_w.float(), atol=1e-2)
    assert torch.equal(probs.gather(1, got_ids), probs.gather(1, want_ids))
    rows = [
        {"tokens": tokens, "op": "route", "way": "torch", "us": time_graph(lambda: route(logits, TOP_K, True))},
        {"tokens": tokens, "op": "route", "way": "triton", "us": time_graph(lambda: _triton_moe.route(logits, TOP_K, True))},
    ]  # fmt: skip
    block = block_rows(tokens * TOP_K, EXPERTS)
    default, warps_default = _triton_moe.ONE_PROGRAM_PAIRS, _triton_moe.ONE_PROGRAM_WARPS
    try:
        outs = {}
        ways = [("three kernels", 0, warps_default)] + [
            (f"one program, {w} warps", 4096, w) for w in (4, 8, 16)
        ]
        for way, limit, warps in ways:
            _triton_moe.ONE_PROGRAM_PAIRS, _triton_moe.ONE_PROGRAM_WARPS = limit, warps
            outs[way] = align_blocks(want_ids, EXPERTS, block)
            us = time_graph(lambda: align_blocks(want_ids, EXPERTS, block))
            rows.append({"tokens": tokens, "op": "align", "way": way, "block": block, "us": us})
    finally:
        _triton_moe.ONE_PROGRAM_PAIRS, _triton_moe.ONE_PROGRAM_WARPS = default, warps_default
    sp3, be3 = outs["three kernels"]
    for sp1, be1 in list(outs.values())[1:]:
        assert torch.equal(be3, be1) and torch.equal(sp3.sort().values, sp1.sort().values)
    for row in rows:
        row["us"] = round(row["us"], 2)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="1,8,64,256,8192")
    parser.add_argument("--out")
    parser.add_argument(
        "--profile", action="store_true", help="only the default launch, its kernels profiled"
    )
    parser.add_argument("--gemms", action="store_true", help="each GEMM alone over its own launches")
    parser.add_argument(
        "--small-kernels", action="store_true", help="the router and the schedule, each both ways"
    )
    parser.add_argument("--experts", choices=("bf16", "int8", "fp8"), default="bf16")
    parser.add_argument("--weight-only", action="store_true", help="fp8: e4m3 weights times bf16 rows")
    parser.add_argument(
        "--swap-below", type=int, help="W8A8 blocks of fewer rows take the product transposed (SWAP_AB)"
    )
    parser.add_argument("--blocks", default="16,32,64,128", help="block rows the launch sweep tries")
    parser.add_argument("--widths", default="64,128", help="tile widths (BLOCK_N) the launch sweep tries")
    parser.add_argument("--depths", default="64,128", help="tile depths (BLOCK_K) the launch sweep tries")
    parser.add_argument("--warps", default="4,8", help="warps the launch sweep tries")
    parser.add_argument("--stages", default="3,4", help="pipeline stages the launch sweep tries")
    parser.add_argument("--default-only", action="store_true", help="the engine's launch alone, no sweep")
    parser.add_argument(
        "--rounding-apart",
        action="store_true",
        help="--gemms, W8A8: the GEMMs' input rows rounded before the timing, the rounding timed alone",
    )
    args = parser.parse_args()
    moe.W8A8_EXPERTS = not args.weight_only
    if args.swap_below is not None:
        _triton_moe.SWAP_AB_BELOW = args.swap_below
    gen = torch.Generator(device="cuda").manual_seed(0)
    w13 = torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02
    w2 = torch.randn(EXPERTS, HIDDEN, INTER, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02
    (w13, s13), (w2, s2) = quantized(w13, args.experts), quantized(w2, args.experts)
    scales = None if s13 is None else (s13, s2)
    rows = []
    for tokens in map(int, args.tokens.split(",")):
        x = torch.randn(tokens, HIDDEN, generator=gen, device="cuda", dtype=torch.bfloat16)
        logits = torch.randn(tokens, EXPERTS, generator=gen, device="cuda", dtype=torch.bfloat16)
        weights, ids = route(logits, TOP_K, True)
        touched = int(torch.unique(ids).numel())
        bytes_read = touched * 3 * INTER * HIDDEN * w13.element_size()
        if args.gemms:
            rows += sweep_gemms(tokens, x, w13, w2, weights, ids, touched, s13, s2, args.rounding_apart)
            continue
        if args.small_kernels:
            rows += time_small_kernels(tokens, gen)
            continue
        want = experts_grouped(x, w13, w2, weights, ids, scales)
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            run = functools.partial(experts_grouped, x, w13, w2, weights, ids, scales)
            run()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    run()
                torch.cuda.synchronize()
            print(f"== tokens {tokens}, per call (5 calls):")
            print(
                prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60)
            )
            continue
        default = block_rows(tokens * TOP_K, EXPERTS)
        choices = [(None, None)]
        for block, bn, bk, warps, stages in (
            ()
            if args.default_only
            else itertools.product(
                *(
                    tuple(map(int, v.split(",")))
                    for v in (args.blocks, args.widths, args.depths, args.warps, args.stages)
                )
            )
        ):
            if block == 128 and tokens < 1024:
                continue
            choices.append((block, ((bn, bk, warps, stages), (bn, bk, warps, stages))))
        for block, configs in choices:
            try:
                run = functools.partial(
                    experts_grouped, x, w13, w2, weights, ids, scales, block=block, configs=configs
                )
                got = run()
                assert torch.allclose(got.float(), want.float(), atol=3e-2, rtol=3e-2)
                us = time_graph(run)
            except Exception as exc:  # noqa: BLE001 - out of shared memory and the like
                rows.append({"tokens": tokens, "block": block, "configs": configs, "error": str(exc)[:200]})
                continue
            row = {"tokens": tokens, "block": block or default, "configs": configs or "default",
                   "us": round(us, 1), "experts_touched": touched, "TBps": round(bytes_read / us / 1e6, 2)}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
        best = min((r for r in rows if r["tokens"] == tokens and "us" in r), key=lambda r: r["us"])
        base = next(r for r in rows if r["tokens"] == tokens and r.get("configs") == "default")
        print(json.dumps({"tokens": tokens, "default": base, "best": best}), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
