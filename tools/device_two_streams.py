"""Does a decode step run faster as two half batches on two CUDA streams? (issue 19)

A full Qwen3-0.6B decode step is ≈ 77% attention (bandwidth-bound, the whole GPU) and ≈ 15% GEMMs
that take 5-7 µs each whatever their size (a per-kernel floor, most SMs idle). Captured as two
independent branches of one CUDA graph, one half's GEMMs could run beside the other half's
attention. This measures it before any engine change: the engine's model and Triton decode
backend (a second instance for the second half: its own split-KV buffers), a synthetic decode
batch over random KV (lengths uniform in ``--min-len .. --max-len``), three graphs per batch size:

- ``one``: the whole batch, as the engine captures it today;
- ``halves_serial``: the two halves one after the other on one stream (what splitting costs);
- ``halves_streams``: the two halves on two streams (what overlapping them gains).

Replayed alternately, ms per replay from CUDA events; the logits of the three are compared
(greedy agreement, max |Δ|).

    python3 tools/device_two_streams.py MODEL_DIR [--sizes 128,192,256] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import random

import torch


def build_batch(runner, attn, rows: range, seq_lens: list[int], page_table_rows: list[int]):
    from minisgl_core.api import ForwardBatch

    device = runner.device
    bs = len(rows)
    lens = [seq_lens[r] for r in rows]
    slots = torch.tensor([page_table_rows[r] for r in rows], dtype=torch.int32, device=device)
    seq = torch.tensor(lens, dtype=torch.int32, device=device)
    positions = (seq - 1).to(torch.int64)
    out_loc = runner.page_table[slots.long(), positions].to(torch.int64)
    ids = torch.randint(0, runner.vocab_size, (bs,), device=device)
    return ForwardBatch(
        is_prefill=False,
        input_ids=ids,
        positions=positions,
        out_cache_loc=out_loc,
        req_slots=slots,
        seq_lens=seq,
        extend_lens=torch.ones(bs, dtype=torch.int32, device=device),
        seq_lens_cpu=lens,
        extend_lens_cpu=[1] * bs,
        page_table=runner.page_table,
        logits_indices=torch.arange(bs, device=device),
        attn=attn,
        captured=True,
    )


def capture(fn) -> tuple[torch.cuda.CUDAGraph, object]:
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()
    return graph, out


def time_graph(graph: torch.cuda.CUDAGraph, iters: int) -> float:
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


@torch.inference_mode()
def measure_size(runner, attn_a, attn_b, bs: int, seq_lens: list[int], rounds: int, iters: int) -> dict:
    """The three graphs of one batch size, replayed alternately ``rounds`` times."""
    model = runner.model
    rows_of = list(range(len(seq_lens)))
    half = bs // 2
    attn_a.init_graph_capture(bs)
    attn_b.init_graph_capture(bs)
    full = build_batch(runner, attn_a, range(bs), seq_lens, rows_of)
    attn_a.prepare_capture(full)
    g_one, out_one = capture(lambda: model(full))
    first = build_batch(runner, attn_a, range(half), seq_lens, rows_of)
    second = build_batch(runner, attn_b, range(half, bs), seq_lens, rows_of)
    first.input_ids.copy_(full.input_ids[:half])
    second.input_ids.copy_(full.input_ids[half:])
    attn_a.prepare_capture(first)
    attn_b.prepare_capture(second)

    def serial():
        return torch.cat([model(first), model(second)])

    side = torch.cuda.Stream()

    def streams():
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        out_first = model(first)
        with torch.cuda.stream(side):
            out_second = model(second)
        main.wait_stream(side)
        return torch.cat([out_first, out_second])

    g_serial, out_serial = capture(serial)
    g_streams, out_streams = capture(streams)
    # the full graph's metadata buffers were overwritten by the halves' capture: re-fill
    attn_a.prepare_replay(full)
    times: dict[str, list[float]] = {"one": [], "halves_serial": [], "halves_streams": []}
    graphs = {"one": g_one, "halves_serial": g_serial, "halves_streams": g_streams}
    for _ in range(rounds):
        for name in times:
            if name == "one":
                attn_a.prepare_replay(full)
            else:
                attn_a.prepare_replay(first)
                attn_b.prepare_replay(second)
            times[name].append(round(time_graph(graphs[name], iters), 4))
    attn_a.prepare_replay(full)
    g_one.replay()
    ref = out_one.float().clone()
    attn_a.prepare_replay(first)
    attn_b.prepare_replay(second)
    g_streams.replay()
    got_streams = out_streams.float().clone()
    g_serial.replay()
    got_serial = out_serial.float().clone()
    torch.cuda.synchronize()
    entry = {
        "ms": times,
        "mean_context": sum(seq_lens[:bs]) / bs,
        "streams_vs_one": round(min(times["halves_streams"]) / min(times["one"]) - 1, 4),
        "serial_vs_one": round(min(times["halves_serial"]) / min(times["one"]) - 1, 4),
        "greedy_agree_streams": float((got_streams.argmax(-1) == ref.argmax(-1)).float().mean()),
        "greedy_agree_serial": float((got_serial.argmax(-1) == ref.argmax(-1)).float().mean()),
        "streams_equal_serial": bool(torch.equal(got_streams, got_serial)),
        "max_abs_diff_streams": float((got_streams - ref).abs().max()),
    }
    del g_one, g_serial, g_streams
    torch.cuda.synchronize()
    return entry


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--sizes", default="64,128,192,256")
    p.add_argument("--min-len", type=int, default=100)
    p.add_argument("--max-len", type=int, default=1300)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args()

    from minisgl_core.llm import LLM

    llm = LLM(args.model, attn="auto", cuda_graph_max_bs=1, piecewise_cuda_graph_max_tokens=0)
    runner = llm.engine.runner
    attn_a = runner.decode_attn
    attn_b = type(attn_a)(attn_a.config)  # its own split-KV partials for the second half
    sizes = [int(s) for s in args.sizes.split(",")]
    most = max(sizes)
    random.seed(0)
    seq_lens = [random.randint(args.min_len, args.max_len) for _ in range(most)]
    page = runner.page_size
    # each request row gets its own run of pages, filled with random KV
    next_slot = 0
    for r in range(most):
        pages = -(-seq_lens[r] // page)
        runner.page_table[r, : pages * page] = torch.arange(
            next_slot, next_slot + pages * page, dtype=torch.int32, device=runner.device
        )
        next_slot += pages * page
    assert next_slot <= runner.dummy_slot, "KV pool too small for the synthetic batch"
    cache = runner.kv_cache
    for layer in range(cache.num_layers):
        cache.k_cache(layer).view(-1)[: next_slot * cache.num_kv_heads * cache.head_dim].normal_()
        cache.v_cache(layer).view(-1)[: next_slot * cache.num_kv_heads * cache.head_dim].normal_()
    result: dict = {"model": args.model, "device": torch.cuda.get_device_name(), "sizes": {}}
    for bs in sizes:
        entry = measure_size(runner, attn_a, attn_b, bs, seq_lens, args.rounds, args.iters)
        result["sizes"][bs] = entry
        print(bs, json.dumps(entry), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    llm.close()


if __name__ == "__main__":
    main()
