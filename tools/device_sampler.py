"""The sampler's Gumbel-max draw on the GPU at 1-16 chunks of the vocabulary per program of its
first kernel (``span``), µs per call replayed from a CUDA graph, and whether every span draws the
same tokens and keys as span 1 (a chunk's sums do not depend on the span). Run it with an earlier
tree's core first on PYTHONPATH to time that tree's draw on the same machine (the one-kernel
draw of a0a7178 and before: ``PYTHONPATH=.dev/before_a0:$PYTHONPATH``).

    python3 tools/device_sampler.py [--vocab 151936] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json

import torch


def main() -> None:
    from device_attention_check import cuda_time_us

    from minisgl_core.runner.sampler import gumbel_max_chunked, sampler_span

    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--json")
    args = p.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    results = []
    for rows in (1, 8, 32, 64, 128, 192, 256):
        logits = (torch.randn(rows, args.vocab, device=dev) * 3).bfloat16()
        scale = torch.full((rows,), 1 / 0.6, device=dev)
        noise = torch.ones(rows, device=dev)
        noise[::4] = 0.0  # greedy rows among them: ties decided by the first index
        chunks = -(-args.vocab // 2048)
        row = {"rows": rows, "picked": sampler_span(rows, chunks)}
        ref = gumbel_max_chunked(logits, scale, noise, 11, span=1)
        for span in (1, 2, 4, 8, 16):
            got = gumbel_max_chunked(logits, scale, noise, 11, span=span)
            same = bool(torch.equal(ref[1], got[1]) and torch.equal(ref[0], got[0]))
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(20):
                    gumbel_max_chunked(logits, scale, noise, 11, span=span)
            us = cuda_time_us(graph.replay, iters=10) / 20
            row[f"span{span}"] = {"us": round(us, 2), "same": same}
        print(json.dumps(row), flush=True)
        results.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
