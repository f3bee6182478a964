"""The symmetric-memory all-reduce against NCCL on 2+ GPUs of one host (run on `nvidia-h200-x2`):

    python3 tools/device_allreduce_check.py [--world 2] [--json out.json]

Each rank fills tensors from its own seed; the fast path (``ParallelContext.all_reduce`` with
``SymmMemAllReduce`` installed) must give bitwise the result of ``torch.distributed.all_reduce``
(NCCL), eagerly and replayed from a CUDA graph with new inputs, for decode-sized
``[batch, 4096]`` bf16 tensors and for shapes it must hand to NCCL (too big, misaligned).
A graph of eight back-to-back all-reduces checks that the wide path's buffer is not overwritten
while a peer still reads it. Then the time per all-reduce inside a CUDA graph of 64 of them (a
Llama-3.1-8B decode step's worth): NCCL, the one-shot kernel alone, and one-shot below
``SymmMemAllReduce.WIDE_MIN_BYTES`` with the wide path above (``symm_mem``; as the engine runs).
The all-reduce fused with the residual add and RMS norm (``SymmMemAllReduce.add_rms_norm``, through
``RMSNorm(partial_of=)``) against NCCL then the norm, bitwise, eagerly and in a graph of chained
layers, with its kernel passing the barrier itself and behind PyTorch's barrier kernel, then both
timed against the two kernels it replaces at every size.
Exit status 0 only when every check passed on every rank.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HIDDEN = 4096


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graph_us(op) -> float:
    """µs per ``op()`` in a CUDA graph of 64 of them (a Llama-3.1-8B decode step's worth of sums),
    after two eager warm-up calls and five replays, over 50 replays."""
    graph = torch.cuda.CUDAGraph()
    for _ in range(2):
        op()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        for _ in range(64):
            op()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(50):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return round(start.elapsed_time(end) * 1000 / (50 * 64), 2)


def rank_main(rank: int, world: int, port: int, out_path: str | None) -> None:
    from minisgl_core.api import ParallelContext
    from minisgl_core.api.parallel import _fast_all_reduce
    from minisgl_core.distributed import enable_fast_all_reduce

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    parallel = ParallelContext(rank, world, dist.group.WORLD)
    installed = enable_fast_all_reduce(parallel, device)
    fast = _fast_all_reduce.get(id(parallel.group))
    failures: list[str] = []
    report: dict = {"installed": installed, "checks": [], "graph_us_per_all_reduce": {}}

    def data(shape: tuple[int, ...], salt: int, dtype=torch.bfloat16) -> torch.Tensor:
        gen = torch.Generator(device=device).manual_seed(1000 * salt + rank)
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    def nccl(x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        dist.all_reduce(y)
        return y

    cases = [((1, HIDDEN), True), ((8, HIDDEN), True), ((64, HIDDEN), True), ((256, HIDDEN), True),
             ((3, 4097), False), ((2048, HIDDEN), False)]  # fmt: skip
    for salt, (shape, should_be_fast) in enumerate(cases):
        x = data(shape, salt)
        expected = nccl(x)
        took = fast(x.clone()) if fast is not None else False
        got = parallel.all_reduce(x)
        same = torch.equal(got, expected)
        report["checks"].append({"shape": list(shape), "fast": bool(took), "bitwise_equal": same})
        if not same:
            failures.append(f"eager {shape}: differs from NCCL")
        if installed and took != should_be_fast:
            failures.append(
                f"eager {shape}: fast path {'taken' if took else 'not taken'}, expected the opposite"
            )
    # Replayed from a CUDA graph, with inputs written into the static tensor after capture.
    for bs in (1, 256):
        static = torch.zeros(bs, HIDDEN, device=device, dtype=torch.bfloat16)
        graph = torch.cuda.CUDAGraph()
        for _ in range(2):  # warm-up outside the graph
            parallel.all_reduce(static)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            parallel.all_reduce(static)
        for salt in range(3):
            x = data((bs, HIDDEN), 50 + salt)
            static.copy_(x)
            graph.replay()
            same = torch.equal(static, nccl(x))
            report["checks"].append({"shape": [bs, HIDDEN], "graph_replay": salt, "bitwise_equal": same})
            if not same:
                failures.append(f"graph replay bs={bs}: differs from NCCL")
    # Back to back in one graph, eight tensors in turn (the wide path reuses its one buffer).
    statics = [
        torch.zeros(256 if i % 2 else 64, HIDDEN, device=device, dtype=torch.bfloat16) for i in range(8)
    ]
    for t in statics:
        parallel.all_reduce(t)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for t in statics:
            parallel.all_reduce(t)
    for salt in range(3):
        inputs = [data(tuple(t.shape), 70 + 8 * salt + i) for i, t in enumerate(statics)]
        for t, x in zip(statics, inputs):
            t.copy_(x)
        graph.replay()
        same = all(torch.equal(t, nccl(x)) for t, x in zip(statics, inputs))
        report["checks"].append({"back_to_back": 8, "graph_replay": salt, "bitwise_equal": same})
        if not same:
            failures.append(f"graph replay of 8 back-to-back all-reduces ({salt}): differs from NCCL")
    # The all-reduce fused with the residual add and RMS norm (RMSNorm(partial_of=), the decoder's
    # o_proj/down sums): bitwise NCCL then the Triton add + norm, eagerly and in a graph of eight
    # chained "layers" (each one's total the next one's residual, the buffers taking turns),
    # replayed with new inputs, with a one-shot all-reduce between the replays.
    from minisgl_core.layers import triton_ops
    from minisgl_core.layers.norm import RMSNorm

    norm = RMSNorm(HIDDEN, 1e-5, dtype=torch.bfloat16, device=device)
    norm.weight.data.copy_(data((HIDDEN,), 300) * 0.1 + 1)  # each rank its own weight: no matter here
    fuse = getattr(fast, "add_rms_norm", None)
    report["fused_norm"] = fuse is not None and bool(getattr(fast, "norm_halves", None))
    report["norm_programs"] = getattr(fast, "norm_programs", None)

    def reference(x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return triton_ops.rms_norm(nccl(x), norm.weight, norm.eps, residual)

    # each twice: the kernel passing the barrier itself (symm_mem_norm_barrier), then behind
    # PyTorch's barrier kernel
    for barrier in (True, False) if fuse is not None and report["fused_norm"] else (False,):
        if fuse is not None:
            fast.norm_barrier = barrier
        for bs in (1, 64, 96, 128, 256, 512, 1024):
            x, residual = data((bs, HIDDEN), 400 + bs), data((bs, HIDDEN), 500 + bs) * 4
            took = fuse is not None and fuse(x.clone(), residual, norm.weight, norm.eps) is not None
            got = norm(x.clone(), residual, partial_of=parallel)
            want = reference(x, residual)
            same = torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
            report["checks"].append(
                {
                    "norm_shape": [bs, HIDDEN],
                    "fused": took,
                    "in_kernel_barrier": barrier,
                    "bitwise_equal": same,
                }
            )
            if not same:
                failures.append(
                    f"fused norm eager bs={bs} (fused={took}, barrier={barrier}): differs from NCCL + norm"
                )
        for bs in (8, 128, 256):
            xs = [torch.zeros(bs, HIDDEN, device=device, dtype=torch.bfloat16) for _ in range(8)]
            res0 = torch.zeros(bs, HIDDEN, device=device, dtype=torch.bfloat16)
            small = torch.zeros(8, HIDDEN, device=device, dtype=torch.bfloat16)

            def chain(xs: list[torch.Tensor], res0: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
                outs, residual = [], res0
                for x in xs:
                    normed, residual = norm(x, residual, partial_of=parallel)
                    outs.append((normed, residual))
                return outs

            chain(xs, res0)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs = chain(xs, res0)
            for salt in range(4):
                inputs = [data((bs, HIDDEN), 600 + 10 * salt + i) for i in range(8)]
                r0 = data((bs, HIDDEN), 700 + salt)
                for t, x in zip(xs, inputs):
                    t.copy_(x)
                res0.copy_(r0)
                graph.replay()
                parallel.all_reduce(small)  # another collective between replays, as the sampler's
                ok, residual = True, r0
                for x, (normed, total) in zip(inputs, outs):
                    want_normed, residual = reference(x, residual)
                    ok = ok and torch.equal(normed, want_normed) and torch.equal(total, residual)
                report["checks"].append(
                    {
                        "norm_chain": [bs, 8],
                        "graph_replay": salt,
                        "in_kernel_barrier": barrier,
                        "bitwise_equal": ok,
                    }
                )
                if not ok:
                    failures.append(
                        f"fused norm graph chain bs={bs} replay {salt} (barrier={barrier}): differs"
                    )
    # µs per sum + add + norm in a graph of 64: the all-reduce then the norm, and fused (at every
    # size, to place NORM_MIN_BYTES)
    if fuse is not None and report["fused_norm"]:
        for label in ("all_reduce_then_norm", "fused_all_sizes", "fused_in_kernel_barrier"):
            saved_min = fast.NORM_MIN_BYTES
            fast.NORM_MIN_BYTES = 1 << 40 if label == "all_reduce_then_norm" else 0
            fast.norm_barrier = label == "fused_in_kernel_barrier"
            saved_max = fast.NORM_BARRIER_MAX_ROWS
            fast.NORM_BARRIER_MAX_ROWS = 1 << 30  # (every size, to place the threshold)
            for bs in (1, 32, 64, 96, 128, 256, 512):
                x, residual = data((bs, HIDDEN), 800), data((bs, HIDDEN), 801)
                us = graph_us(lambda x=x, residual=residual: norm(x, residual, partial_of=parallel))
                report.setdefault("graph_us_per_sum_add_norm", {}).setdefault(label, {})[bs] = us
            fast.NORM_MIN_BYTES = saved_min
            fast.NORM_BARRIER_MAX_ROWS = saved_max
    # Latency inside a graph: 64 all-reduces in a row, like one decode step of Llama-3.1-8B.
    wide = getattr(fast, "wide", False)
    for label, use_fast in (("nccl", False), ("symm_mem_one_shot", True), ("symm_mem", True)):
        if use_fast and not installed:
            continue
        saved = _fast_all_reduce.pop(id(parallel.group), None)
        if use_fast and saved is not None:
            _fast_all_reduce[id(parallel.group)] = saved
            saved.wide = wide and label == "symm_mem"
        for bs in (1, 32, 64, 128, 256):
            static = data((bs, HIDDEN), 99)
            us = graph_us(lambda static=static: parallel.all_reduce(static))
            report["graph_us_per_all_reduce"].setdefault(label, {})[bs] = us
        if saved is not None:
            _fast_all_reduce[id(parallel.group)] = saved
            saved.wide = wide
    report["wide_path"] = wide
    report["failures"] = failures
    flags = torch.tensor([len(failures)], device=device)
    dist.all_reduce(flags)
    if rank == 0:
        print(json.dumps(report, indent=1))
        if out_path:
            with open(out_path, "w") as f:
                json.dump(report, f, indent=1)
    elif failures:
        print(f"rank {rank}: {failures}", file=sys.stderr)
    dist.destroy_process_group()
    if flags.item():
        os._exit(1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--json")
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, args.world, port, args.json)) for r in range(args.world)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(300)
    codes = [proc.exitcode for proc in procs]
    print(f"exit codes {codes}")
    sys.exit(0 if all(c == 0 for c in codes) else 1)


if __name__ == "__main__":
    main()
