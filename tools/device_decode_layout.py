"""Decode attention over every layer of a step, on the KV layout an offline run leaves (issue 19).

The one-layer micro-benchmark (``tools/device_triton_decode.py``) replays one layer's attention on
a pool of exactly the pages it reads, its pages in random order. A real decode step reads 28
layers' KV from a pool of ~100 GB, in the order the page allocator handed the pages out: each
prompt's pages as one run (``PageAllocator.alloc`` gives a run's ids in descending order), then one
page a request every 16 tokens, interleaved with the other running requests' pages. The fifty-ninth
session's profile put the attention of a real step at 80 requests at ≈ 3.75 TB/s, where the
micro-benchmark reads ≈ 4.2 at batch 96. This tool times the backend's decode attention (the
default ``triton`` decode, through the attention API in CUDA-graph replay) on the standard offline
workload's lengths at chosen decode steps, with the pages laid out:

- ``engine``: as the allocator lays them out (prompts in admission order, then decode pages);
- ``engine_asc``: the same, each allocation's run ascending instead;
- ``contiguous``: every sequence's pages one ascending run, sequences packed;
- ``random``: the engine layout's pages shuffled among its sequences (the micro-benchmark's kind);

each over all layers (``attend`` for layer 0..L-1 in one graph) and over layer 0 only, L times
(the micro-benchmark's cache and TLB state). Qwen3-0.6B's attention shape by default.

``--sweep`` then times, on the engine layout over all layers, the decode kernel's split count (1-16
pieces a sequence, ``--splits``) and positions a loop step (64, 128) beside the backend as it is;
``--launches`` sweeps positions, warps, stages and a register cap instead (a float8 pool needs
its cap, ``128:4:3:168``; ``--sweep-only``: no layouts timed). (Its version at
`39d65d9` also timed the order the pieces launch in.) ``--kv-dtype fp8_e4m3`` builds a float8 pool
(the pool of ``--kv-cache-dtype fp8_e4m3``: half the bytes a page); its sweep's launches carry the
register caps that fit at their loop step (168 at 128 positions, three stages; 128 at 64).

    python3 tools/device_decode_layout.py [--steps 100,400,700,950] [--pool-gb 100] [--kv-dtype bf16|fp8_e4m3]
        [--sweep [--sweep-only] [--splits 1,2,4,8,16] [--launches 64:4:2,128:4:3,...]] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random

import torch

from minisgl_core.api import AttentionConfig, KVCache
from minisgl_core.bench.workloads import standard_offline
from minisgl_core.plugins import Plugins
from minisgl_core.scheduler.allocator import PageAllocator
from minisgl_core.testing.paged import PageTableLayout, make_forward_batch

PAGE = 16
HEAD_DIM = 128


def engine_pages(reqs: list[tuple[int, int]], step: int, num_pages: int, ascending: bool) -> list[list[int]]:
    """Each request's pages after ``step`` decode steps, allocated as the scheduler does with a pool
    that never runs short (finished requests' pages stay in the prefix cache): prompts in order,
    one run each, then a page for every running request whose next position starts one, the
    step's new pages taken in one go."""
    allocator = PageAllocator(num_pages, PAGE)

    def take(n: int) -> list[int]:
        run = allocator.alloc(n)
        return sorted(run) if ascending else run

    pages = [take(math.ceil(p / PAGE)) for p, _ in reqs]
    for t in range(step + 1):
        # decode step t writes position p + t of every request still running
        needing = [i for i, (p, o) in enumerate(reqs) if o > t and (p + t) % PAGE == 0]
        for i, page in zip(needing, take(len(needing)), strict=True):
            pages[i].append(page)
    return pages


def layout_of(pages: list[list[int]], lens: list[int], max_len: int, dev: torch.device) -> PageTableLayout:
    table = torch.zeros(len(pages) + 2, max_len, dtype=torch.int32)
    for row, (own, n) in enumerate(zip(pages, lens, strict=True)):
        slots = (torch.tensor(own)[:, None] * PAGE + torch.arange(PAGE)).flatten()[:n]
        table[row, :n] = slots.to(torch.int32)
    return PageTableLayout(table.to(dev), torch.arange(len(pages), dtype=torch.int32, device=dev))


def time_us(backend_cls, config: AttentionConfig, layout, lens, layers: list[int], reps: int = 10) -> float:
    """µs per layer of ``attend`` over ``layers`` in one CUDA graph, replayed ``reps`` times."""
    backend = backend_cls(config)
    bs = len(lens)
    batch = make_forward_batch(
        layout, lens, [1] * bs, attn=backend, generator=torch.Generator(), is_prefill=False, captured=True
    )
    backend.init_graph_capture(bs)
    backend.prepare_capture(batch)
    q = torch.randn(bs, config.num_qo_heads, HEAD_DIM, device=config.device, dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        backend.attend(q, 0, batch)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for layer in layers:
            backend.attend(q, layer, batch)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * len(layers))


def sweep(backend_cls, config, layout, lens, args, result: dict, step: int, kv_bytes: int) -> None:
    """The split count and the loop step, over all layers."""
    from minisgl_plugin_triton.backend import Launch

    layers = list(range(args.layers))
    base = backend_cls(config)
    elem = config.kv_cache.dtype.itemsize
    row = {"step": step, "batch": len(lens), "variant": "default", "splits": base.splits(len(lens)),
           "us": round(time_us(backend_cls, config, layout, lens, layers), 2)}  # fmt: skip
    result.setdefault("sweep", []).append(row)
    print(json.dumps(row), flush=True)
    if args.launches:  # positions a loop step : warps : stages
        launches = [Launch(*map(int, spec.split(":"))) for spec in args.launches.split(",")]
    elif elem == 1:  # the caps the float8 kernel fits without spilling (backend.Launch)
        launches = [Launch(64, 4, 2, maxnreg=128), Launch(128, 4, 3, maxnreg=168)]
    else:
        launches = [Launch(64, 4, 2), Launch(128, 4, 2)]
    for splits, launch in itertools.product(map(int, args.splits.split(",")), launches):
        block_n = launch.block_n
        attrs = {
            "splits": lambda self, bs, s=splits: s,
            "launches": {**backend_cls.launches, elem: launch},
            "wide_launches": {elem: launch},
        }
        variant = type("Variant", (backend_cls,), attrs)
        row = {"step": step, "batch": len(lens), "splits": splits, "block_n": block_n, "warps": launch.num_warps,
               "stages": launch.num_stages}  # fmt: skip
        try:
            us = time_us(variant, config, layout, lens, layers)
            row |= {"us": round(us, 2), "tbps": round(kv_bytes / (us * 1e-6) / 1e12, 3)}
        except Exception as e:  # a launch that does not fit
            row["error"] = f"{type(e).__name__}: {e}"[:160]
        result["sweep"].append(row)
        print(json.dumps(row), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", default="100,400,700,950")
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--qo-heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--pool-gb", type=float, default=100.0)
    p.add_argument("--backend", default="triton")
    p.add_argument("--kv-dtype", choices=("bf16", "fp8_e4m3"), default="bf16")
    p.add_argument("--sweep", action="store_true", help="then time split counts and loop steps")
    p.add_argument("--splits", default="1,2,4,8,16", help="the split counts the sweep tries")
    p.add_argument(
        "--launches",
        help="the sweep's launches, block_n:warps:stages[:maxnreg],... (default: 64 and 128 positions)",
    )
    p.add_argument("--sweep-only", action="store_true", help="the sweep alone, not the layouts")
    p.add_argument("--json")
    args = p.parse_args()
    dev = torch.device("cuda")
    backend_cls = Plugins.load().resolve("attention", args.backend)
    kv_dtype = torch.float8_e4m3fn if args.kv_dtype == "fp8_e4m3" else torch.bfloat16
    page_bytes = 2 * PAGE * args.kv_heads * HEAD_DIM * kv_dtype.itemsize  # K and V of one page of one layer
    num_pages = int(args.pool_gb * 1e9) // (args.layers * page_bytes)
    cache = KVCache(num_layers=args.layers, num_pages=num_pages, page_size=PAGE, num_kv_heads=args.kv_heads,
                    head_dim=HEAD_DIM, dtype=kv_dtype, device=dev)  # fmt: skip
    for chunk in cache.buffer.view(-1).split(1 << 30):  # float8 has no normal_(); bf16 chunks cast
        chunk.copy_(torch.randn(chunk.numel(), device=dev, dtype=torch.bfloat16))
    reqs = [(len(r.prompt_ids), r.max_tokens) for r in standard_offline()]
    result: dict = {"device": torch.cuda.get_device_name(0), "kv_dtype": args.kv_dtype, "num_pages": num_pages,
                    "rows": []}  # fmt: skip
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}), flush=True)
    for step in (int(s) for s in args.steps.split(",")):
        running = [i for i, (_, o) in enumerate(reqs) if o > step]
        lens = [reqs[i][0] + step + 1 for i in running]
        max_len = math.ceil(max(lens) / PAGE) * PAGE + PAGE
        config = AttentionConfig(num_qo_heads=args.qo_heads, num_kv_heads=args.kv_heads, head_dim=HEAD_DIM,
                                 scale=HEAD_DIM**-0.5, page_size=PAGE, dtype=torch.bfloat16, device=dev,
                                 max_requests=len(running) + 2, max_context_len=max_len, kv_cache=cache)  # fmt: skip
        kv_bytes = sum(lens) * page_bytes // PAGE
        layouts = {}
        for name, ascending in (("engine", False), ("engine_asc", True)):
            every = engine_pages(reqs, step, num_pages, ascending)
            layouts[name] = [every[i][: math.ceil(n / PAGE)] for i, n in zip(running, lens, strict=True)]
        counts = [len(own) for own in layouts["engine"]]
        packed, at = [], 0
        for c in counts:
            packed.append(list(range(at, at + c)))
            at += c
        layouts["contiguous"] = packed
        shuffled = [page for own in layouts["engine"] for page in own]
        random.Random(0).shuffle(shuffled)
        layouts["random"], at = [], 0
        for c in counts:
            layouts["random"].append(shuffled[at : at + c])
            at += c
        for name, pages in () if args.sweep_only else layouts.items():
            layout = layout_of(pages, lens, max_len, dev)
            row = {"step": step, "batch": len(lens), "mean_len": round(sum(lens) / len(lens)), "layout": name}
            for label, layers in (("all_layers", list(range(args.layers))), ("layer0", [0] * args.layers)):
                us = time_us(backend_cls, config, layout, lens, layers)
                row[f"{label}_us"] = round(us, 2)
                row[f"{label}_tbps"] = round(kv_bytes / (us * 1e-6) / 1e12, 3)
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
        if args.sweep:
            sweep(backend_cls, config, layout_of(layouts["engine"], lens, max_len, dev), lens, args, result, step,
                  kv_bytes)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
