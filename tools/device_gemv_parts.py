"""Where a one-token FP8 GEMV's time goes (issue 19: FP8 batch-1 decode).

``minisgl_plugin_fp8.gemv`` reads its Llama-3.1-8B weights at 2.5-3.9 TB/s from HBM
(``tools/device_gemv_sweep.py``), and o_proj was no faster when L2 held its weight: the kernel is
not waiting on memory alone. Per weight byte a program converts e4m3 to float32 and multiplies,
and every program re-rounds its slice of the token's row to e4m3 each loop step (about ten
arithmetic instructions an element, shared by the tile's 8-16 rows). This tool times, for each
shape, on ``pick_config``'s tile and grid with every weight read from HBM (the graph rotates over
enough copies to miss L2, as the sweep does), the plugin's kernel beside kernels doing less of
that work:

- ``plugin``: ``fp8_gemv`` as it is;
- ``xq_in``: the token's row handed in already rounded to e4m3 with its scale (what a norm or
  SiLU kernel writing the quantized row would give): no scale pass, no rounding;
- ``no_x``: the weights converted and summed, the token ignored (a wrong result: the conversion's
  and the loads' cost only);
- ``bytes``: the weights loaded as 32-bit words and XOR-folded (a wrong result: the loads only, the
  floor of this grid);
- ``tc``: the product on tensor cores (``tl.dot`` of the e4m3 weight tile and the rounded row;
  float32 sums outside the MMA each block), 64-row tiles, K split to fill the GPU (the splits'
  sum not included).

Every variant that computes the product is checked against the plugin's float32 emulation.
``--bytes-tiles`` then times the loads alone (``bytes``) over other tiles and warps, and a plain
stream over the weight's bytes (``stream``: each program a run of contiguous 16-byte loads, one
run a loop step): what each way of reading the same bytes allows. ``--xq-tiles`` times ``xq_in``
over the same tiles (warps, in-thread sums): the product once the row's work is off the weight
stream, what a norm or SiLU kernel writing the rounded row would allow.

    python3 tools/device_gemv_parts.py [--shapes llama-3.1-8b,qwen3-0.6b] [--bytes-tiles] [--xq-tiles]
        [--skip-parts] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from device_gemv_sweep import COPY_BYTES, EMULATION_TOLERANCE, SHAPES, _inputs, time_graph  # noqa: E402


@triton.jit
def parts_kernel(
    x,  # [K]: bf16 (MODE 2 / 3 ignore it) or e4m3 already rounded (MODE 0)
    x_scale,  # [1] float32 (MODE 0)
    w,  # [N, K] e4m3
    w_scale,  # [N] float32
    out,  # [SPLIT_K, N] float32
    N,
    K,
    K_PER_SPLIT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ACC_R: tl.constexpr,
    MODE: tl.constexpr,  # 0 xq_in, 1 no_x, 2 bytes
):
    split = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    if MODE == 2:
        words: tl.constexpr = BLOCK_K // 4
        wcols = split * (K_PER_SPLIT // 4) + tl.arange(0, words)
        w32 = w.to(tl.pointer_type(tl.int32))
        ptrs = w32 + rows[:, None].to(tl.int64) * (K // 4) + wcols[None, :]
        fold = tl.zeros((BLOCK_N, words), dtype=tl.int32)
        for step in range(0, K_PER_SPLIT // 4, words):
            ok = row_ok[:, None] & (wcols[None, :] + step < K // 4)
            fold ^= tl.load(ptrs + step, mask=ok, other=0, eviction_policy="evict_first")
        result = tl.xor_sum(fold, axis=1).to(tl.float32)
    else:
        cols = split * K_PER_SPLIT + tl.arange(0, BLOCK_K)
        ptrs = w + rows[:, None].to(tl.int64) * K + cols[None, :]
        acc = tl.zeros((BLOCK_N, BLOCK_K // ACC_R), dtype=tl.float32)
        for step in range(0, K_PER_SPLIT, BLOCK_K):
            ok = cols[None, :] + step < K
            wk = tl.load(ptrs + step, mask=row_ok[:, None] & ok, other=0.0, eviction_policy="evict_first")
            products = wk.to(tl.float32)
            if MODE == 0:
                products = products * tl.load(x + cols[None, :] + step, mask=ok, other=0.0).to(tl.float32)
            acc += tl.sum(tl.reshape(products, (BLOCK_N, BLOCK_K // ACC_R, ACC_R)), axis=2)
        result = tl.sum(acc, axis=1) * tl.load(w_scale + rows, mask=row_ok, other=0.0)
        if MODE == 0:
            result = result * tl.load(x_scale)
    tl.store(out + split.to(tl.int64) * N + rows, result, mask=row_ok)


@triton.jit
def tc_kernel(
    xq,  # [K] e4m3, rounded
    x_scale,  # [1] float32
    w,  # [N, K] e4m3
    w_scale,  # [N]
    out,  # [SPLIT_K, N] float32
    N,
    K,
    K_PER_SPLIT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    split = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    cols = split * K_PER_SPLIT + tl.arange(0, BLOCK_K)
    ptrs = w + rows[:, None].to(tl.int64) * K + cols[None, :]
    acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    for step in range(0, K_PER_SPLIT, BLOCK_K):
        ok = cols + step < K
        wk = tl.load(
            ptrs + step, mask=row_ok[:, None] & ok[None, :], other=0.0, eviction_policy="evict_first"
        )
        xk = tl.load(xq + cols + step, mask=ok, other=0.0)
        xb = tl.broadcast_to(xk[:, None], (BLOCK_K, 16))
        acc += tl.dot(wk, xb, out_dtype=tl.float32)  # every column the same product
    result = tl.max(acc, axis=1) * tl.load(w_scale + rows, mask=row_ok, other=0.0) * tl.load(x_scale)
    tl.store(out + split.to(tl.int64) * N + rows, result, mask=row_ok)


@triton.jit
def stream_kernel(src, sums, words, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * BLOCK * STEPS
    fold = tl.zeros([BLOCK], dtype=tl.int32)
    for i in range(STEPS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        fold ^= tl.load(src + offs, mask=offs < words, other=0, eviction_policy="evict_first")
    tl.store(sums + tl.program_id(0), tl.xor_sum(fold, axis=0))


BYTES_TILES = [
    (1, 4096),
    (2, 4096),
    (4, 4096),
    (2, 8192),
    (4, 2048),
    (8, 2048),
    (8, 1024),
    (16, 512),
    (16, 1024),
]


def load_floors(name: str, n: int, k: int) -> list[dict]:
    """The loads alone over ``BYTES_TILES`` x warps, and the plain stream over the same bytes."""
    copies = max(2, COPY_BYTES // (n * k))
    _, weights, scale = _inputs(n, k, copies)
    rows = []
    part = torch.empty(n, device="cuda", dtype=torch.float32)
    for (block_n, block_k), warps in itertools.product(BYTES_TILES, (4, 8)):
        if block_k > triton.next_power_of_2(k):
            continue

        def run(i, block_n=block_n, block_k=block_k, warps=warps):
            parts_kernel[(triton.cdiv(n, block_n), 1)](
                part, scale, weights[i], scale, part, n, k, K_PER_SPLIT=triton.cdiv(k, block_k) * block_k,
                BLOCK_N=block_n, BLOCK_K=block_k, ACC_R=1, MODE=2, num_warps=warps, num_stages=2,
            )  # fmt: skip
            return part

        ms = time_graph(run, copies)
        rows.append({"layer": name, "kind": "bytes", "block_n": block_n, "block_k": block_k, "warps": warps,
                     "ms": round(ms, 5), "tbps": round(n * k / ms / 1e9, 3)})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    words = n * k // 4
    for block, steps, warps in itertools.product((1024, 2048), (1, 2, 4, 8), (4, 8)):
        grid = triton.cdiv(words, block * steps)
        sums = torch.empty(grid, device="cuda", dtype=torch.int32)

        def run_stream(i, block=block, steps=steps, warps=warps, grid=grid, sums=sums):
            stream_kernel[(grid,)](weights[i].view(torch.int32), sums, words, BLOCK=block, STEPS=steps,
                                   num_warps=warps)  # fmt: skip
            return sums

        ms = time_graph(run_stream, copies)
        rows.append({"layer": name, "kind": "stream", "block_bytes": 4 * block, "steps": steps, "warps": warps,
                     "programs": grid, "ms": round(ms, 5), "tbps": round(n * k / ms / 1e9, 3)})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def rounded_row_tiles(name: str, n: int, k: int) -> list[dict]:
    """``xq_in`` (the row handed in rounded, with its scale: no scale pass, no rounding in the
    kernel) over ``BYTES_TILES`` x warps x in-thread sums: how close to the loads' floor the
    product comes once the row's work is off the weight stream. Checked against the emulation."""
    from minisgl_plugin_fp8.method import quantize_rows

    copies = max(2, COPY_BYTES // (n * k))
    x, weights, scale = _inputs(n, k, copies)
    xq2, xs2 = quantize_rows(x)
    xq, xs = xq2.view(-1).contiguous(), xs2.view(-1).float().contiguous()
    emulated = ((xq.float() * xs) @ (weights[0].float() * scale.view(-1, 1)).t()).view(-1)
    part = torch.empty(1, n, device="cuda", dtype=torch.float32)
    rows = []
    for (block_n, block_k), warps, acc_r in itertools.product(BYTES_TILES, (4, 8), (1, 8)):
        if block_k > triton.next_power_of_2(k):
            continue

        def run(i, block_n=block_n, block_k=block_k, warps=warps, acc_r=acc_r):
            parts_kernel[(triton.cdiv(n, block_n), 1)](
                xq, xs, weights[i], scale, part, n, k, K_PER_SPLIT=triton.cdiv(k, block_k) * block_k,
                BLOCK_N=block_n, BLOCK_K=block_k, ACC_R=acc_r, MODE=0, num_warps=warps, num_stages=2,
            )  # fmt: skip
            return part

        distance = ((run(0).view(-1) - emulated).norm() / emulated.norm()).item()
        ms = time_graph(run, copies)
        rows.append({"layer": name, "kind": "xq_in", "block_n": block_n, "block_k": block_k, "warps": warps,
                     "acc_r": acc_r, "ms": round(ms, 5), "tbps": round(n * k / ms / 1e9, 3),
                     "ok": distance < EMULATION_TOLERANCE})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _split_for(n: int, k: int, block_n: int, block_k: int, sm: int) -> int:
    split = 1
    while split < 8 and triton.cdiv(n, block_n) * split < 2 * sm and k >= 2 * split * 2 * block_k:
        split *= 2
    return split


def layer(name: str, n: int, k: int) -> dict:
    from minisgl_plugin_fp8.gemv import fp8_gemv, pick_config
    from minisgl_plugin_fp8.method import quantize_rows

    sm = torch.cuda.get_device_properties(0).multi_processor_count
    copies = max(2, COPY_BYTES // (n * k))
    x, weights, scale = _inputs(n, k, copies)
    xq2, xs2 = quantize_rows(x)
    xq, xs = xq2.view(-1).contiguous(), xs2.view(-1).float().contiguous()
    emulated = ((xq.float() * xs) @ (weights[0].float() * scale.view(-1, 1)).t()).view(-1)
    config = pick_config(n, k, sm)
    row = {"layer": name, "n": n, "k": k, "copies": copies, "config": config._asdict()}

    def record(key, fn, checked: bool, split: int, **extra):
        try:
            got = fn(0)
            if got.dim() == 2:
                got = got.sum(0)
            distance = ((got.float() - emulated).norm() / emulated.norm()).item()
            ms = time_graph(fn, copies)
        except Exception as exc:  # noqa: BLE001 - a variant the compiler refuses
            row[key] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            print(f"{name:8s} {key:8s} error {row[key]['error']}", flush=True)
            return
        entry = {"ms": round(ms, 5), "tbps": round(n * k / ms / 1e9, 3), "split": split, **extra}
        if checked:
            entry["distance"] = round(distance, 6)
            entry["ok"] = distance < EMULATION_TOLERANCE
        row[key] = entry
        print(f"{name:8s} {key:8s} {entry}", flush=True)

    record("plugin", lambda i: fp8_gemv(x, weights[i], scale, config).view(-1), True, config.split_k)
    k_per = triton.cdiv(triton.cdiv(k, config.split_k), config.block_k) * config.block_k
    for key, mode, src in (("xq_in", 0, xq), ("no_x", 1, x), ("bytes", 2, x)):
        part = torch.empty(config.split_k, n, device="cuda", dtype=torch.float32)

        def run(i, mode=mode, src=src, part=part):
            parts_kernel[(triton.cdiv(n, config.block_n), config.split_k)](
                src, xs, weights[i], scale, part, n, k, K_PER_SPLIT=k_per, BLOCK_N=config.block_n,
                BLOCK_K=config.block_k, ACC_R=config.acc_r, MODE=mode, num_warps=config.num_warps,
                num_stages=config.num_stages,
            )  # fmt: skip
            return part

        record(key, run, mode == 0, config.split_k)
    for block_n, block_k, warps in ((64, 256, 4), (64, 512, 4), (64, 256, 8), (128, 256, 8)):
        split = _split_for(n, k, block_n, block_k, sm)
        per = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
        part = torch.empty(split, n, device="cuda", dtype=torch.float32)

        def run_tc(i, block_n=block_n, block_k=block_k, warps=warps, split=split, per=per, part=part):
            tc_kernel[(triton.cdiv(n, block_n), split)](
                xq, xs, weights[i], scale, part, n, k, K_PER_SPLIT=per, BLOCK_N=block_n, BLOCK_K=block_k,
                num_warps=warps, num_stages=3,
            )  # fmt: skip
            return part

        record(f"tc{block_n}x{block_k}w{warps}", run_tc, True, split)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="llama-3.1-8b,qwen3-0.6b")
    parser.add_argument("--bytes-tiles", action="store_true")
    parser.add_argument("--xq-tiles", action="store_true", help="the row handed in rounded, over tiles")
    parser.add_argument("--skip-parts", action="store_true", help="only the --bytes-tiles / --xq-tiles rows")
    parser.add_argument("--json")
    args = parser.parse_args()
    report = {"device": torch.cuda.get_device_name(), "layers": [], "floors": []}
    if args.bytes_tiles:
        for shape in args.shapes.split(","):
            for name, n, k in SHAPES[shape]:
                floors = load_floors(name, n, k)
                report["floors"] += floors
                best = {kind: min((r for r in floors if r["kind"] == kind), key=lambda r: r["ms"]) for kind in
                        ("bytes", "stream")}  # fmt: skip
                print(f"{shape} {name}: fastest {json.dumps(best)}", flush=True)
    if args.xq_tiles:
        for shape in args.shapes.split(","):
            rows = [row for name, n, k in SHAPES[shape] for row in rounded_row_tiles(name, n, k)]
            report["floors"] += rows
            best = {}
            for row in rows:
                if row["ok"] and (row["layer"] not in best or row["ms"] < best[row["layer"]]["ms"]):
                    best[row["layer"]] = row
            print(f"{shape} row handed in rounded, fastest: {json.dumps(best)}", flush=True)
            print(f"{shape}: µs a layer {round(sum(r['ms'] for r in best.values()) * 1e3, 2)}", flush=True)
    if args.skip_parts:
        args.shapes = ""
    for shape in filter(None, args.shapes.split(",")):
        for name, n, k in SHAPES[shape]:
            row = layer(name, n, k)
            row["shape"] = shape
            report["layers"].append(row)
    for shape in filter(None, args.shapes.split(",")):
        rows = [r for r in report["layers"] if r["shape"] == shape]
        keys = [key for key in rows[0] if isinstance(rows[0][key], dict) and key != "config"]
        sums = {key: round(sum(r[key].get("ms", float("nan")) for r in rows) * 1e3, 2) for key in keys}
        report[f"layer_us_{shape}"] = sums
        print(f"{shape}: µs a layer {sums}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
