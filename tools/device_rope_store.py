"""rope_store_kv (norm + rotary on q and k, k and v into the KV pool) at each tile shape: one
token a program (the ``rope_store_tiles`` fast path off) against several tokens a program as one
masked tile, with 4 or 8 warps. (Before the forty-fourth session one token a program was a kernel
of its own; the figures of BENCHMARKS.md's forty-third session compare that kernel.)

    cd tools && python3 device_rope_store.py [--json OUT.json]

For Qwen3-0.6B's heads (16 q, 8 kv, q/k norm) and Llama-3.1-8B's (32 q, 8 kv, no norm) at decode
and prefill token counts: µs per call replayed from a CUDA graph of 20 calls over a fresh qkv each
(the input comes from HBM, as after the GEMM in a step), the bytes moved per µs, and each tiled
variant's largest difference from one token a program's q and pool (bf16: 0 or one rounding).
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
from device_attention_check import cuda_time_us

#: (tokens a program, warps); False = one token a program, 4 warps
VARIANTS = [False, (2, 4), (4, 4), (4, 8), (8, 8), (16, 8)]


def _calls(rope_store_kv, qkvs, args, tiles):
    return [rope_store_kv(x, *args, tiles=tiles) for x in qkvs]


def main() -> None:
    from minisgl_core.api import KVCache
    from minisgl_core.layers.triton_ops import rope_store_kv

    p = argparse.ArgumentParser()
    p.add_argument("--json")
    args = p.parse_args()
    dev, head_dim, reps = torch.device("cuda"), 128, 20
    rows = []
    print(f"{'shape':<6} {'tokens':>6} {'tiles':>8} {'µs':>8} {'GB/s':>6} {'max |diff|':>10}")
    for name, q_heads, kv_heads, norm in (("qwen3", 16, 8, True), ("llama", 32, 8, False)):
        for tokens in (1, 64, 256, 1024, 2048, 8192):
            heads = q_heads + 2 * kv_heads
            gen = torch.Generator(device=dev).manual_seed(tokens)
            qkvs = [
                torch.randn(tokens, heads, head_dim, device=dev, generator=gen).bfloat16()
                for _ in range(reps)
            ]
            positions = torch.randint(0, 8192, (tokens,), device=dev, generator=gen)
            inv_freq = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2, device=dev).float() / head_dim))
            w = torch.rand(head_dim, device=dev, generator=gen).bfloat16() + 0.5 if norm else None
            slots = max(16 * 1024, tokens * 2)
            cache = KVCache(num_layers=1, num_pages=slots // 16, page_size=16, num_kv_heads=kv_heads,
                            head_dim=head_dim, dtype=torch.bfloat16, device=dev)  # fmt: skip
            loc = torch.randperm(slots, device=dev, generator=gen)[:tokens]
            moved = tokens * (heads + q_heads + 2 * kv_heads) * head_dim * 2  # read qkv, write q, k, v
            fixed = (positions, inv_freq, w, w, q_heads, kv_heads, 1e-6, cache, 0, loc)
            reference = None
            for tiles in VARIANTS:
                cache.buffer.zero_()
                call = functools.partial(_calls, rope_store_kv, qkvs, fixed, tiles)
                out = (call()[-1].float(), cache.buffer.float())
                if reference is None:
                    reference = out
                diff = max(
                    (out[0] - reference[0]).abs().max().item(), (out[1] - reference[1]).abs().max().item()
                )
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    call()
                us = cuda_time_us(graph.replay, iters=20) / reps
                rows.append({"shape": name, "tokens": tokens, "tiles": tiles, "us": round(us, 2),
                             "gb_per_s": round(moved / us / 1e3, 1), "max_diff": diff})  # fmt: skip
                label = "1/prog" if tiles is False else f"{tiles[0]}x{tiles[1]}w"
                print(f"{name:<6} {tokens:>6} {label:>8} {us:>8.2f} {moved / us / 1e3:>6.0f} {diff:>10.3g}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
