"""The one-token FP8 GEMV (``minisgl_plugin_fp8.gemv``) over launch configurations, with every
weight read from HBM as in a decode step (the graph rotates over enough copies of each weight to
miss L2; ``tools/device_fp8_check.py gemm`` replays one copy, which L2 holds for the smaller
Llama-3.1-8B layers). Searches the kernel's knobs: the tile (rows x columns a loop step), warps,
``acc_r``
(in-thread sums over neighbouring columns: a narrower accumulator, fewer registers) and, on the
fastest few, ``evict`` (weights loaded evict-first). The configurations compile first in parallel
processes (Triton's cache), then one process times them.

    python3 tools/device_gemv_sweep.py --out $OUT/gemv-sweep.json [--shapes llama-3.1-8b] [--workers 12]

Prints per layer ``pick_config``'s time and the fastest, each with its TB/s (weight bytes over
the time) and its distance from the plugin's float32 emulation (every candidate must be within
``device_fp8_check.EMULATION_TOLERANCE``; a wrong one is shown and never ranked), and the sum over
the four layers: what a decode step's 32 layers would gain.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import sys
import time

import torch

from minisgl_core.bench.shapes import SHAPES as SHAPES_BY_NAME
from minisgl_core.bench.shapes import linear_shapes

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SHAPES = {  # (name, N, K) of y = x @ W.T: a layer's four products (the LM head is not swept)
    shape: [
        (name, n, k) for name, (n, k) in linear_shapes(SHAPES_BY_NAME[shape]).items() if name != "lm_head"
    ]
    for shape in ("llama-3.1-8b", "qwen3-0.6b")
}
#: weights up to this many elements are also swept over split K (1, 2, 4)
SPLIT_SWEEP_MAX = 8 << 20
#: bytes of weight copies per layer: well past an H200's 60 MB of L2
COPY_BYTES = 512 << 20
EMULATION_TOLERANCE = 0.004


def candidates(n: int, k: int, wide: bool = False) -> list:
    """``pick_config``'s choice first, then tiles x warps x ``acc_r`` x tiles per program, loaded
    without eviction hints (``evict`` is tried on the fastest three afterwards). (A ``pipe`` knob,
    the next step's weight block loaded before this step's multiplies, was 1.4-1.8x slower on
    every shape on 2026-11-28 and is gone.) ``wide`` adds tiles of one to four whole rows (or
    8,192-16,384 columns of them) a loop step."""
    from minisgl_plugin_fp8.gemv import pick_config

    base = pick_config(n, k, torch.cuda.get_device_properties(0).multi_processor_count)
    out = [base, base._replace(hw_round=False)]  # and the row rounded in arithmetic, as before
    blocks = [(8, 1024), (16, 512), (16, 1024), (8, 2048), (4, 2048), (32, 256), (8, 512), (4, 1024)]
    if wide:  # a few whole rows a loop step: each step's block one contiguous run of memory
        blocks += [(1, 4096), (2, 4096), (4, 4096), (2, 2048), (1, 8192), (2, 8192), (1, 16384)]
    splits = sorted({1, 2, 4, base.split_k}) if n * k <= SPLIT_SWEEP_MAX else [base.split_k]
    grid = itertools.product(blocks, (4, 8), (1, 8, 16), (1, 2), splits)
    for (block_n, block_k), warps, acc_r, tiles, split_k in grid:
        if block_k > k or (split_k > 1 and k < split_k * 2 * block_k):
            continue
        config = base._replace(
            block_n=block_n,
            block_k=block_k,
            split_k=split_k,
            num_warps=warps,
            acc_r=acc_r,
            tiles=tiles,
            evict=False,
        )
        if config not in out:
            out.append(config)
    return out


def _inputs(n: int, k: int, copies: int, seed: int = 0):
    from minisgl_plugin_fp8.method import quantize_rows

    gen = torch.Generator(device="cuda").manual_seed(seed)
    weight = (torch.randn(n, k, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
    q, scale = quantize_rows(weight)
    x = torch.randn(1, k, generator=gen, device="cuda").to(torch.bfloat16)
    weights = [q] + [q.clone() for _ in range(copies - 1)]
    return x, weights, scale.view(-1).float().contiguous()


def _compile(job: tuple) -> str:
    """Worker: run each configuration once on a small weight of the layer's K (the compile is
    keyed on the constants and the arguments' divisibility, not on N)."""
    k, configs = job
    from minisgl_plugin_fp8.gemv import fp8_gemv

    x, weights, scale = _inputs(64, k, 1)
    errors = 0
    for config in configs:
        try:
            fp8_gemv(x, weights[0], scale, config)
        except Exception:  # noqa: BLE001 - reported by the timing pass
            errors += 1
    torch.cuda.synchronize()
    return f"{len(configs)} compiled, {errors} failed"


