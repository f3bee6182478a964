"""The symmetric-memory all-reduce against NCCL on 2+ GPUs of one host (run on `nvidia-h200-x2`):

    python3 tools/device_allreduce_check.py [--world 2] [--json out.json]

Each rank fills tensors from its own seed; the fast path (``ParallelContext.all_reduce`` with
``SymmMemAllReduce`` installed) must give bitwise the result of ``torch.distributed.all_reduce``
(NCCL), eagerly and replayed from a CUDA graph with new inputs, for decode-sized
``[batch, 4096]`` bf16 tensors and for shapes it must hand to NCCL (too big, misaligned).
A graph of eight back-to-back all-reduces checks that the wide path's buffer is not overwritten
while a peer still reads it. Then the time per all-reduce inside a CUDA graph of 64 of them (a
Llama-3.1-8B decode step's worth): NCCL, the one-shot kernel alone, and one-shot below
``SymmMemAllReduce.WIDE_MIN_BYTES`` with the wide path above (``symm_mem``; as the engine runs). Exit status 0 only when every check passed on every rank.
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
            graph = torch.cuda.CUDAGraph()
            for _ in range(2):
                parallel.all_reduce(static)
            torch.cuda.synchronize()
            with torch.cuda.graph(graph):
                for _ in range(64):
                    parallel.all_reduce(static)
            for _ in range(5):
                graph.replay()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(50):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            report["graph_us_per_all_reduce"].setdefault(label, {})[bs] = round(
                start.elapsed_time(end) * 1000 / (50 * 64), 2
            )
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
