"""The bf16 GEMMs of a decode step on the GPU: cuBLAS (torch's default), cuBLASLt (torch's
``preferred_blas_library``) and the engine's Triton kernel (``triton_ops.small_gemm``'s) over a
small sweep of tile sizes and K splits, µs per call replayed from a CUDA graph. Each graph calls
the GEMM over enough copies of the weight that they do not fit in L2 (as in a step, where each
layer's weights come from HBM). (At 38d53d1 the tool carried its own copy of the kernel.)

    cd tools && python3 device_gemm.py [--shapes qwen3-0.6b,llama-3.1-8b] [--rows 1,256] [--l2] [--json OUT.json]

``--l2``: one copy of each weight, so every replay after the first reads it from L2: the floor a
GEMM would have if its weights were prefetched into L2 while the attention before it runs.

Prints one JSON line per (shape, layer, rows): the three timings, the weights' bytes over the
time (TB/s), the best Triton configuration and its largest difference from cuBLAS's output.
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import triton

from minisgl_core.bench.shapes import SHAPES, linear_shapes

#: (N, K) of y = x @ W.T, W [N, K], for each product of a layer and the LM head
LAYERS = {shape: linear_shapes(SHAPES[shape]) for shape in ("qwen3-0.6b", "llama-3.1-8b")}
ROWS = (1, 8, 32, 64, 128, 256)


def triton_mm(
    x: torch.Tensor, w: torch.Tensor, cfg: tuple, out: torch.Tensor, part: torch.Tensor | None
) -> None:
    """The engine's kernels (``minisgl_core.layers._triton_kernels``) at an explicit tile."""
    from minisgl_core.layers._triton_kernels import small_gemm_kernel, split_sum_kernel
    from minisgl_core.layers.triton_ops import small_gemm_k_per_split

    bm, bn, bk, split, warps, stages = cfg
    m, k = x.shape
    n = w.shape[0]
    target = out if split == 1 else part
    small_gemm_kernel[(triton.cdiv(n, bn), triton.cdiv(m, bm), split)](
        x, x.stride(0), w, target, m, n, k, K_PER_SPLIT=small_gemm_k_per_split(k, bk, split),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT=split, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    if split > 1:
        split_sum_kernel[(triton.cdiv(m * n, 1024),)](part, out, m * n, SPLIT=split, BLOCK=1024)


def configs(rows: int) -> list[tuple]:
    bms = [bm for bm in (16, 32, 64, 128) if bm <= max(16, triton.next_power_of_2(rows))][-2:]
    out = []
    for bm, bn, bk, split in itertools.product(bms, (32, 64, 128), (64, 128), (1, 2, 4)):
        warps = 8 if bm * bn >= 128 * 128 else 4
        out.append((bm, bn, bk, split, warps, 4))
    return out


def graph_us(fn, calls: int, reps: int = 20) -> float:
    from device_attention_check import cuda_time_us

    fn(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    return cuda_time_us(graph.replay, iters=reps) / calls


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="qwen3-0.6b,llama-3.1-8b")
    p.add_argument("--rows", default=",".join(map(str, ROWS)))
    p.add_argument(
        "--l2",
        action="store_true",
        help="one copy of each weight, resident in L2 after the first call "
        "(the floor of a GEMM whose weights were prefetched), instead of enough copies to miss L2",
    )
    p.add_argument("--json")
    args = p.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    results = []
    for shape in args.shapes.split(","):
        for layer, (n, k) in LAYERS[shape].items():
            wbytes = n * k * 2
            copies = 1 if args.l2 else max(1, min(32, -(-4 * l2 // wbytes)))
            # calls per graph: 32 with --l2 (all on the one copy), else one per copy
            calls = 32 if args.l2 else copies
            ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
            for rows in map(int, args.rows.split(",")):
                x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
                out = torch.empty(rows, n, device=dev, dtype=torch.bfloat16)
                row = {
                    "shape": shape,
                    "layer": layer,
                    "rows": rows,
                    "n": n,
                    "k": k,
                    "copies": copies,
                    "l2": args.l2,
                }
                for lib in ("cublas", "cublaslt"):
                    torch.backends.cuda.preferred_blas_library(lib)
                    us = graph_us(
                        lambda i, x=x, ws=ws, out=out: torch.matmul(x, ws[i % len(ws)].t(), out=out), calls
                    )
                    row[lib] = round(us, 2)
                torch.backends.cuda.preferred_blas_library("cublas")
                ref = x @ ws[0].t()
                best = None
                for cfg in configs(rows):
                    part = (
                        torch.empty(cfg[3], rows, n, device=dev, dtype=torch.float32) if cfg[3] > 1 else None
                    )
                    try:
                        us = graph_us(
                            lambda i, cfg=cfg, part=part, x=x, ws=ws, out=out: triton_mm(
                                x, ws[i % len(ws)], cfg, out, part
                            ),
                            calls,
                        )
                    except Exception as exc:  # noqa: BLE001 (out of shared memory for a large tile)
                        print(json.dumps({"skip": cfg, "error": type(exc).__name__}), flush=True)
                        continue
                    if best is None or us < best[0]:
                        triton_mm(x, ws[0], cfg, out, part)
                        best = (us, cfg, float((out.float() - ref.float()).abs().max()))
                if best is not None:
                    row["triton"] = round(best[0], 2)
                    row["triton_cfg"] = best[1]
                    row["triton_maxdiff"] = best[2]
                for key in ("cublas", "cublaslt", "triton"):
                    if key in row:
                        row[f"{key}_TBps"] = round(wbytes / row[key] / 1e6, 2)
                print(json.dumps(row), flush=True)
                results.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
