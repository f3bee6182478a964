"""How fast this GPU streams memory in practice: the roof the decode attention's ≈ 4.25 TB/s is
measured against (issue 19). The H200's spec says 4.8 TB/s; the bounds in BENCHMARKS.md use it.

Three kernels over one buffer far larger than L2, each replayed from a CUDA graph, best of
several replays:

- ``read``: a Triton kernel that loads the buffer in wide blocks and keeps one sum per program
  (the loads cannot be dropped: the sums are written), a pure read as the decode kernel's KV loads;
- ``torch-sum``: ``torch.sum`` over the buffer (float32 accumulation), torch's own reduction;
- ``copy``: ``dst.copy_(src)``, counted as read + write bytes.

    python3 tools/device_read_bw.py [--gib 4] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl


@triton.jit
def _read_kernel(src, sums, n, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * BLOCK * STEPS
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(STEPS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(src + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(sums + pid, tl.sum(acc, axis=0))


def _timed(fn, replays: int = 10) -> float:
    """Seconds per call: the best of ``replays`` replays of a graph of 5 calls."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(5):
            fn()
    best = float("inf")
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / 5)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--json")
    args = parser.parse_args()
    n = int(args.gib * 2**30) // 2
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    rows = []
    for block, steps, warps in [(4096, 8, 8), (8192, 8, 8), (8192, 16, 16), (16384, 4, 16), (2048, 32, 4)]:
        grid = triton.cdiv(n, block * steps)
        sums = torch.empty(grid, device="cuda", dtype=torch.float32)

        def run(block=block, steps=steps, warps=warps, grid=grid, sums=sums) -> None:
            _read_kernel[(grid,)](src, sums, n, BLOCK=block, STEPS=steps, num_warps=warps)

        seconds = _timed(run)
        rows.append({"kernel": "read", "block": block, "steps": steps, "warps": warps,
                     "tb_s": round(n * 2 / seconds / 1e12, 3)})  # fmt: skip
        check = sums.sum().item()
        assert abs(check - src.sum(dtype=torch.float32).item()) <= 1e-2 * n**0.5, check  # every load counted
    seconds = _timed(lambda: src.sum(dtype=torch.float32))
    rows.append({"kernel": "torch-sum", "tb_s": round(n * 2 / seconds / 1e12, 3)})
    dst = torch.empty_like(src)
    seconds = _timed(lambda: dst.copy_(src))
    rows.append({"kernel": "copy", "tb_s": round(2 * n * 2 / seconds / 1e12, 3)})
    info = {"device": torch.cuda.get_device_name(0), "bytes": n * 2, "rows": rows}
    for row in rows:
        print(json.dumps(row))
    print("best read:", max(r["tb_s"] for r in rows if r["kernel"] == "read"), "TB/s on", info["device"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
