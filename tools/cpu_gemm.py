"""The float32 products of a CPU decode step: ``F.linear`` against the slab product the linear
layers use for a few rows (``minisgl_core.layers.linear.slab_matmul``, fast path
``cpu_slab_gemm``), ``weight @ x.T`` and oneDNN's linear (``torch.ops.mkldnn._linear_pointwise``
on the plain weight), µs per call and the weight's GB/s, median of five
passes. Each pass cycles through copies of the weight (about 96 MB in all), so every call reads it
from memory, as a decode step does.

    .venv/bin/python tools/cpu_gemm.py [--shapes smollm2-135m,qwen3-0.6b] [--rows 1,2,3,4,8] [--threads 2] [--slabs N]

``--slabs`` 0 (the default) takes the engine's count: the threads, at least 2, a divisor of the
weight's rows.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from minisgl_core.bench.shapes import SHAPES as BENCH_SHAPES
from minisgl_core.bench.shapes import linear_shapes
from minisgl_core.layers.linear import cpu_slabs, slab_matmul

#: the default model's decoder (SmolLM2-135M-Instruct's config.json), beside the benchmark shapes
SMOLLM2_135M = {"hidden_size": 576, "intermediate_size": 1536, "vocab_size": 49152, "num_attention_heads": 9,
                "num_key_value_heads": 3, "head_dim": 64}  # fmt: skip
SHAPES = {  # (N, K) of y = x @ W.T, W [N, K]
    "smollm2-135m": linear_shapes(SMOLLM2_135M),
    "qwen3-0.6b": {
        name: nk for name, nk in linear_shapes(BENCH_SHAPES["qwen3-0.6b"]).items() if name != "lm_head"
    },
}


def products(slabs: int) -> dict:
    return {
        "F.linear": lambda x, w: F.linear(x, w),
        f"slabs({slabs})": lambda x, w: slab_matmul(x, w, slabs),
        "w @ x.T": lambda x, w: (w @ x.t()).t().contiguous(),
        "oneDNN": lambda x, w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""),
    }


def engine_slabs(n: int, k: int) -> int:
    """The slab count the engine's rule picks for an ``[n, k]`` weight at the set threads."""
    return cpu_slabs(torch.zeros(1, k), torch.zeros(n, k), max_rows=1) or 2


def time_us(fn, x: torch.Tensor, weights: list[torch.Tensor], calls: int) -> float:
    fn(x, weights[0])
    start = time.perf_counter()
    for i in range(calls):
        fn(x, weights[i % len(weights)])
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="smollm2-135m")
    parser.add_argument("--rows", default="1,2,3,4,8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--slabs", type=int, default=0, help="slab count (0: the engine's rule)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"{args.threads} threads; µs per call (weight GB/s)")
    for shape in args.shapes.split(","):
        for layer, (n, k) in SHAPES[shape].items():
            copies = max(1, int(96e6 // (n * k * 4)))
            weights = [torch.randn(n, k) for _ in range(copies)]
            calls = max(3, min(40, int(4e8 // (n * k * 4))))
            for rows in (int(r) for r in args.rows.split(",")):
                x = torch.randn(rows, k)
                fns = products(args.slabs or engine_slabs(n, k))
                times: dict[str, list[float]] = {name: [] for name in fns}
                for _ in range(5):  # passes, the products alternating
                    for name, fn in fns.items():
                        times[name].append(time_us(fn, x, weights, calls))
                cells = []
                for name, ts in times.items():
                    us = statistics.median(ts)
                    cells.append(f"{name} {us:8.0f} ({n * k * 4 / us / 1e3:4.1f})")
                print(f"{shape} {layer:8s} rows {rows:3d}  " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
