"""How fast this GPU streams memory in practice: the roof the decode attention's ≈ 4.25 TB/s is
measured against (issue 19). The H200's spec says 4.8 TB/s; the bounds in BENCHMARKS.md use it.

Three kernels over one buffer far larger than L2, each replayed from a CUDA graph, best of
several replays:

- ``read``: a Triton kernel that loads the buffer in wide blocks and keeps one sum per program
  (the loads cannot be dropped: the sums are written), a pure read as the decode kernel's KV loads;
- ``torch-sum``: ``torch.sum`` over the buffer (float32 accumulation), torch's own reduction;
- ``copy``: ``dst.copy_(src)``, counted as read + write bytes.

``--patterns``: the same bytes read tile by tile in the strided order a grouped GEMM's weights and a
decode program's KV pages are read today, against each tile stored contiguously (``PATTERNS``).

    python3 tools/device_read_bw.py [--gib 4] [--patterns] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import functools
import itertools
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


@triton.jit
def _tiles_kernel(
    src, sums, row_stride, step_stride, program_stride, head_stride, STEPS: tl.constexpr,
    ROWS: tl.constexpr, CHUNK: tl.constexpr, HEADS: tl.constexpr,
):  # fmt: skip
    """Program (h, p) reads ``STEPS`` tiles of ``ROWS`` rows of ``CHUNK`` bytes, rows
    ``row_stride`` apart, tiles ``step_stride`` apart, from ``p * program_stride + h * head_stride``."""
    h, p = tl.program_id(0), tl.program_id(1)
    base = p.to(tl.int64) * program_stride + h * head_stride
    offs = tl.arange(0, ROWS)[:, None] * row_stride + tl.arange(0, CHUNK)[None, :]
    acc = tl.zeros([ROWS, CHUNK], dtype=tl.int32)
    for s in range(STEPS):
        acc += tl.load(src + base + s * step_stride + offs).to(tl.int32)
    tl.store(sums + p * HEADS + h, tl.sum(acc))


#: the access patterns ``--patterns`` times, each as (name, rows, chunk bytes, row stride, step
#: stride, steps, heads, head stride, program stride): the same bytes read tile by tile, strided as
#: the kernels read them today or contiguous. ``moe``: a grouped GEMM program's 64 weight rows of a
#: 2,048-byte row (e4m3, K = 2,048), 128 bytes of each a step; ``moe-packed``: the same 128 KB
#: stored tile after tile. ``kv-nhd``: a decode program's pages of 16 positions of one of 8 KV
#: heads (256 bytes a position, bf16 x 128), 43 pages a sequence; ``kv-hnd``: each head's page
#: contiguous.
PATTERNS = [
    ("moe", 64, 128, 2048, 128, 16, 1, 0, 64 * 2048),
    ("moe-packed", 64, 128, 128, 64 * 128, 16, 1, 0, 64 * 2048),
    ("kv-nhd", 16, 256, 8 * 256, 16 * 8 * 256, 43, 8, 256, 43 * 16 * 8 * 256),
    ("kv-hnd", 16, 256, 256, 16 * 8 * 256, 43, 8, 16 * 256, 43 * 16 * 8 * 256),
]


def _patterns(gib: float) -> list[dict]:
    """Each of :data:`PATTERNS` over ``gib`` GiB, at 4 and 8 warps and 2-4 stages: TB/s."""
    nbytes = int(gib * 2**30)
    src = torch.randint(0, 4, (nbytes,), device="cuda", dtype=torch.uint8)
    rows = []
    for name, r, chunk, row_stride, step_stride, steps, heads, head_stride, program_stride in PATTERNS:
        programs = nbytes // program_stride
        sums = torch.empty(programs * heads, device="cuda", dtype=torch.int32)
        for warps, stages in itertools.product((4, 8), (2, 3, 4)):
            run = functools.partial(
                _tiles_kernel[(heads, programs)], src, sums, row_stride, step_stride, program_stride,
                head_stride, STEPS=steps, ROWS=r, CHUNK=chunk, HEADS=heads, num_warps=warps, num_stages=stages,
            )  # fmt: skip
            seconds = _timed(run)
            read = programs * program_stride
            assert sums.sum().item() == src[:read].sum(dtype=torch.int64).item()  # every byte once
            rows.append({"pattern": name, "warps": warps, "stages": stages,
                         "tb_s": round(read / seconds / 1e12, 3)})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    return rows


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
    parser.add_argument("--patterns", action="store_true", help="strided tile reads against contiguous ones")
    args = parser.parse_args()
    if args.patterns:
        rows = _patterns(args.gib)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)
        return
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
