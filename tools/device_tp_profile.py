"""Where a tensor-parallel decode step's time goes, rank by rank. Run on the 2-GPU machine:

    python3 tools/device_tp_profile.py /tmp/m/llama-3.1-8b --attn fi --tp 2 [--windows 150 800] [--json F]
    python3 tools/device_tp_profile.py /tmp/m/llama-3.1-8b --attn fi --tp 1     # the same windows at TP=1

Every rank drives its own Engine over the standard offline workload (as ``bench offline --tp``
does), times each step on the host, and profiles ``--window`` steps from each of ``--windows``
with ``torch.profiler``. Per window and rank it prints the wall time, the device time by kernel
family (GEMMs, attention, all-reduce, gather/broadcast, sampler, the rest) and rank 0's kernel
table, so a TP=2 step can be laid beside half a TP=1 step. With overlap on, a step's host time
is the device time of the step before it once the device is the bottleneck.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(__file__))

#: kernel families by name, first match wins
FAMILIES = (
    (
        "all-reduce (symm-mem)",
        re.compile(r"one_shot|two_shot|symm|multimem|sum_add_rms_norm|barrier_kernel", re.I),
    ),
    ("nccl", re.compile(r"nccl", re.I)),
    ("sampler", re.compile(r"gumbel|argmax|_chunk_max", re.I)),
    (
        "attention",
        re.compile(
            r"flashinfer|BatchDecode|BatchPrefill|Attention|merge_state|fmha|decode_kernel|merge_kernel|prefix_kernel",
            re.I,
        ),
    ),
    ("gemm", re.compile(r"gemm|nvjet|sm90_xmma|cutlass|cublas|splitK|Kernel2", re.I)),
    ("copy/cat", re.compile(r"copy|cat|Memcpy|Memset|elementwise_kernel_with_index|index", re.I)),
)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _activity():
    cuda = torch.cuda.is_available()
    return torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU


def _family(name: str) -> str:
    for family, pattern in FAMILIES:
        if pattern.search(name):
            return family
    return "other"


def _kernels(prof) -> list[tuple[str, float, int]]:
    out = []
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = getattr(e, "self_cuda_time_total", 0.0)
        if not torch.cuda.is_available():  # CPU smoke test: operators stand in for kernels
            t = e.self_cpu_time_total
        if t > 0:
            out.append((e.key, t, e.count))
    return out


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, queue) -> None:
    import torch.distributed as dist

    from minisgl_core.api import ParallelContext
    from minisgl_core.bench.workloads import standard_offline
    from minisgl_core.config_args import engine_config_from_args
    from minisgl_core.engine.engine import Engine
    from minisgl_core.sampling import SamplingParams

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank)
    group = None
    if world > 1:
        store = dist.TCPStore("127.0.0.1", port, is_master=False)
        dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank, world_size=world)
        group = dist.group.WORLD
    config = engine_config_from_args(args)
    engine = Engine(config, ParallelContext(rank, world, group))

    def submit(requests, first, max_tokens=None):
        for i, r in enumerate(requests):
            params = SamplingParams(temperature=0.6, max_tokens=max_tokens or r.max_tokens, ignore_eos=True)
            engine.add_request(first + i, r.prompt_ids, engine.admit(r.prompt_ids, params))

    vocab = engine.runner.vocab_size  # a small test model's vocabulary on the CPU
    cap = args.max_tokens or 10**9
    workload = [
        r._replace(prompt_ids=[t % vocab for t in r.prompt_ids], max_tokens=min(r.max_tokens, cap))
        for r in standard_offline(args.num_requests, seed=0)
    ]
    submit(workload[:4], 10**6, max_tokens=8)
    while engine.has_work:
        engine.step()
    if world > 1:
        dist.barrier()
    submit(workload, 0)
    windows = {w: w + args.window for w in args.windows}
    steps: list[tuple[int, float]] = []  # (requests running when the step began, host seconds)
    report: dict = {"rank": rank, "windows": []}
    prof = None
    n = 0
    _sync()
    begin = last = time.perf_counter()
    while engine.has_work:
        if n in windows:
            end, running = windows[n], len(engine.scheduler.running)
            prof = torch.profiler.profile(activities=[_activity()])
            prof.__enter__()
            pstart = time.perf_counter()
        running_now = len(engine.scheduler.running)
        engine.step()
        now = time.perf_counter()
        steps.append((running_now, now - last))
        last = now
        n += 1
        if prof is not None and n == end:
            _sync()
            wall = time.perf_counter() - pstart
            prof.__exit__(None, None, None)
            kernels = _kernels(prof)
            families: dict[str, float] = defaultdict(float)
            for name, us, _ in kernels:
                families[_family(name)] += us
            top = sorted(kernels, key=lambda k: -k[1])[:30]
            report["windows"].append({
                "start": end - args.window, "steps": args.window, "running": running,
                "wall_ms_per_step": round(wall * 1e3 / args.window, 3),
                "device_ms_per_step": round(sum(families.values()) / 1e3 / args.window, 3),
                "families_ms_per_step": {k: round(v / 1e3 / args.window, 3) for k, v in sorted(families.items())},
                "top_kernels_us_per_step": [(name[:90], round(us / args.window, 1), c // args.window) for name, us, c in top],
            })  # fmt: skip
            prof = None
            last = time.perf_counter()
    report["total_s"] = round(time.perf_counter() - begin, 3)
    report["steps"] = [(running, round(dt * 1e3, 3)) for running, dt in steps]
    queue.put(report)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def main() -> None:
    import torch.distributed as dist
    import torch.multiprocessing as mp

    from minisgl_core.config_args import add_engine_args

    p = argparse.ArgumentParser()
    p.add_argument("model")
    add_engine_args(p)
    p.add_argument("--windows", type=int, nargs="+", default=[150, 800])
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=0, help="cap each request's output (CPU smoke test)")
    p.add_argument("--json")
    args = p.parse_args()
    world = args.tp_size
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = 0
    store = None
    if world > 1:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        port = store.port
    procs = [ctx.Process(target=_rank, args=(r, world, port, args, queue)) for r in range(world)]
    for proc in procs:
        proc.start()
    reports = sorted((queue.get(timeout=900) for _ in procs), key=lambda r: r["rank"])
    for proc in procs:
        proc.join(timeout=30)
        if proc.is_alive():  # a rank stuck tearing down NCCL (seen once at TP=2): its report is in
            proc.kill()
    for r in reports:
        print(f"== TP={world} rank {r['rank']}: {r['total_s']} s for the workload")
        buckets: dict[int, list[float]] = defaultdict(list)
        for running, ms in r["steps"]:
            buckets[next(b for b in (8, 32, 64, 128, 192, 256, 10**9) if running <= b)].append(ms)
        print(
            "   ms/step by requests running (<=):",
            {b: round(sum(v) / len(v), 2) for b, v in sorted(buckets.items())},
        )
        for w in r["windows"]:
            print(json.dumps({k: v for k, v in w.items() if k != "top_kernels_us_per_step"}))
            if r["rank"] == 0:
                for name, us, count in w["top_kernels_us_per_step"]:
                    print(f"   {us:9.1f} us/step  x{count:<4d} {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tp": world, "reports": reports}, f)


if __name__ == "__main__":
    main()
