"""rope_store_kv (norm + rotary on q and k, k and v into the KV pool) timed by tokens a program.

    python3 tools/device_rope_store.py [--json OUT.json]

For Qwen3-0.6B's heads (16 q, 8 kv, norm) and Llama-3.1-8B's (32 q, 8 kv, no norm) at decode and
prefill token counts: µs per call replayed from a CUDA graph of 20 calls over a fresh qkv each
(so the input comes from HBM, as after the GEMM in a step), the bytes it moves per µs, and
whether every variant wrote exactly what one token a program writes (q and the pool, bitwise).
The `picked` column is what :func:`rope_store_tokens_per_program` chooses for that count.
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
from device_attention_check import cuda_time_us


def _calls(rope_store_kv, qkvs, args, per):
    return [rope_store_kv(x, *args, tokens_per_program=per) for x in qkvs]


def main() -> None:
    from minisgl_core.api import KVCache
    from minisgl_core.layers.triton_ops import rope_store_kv, rope_store_tokens_per_program

    p = argparse.ArgumentParser()
    p.add_argument("--json")
    args = p.parse_args()
    dev, head_dim, reps = torch.device("cuda"), 128, 20
    rows = []
    print(f"{'shape':<8} {'tokens':>6} {'per':>4} {'µs':>8} {'GB/s':>7} {'same':>5} {'picked':>6}")
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
            reference = None
            for per in (1, 2, 4, 8):
                cache.buffer.zero_()

                call = functools.partial(
                    _calls, rope_store_kv, qkvs,
                    (positions, inv_freq, w, w, q_heads, kv_heads, 1e-6, cache, 0, loc), per,
                )  # fmt: skip

                out = (call()[-1].clone(), cache.buffer.clone())
                if reference is None:
                    reference = out
                same = torch.equal(out[0], reference[0]) and torch.equal(out[1], reference[1])
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    call()
                us = cuda_time_us(graph.replay, iters=20) / reps
                picked = rope_store_tokens_per_program(tokens) == per
                rows.append({"shape": name, "tokens": tokens, "per": per, "us": round(us, 2),
                             "gb_per_s": round(moved / us / 1e3, 1), "same": same, "picked": picked})  # fmt: skip
                print(f"{name:<8} {tokens:>6} {per:>4} {us:>8.2f} {moved / us / 1e3:>7.0f} {str(same):>5} "
                      f"{'*' if picked else '':>6}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