def time_graph(fn, copies: int, reps: int = 20) -> float:
    """Mean ms per call of ``fn(i)`` over the copies, replayed ``reps`` times from one graph."""
    for i in range(copies):
        fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        for i in range(copies):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps / copies


def sweep_layer(name: str, n: int, k: int, configs: list) -> dict:
    from minisgl_plugin_fp8.gemv import fp8_gemv
    from minisgl_plugin_fp8.method import quantize_rows

    copies = max(2, COPY_BYTES // (n * k))
    x, weights, scale = _inputs(n, k, copies)
    xq, x_scale = quantize_rows(x)
    emulated = (xq.float() * x_scale) @ (weights[0].float() * scale.view(-1, 1)).t()
    timed = []

    def run(config) -> dict:
        try:
            out = fp8_gemv(x, weights[0], scale, config).float()
            distance = ((out - emulated).norm() / emulated.norm()).item()
            ms = time_graph(lambda i, c=config: fp8_gemv(x, weights[i], scale, c), copies)
        except Exception as exc:  # noqa: BLE001 - a configuration the compiler refuses
            return {"config": config._asdict(), "error": f"{type(exc).__name__}: {exc}"[:200]}
        return {"config": config._asdict(), "ms": round(ms, 5), "tbps": round(n * k / ms / 1e9, 3),
                "distance": round(distance, 5), "ok": distance < EMULATION_TOLERANCE}  # fmt: skip

    for config in configs:
        timed.append(run(config))
    good = sorted((t for t in timed if t.get("ok")), key=lambda t: t["ms"])
    # evict-first on the three fastest
    for best in good[:3]:
        config = configs[0]._replace(**best["config"])._replace(evict=True)
        timed.append(run(config))
    good = sorted((t for t in timed if t.get("ok")), key=lambda t: t["ms"])
    picked = timed[0]
    return {"layer": name, "n": n, "k": k, "copies": copies, "picked": picked, "best": good[:6], "timed": good,
            "tried": len(timed), "wrong": [t for t in timed if "ms" in t and not t["ok"]][:3],
            "errors": [t for t in timed if "error" in t][:3]}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default="llama-3.1-8b")
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--wide", action="store_true", help="also tiles of a few whole rows a loop step")
    args = parser.parse_args()
    started = time.perf_counter()
    layers = [layer for shape in args.shapes.split(",") for layer in SHAPES[shape]]
    plans = {(name, n, k): candidates(n, k, args.wide) for name, n, k in layers}
    # compile in parallel: one job per (K, chunk of configurations)
    jobs = []
    for (_, _, k), configs in plans.items():
        for i in range(0, len(configs), 4):
            jobs.append((k, configs[i : i + 4]))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(args.workers) as pool:
        compiled = pool.map(_compile, jobs)
    compile_s = time.perf_counter() - started
    print(
        f"compiled {sum(len(c) for _, c in jobs)} configurations in {compile_s:.1f} s: {set(compiled)}",
        flush=True,
    )
    report = {"device": torch.cuda.get_device_name(), "compile_s": round(compile_s, 1), "layers": []}
    for (name, n, k), configs in plans.items():
        row = sweep_layer(name, n, k, configs)
        report["layers"].append(row)
        best = row["best"][0] if row["best"] else None
        print(f"{name:8s} picked {row['picked'].get('ms')} ms ({row['picked'].get('tbps')} TB/s); best "
              f"{best and best['ms']} ms ({best and best['tbps']} TB/s) {best and best['config']}", flush=True)  # fmt: skip
    picked = sum(r["picked"].get("ms", 0) for r in report["layers"])
    best = sum(r["best"][0]["ms"] for r in report["layers"] if r["best"])
    report["per_layer_ms"] = {"picked": round(picked, 5), "best": round(best, 5)}
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(f"per layer: picked {picked:.4f} ms, best {best:.4f} ms ({report['seconds']} s)")
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
