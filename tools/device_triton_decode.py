"""Decode attention on one layer, the Triton backend against FlashInfer's, in CUDA-graph replay (issue 19).

Both backends run through the attention API (``prepare_capture`` then ``attend``) on one random
paged layout, page 16, over a bf16 and a float8 e4m3 pool; 20 calls are captured in one graph and
the replay timed. TB/s counts the KV bytes the batch reads. Each Triton output is compared with
FlashInfer's on the same pool (max |difference|).

    python3 tools/device_triton_decode.py [--sweep] [--json OUT.json]

``--sweep`` first tries launch configurations of the Triton kernel (positions per loop step,
warps, pipeline stages) on the full-batch shapes and reports each.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math

import torch

from minisgl_core.api import AttentionConfig, KVCache
from minisgl_core.plugins import Plugins
from minisgl_core.testing.paged import make_forward_batch, random_page_table

PAGE = 16
HEAD_DIM = 128
#: (query heads, KV heads, batch, context): Qwen3-0.6B and Llama-3.1-8B at full batch, a mid batch
#: of long sequences, batch 1
SHAPES = [
    (16, 8, 256, 800),
    (32, 8, 256, 800),
    (16, 8, 64, 800),
    (16, 8, 32, 1500),
    (32, 8, 1, 200),
    (32, 8, 4, 1000),
]


def problem(qo: int, kv: int, bs: int, ctx: int, kv_dtype: torch.dtype, backend_cls, dev):
    pages = bs * math.ceil(ctx / PAGE) + 4
    cache = KVCache(num_layers=1, num_pages=pages, page_size=PAGE, num_kv_heads=kv, head_dim=HEAD_DIM,
                    dtype=kv_dtype, device=dev)  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    cache.buffer.copy_(torch.randn(cache.buffer.shape, generator=gen).to(kv_dtype))
    config = AttentionConfig(num_qo_heads=qo, num_kv_heads=kv, head_dim=HEAD_DIM, scale=HEAD_DIM**-0.5,
                             page_size=PAGE, dtype=torch.bfloat16, device=torch.device(dev), max_requests=bs + 2,
                             max_context_len=math.ceil(ctx / PAGE) * PAGE + PAGE, kv_cache=cache)  # fmt: skip
    backend = backend_cls(config)
    layout = random_page_table([ctx] * bs, page_size=PAGE, num_pages=pages, max_requests=bs + 2,
                               max_context_len=config.max_context_len, generator=gen, device=dev)  # fmt: skip
    batch = make_forward_batch(layout, [ctx] * bs, [1] * bs, attn=backend, generator=gen, is_prefill=False,
                               captured=True)  # fmt: skip
    q = torch.randn(bs, qo, HEAD_DIM, generator=gen).to(device=dev, dtype=torch.bfloat16)
    return backend, batch, q


def replay_us(backend, batch, q, reps: int = 20) -> tuple[float, torch.Tensor]:
    backend.init_graph_capture(batch.batch_size)
    backend.prepare_capture(batch)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = backend.attend(q, 0, batch)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            out = backend.attend(q, 0, batch)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (10 * reps), out.float()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--json")
    args = p.parse_args()
    dev = torch.device("cuda")
    plugins = Plugins.load()
    fi, triton_cls = plugins.resolve("attention", "fi"), plugins.resolve("attention", "triton")
    result: dict = {"device": torch.cuda.get_device_name(0), "rows": [], "sweep": []}

    if args.sweep:
        for block_n, warps, stages in itertools.product((32, 64, 128), (4, 8), (2, 3)):
            variant = type(
                "Variant", (triton_cls,), {"block_n": block_n, "num_warps": warps, "num_stages": stages}
            )
            for qo, kv, bs, ctx in SHAPES[:2]:
                try:
                    us, _ = replay_us(*problem(qo, kv, bs, ctx, torch.float8_e4m3fn, variant, dev))
                except Exception as e:  # a configuration that does not compile (registers, shared memory)
                    us = None
                    print(
                        f"sweep block_n={block_n} warps={warps} stages={stages}: {type(e).__name__}: {e}"[
                            :300
                        ]
                    )
                row = {
                    "block_n": block_n,
                    "warps": warps,
                    "stages": stages,
                    "shape": [qo, kv, bs, ctx],
                    "us": us,
                }
                result["sweep"].append(row)
                print(json.dumps(row), flush=True)

    for (qo, kv, bs, ctx), kv_dtype in itertools.product(SHAPES, (torch.bfloat16, torch.float8_e4m3fn)):
        row: dict = {"shape": f"qo{qo}/kv{kv} bs{bs} ctx{ctx}", "kv": str(kv_dtype)[6:]}
        nbytes = 2 * bs * ctx * kv * HEAD_DIM * torch.empty((), dtype=kv_dtype).element_size()
        outs = {}
        for name, cls in (("fi", fi), ("triton", triton_cls)):
            us, outs[name] = replay_us(*problem(qo, kv, bs, ctx, kv_dtype, cls, dev))
            row[f"{name}_us"] = round(us, 2)
            row[f"{name}_tbps"] = round(nbytes / (us * 1e-6) / 1e12, 2)
        row["max_abs_diff"] = float((outs["fi"] - outs["triton"]).abs().max())
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
