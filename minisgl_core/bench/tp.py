"""Offline runs with tensor parallelism: one process per rank, each driving its own Engine with
the same requests in the same order (the server's scheduler processes do the same)."""

from __future__ import annotations

import os
import queue as queue_module
import time
import traceback
from collections.abc import Iterable
from typing import Any

from minisgl_core.bench.workloads import BenchRequest


def drive(
    engine,
    requests: list[BenchRequest],
    temperature: float,
    first_rid: int = 0,
    max_tokens: int | None = None,
    progress: Any = None,
) -> int:
    """Submit everything, step until done; returns the number of output tokens. ``max_tokens``
    overrides the requests' own (a short warm-up); ``progress.update(n)`` hears of each finished
    request."""
    from minisgl_core.sampling import SamplingParams

    for i, r in enumerate(requests):
        params = SamplingParams(
            temperature=temperature, max_tokens=max_tokens or r.max_tokens, ignore_eos=True
        )
        # admitted here, the edge of this path, as LLM.generate does: the engine trusts it
        engine.add_request(first_rid + i, r.prompt_ids, engine.admit(r.prompt_ids, params))
    tokens = 0
    while engine.has_work:
        outs = engine.step()
        tokens += sum(1 for out in outs if out.token_id >= 0)
        if progress is not None:
            progress.update(sum(1 for out in outs if out.finished))
    return tokens


def _rank_main(
    rank: int, world: int, port: int, config, requests, temperature, queue, disable=(), progress_every=None
) -> None:
    import torch
    import torch.distributed as dist

    from minisgl_core.api import ParallelContext
    from minisgl_core.distributed import join_parent_store, leave_parent_store_group
    from minisgl_core.engine.engine import Engine
    from minisgl_core.plugins import Plugins

    backend = "nccl" if config.resolve_device().type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    try:
        join_parent_store(backend, rank, world, port)  # the store is run_offline_tp's
        started = time.perf_counter()
        engine = Engine(config, ParallelContext(rank, world, dist.group.WORLD), Plugins.load(disable=disable))
        init = time.perf_counter() - started
        started = time.perf_counter()
        drive(engine, requests[:4], temperature, first_rid=10**6, max_tokens=8)  # warm-up, as run_offline's
        dist.barrier()
        warmup = time.perf_counter() - started
        progress = None
        if rank == 0 and progress_every is not None:  # (rank 0 speaks for all: they step together)
            from minisgl_core.bench.offline import ProgressLines, announce_timed_run

            announce_timed_run(requests, progress_every)
            progress = ProgressLines(len(requests), progress_every)
        start = time.perf_counter()
        try:
            tokens = drive(engine, requests, temperature, progress=progress)
        finally:
            if progress is not None:
                progress.close()
        elapsed = time.perf_counter() - start
        if rank == 0:  # what the engine ran with, as the tp_size 1 run reports it
            facts = {
                "attn": ",".join(engine.runner.attn_names),
                "overlap": engine.overlap,  # (speculation turns it off)
                "page_size": engine.config.page_size,
                "init_seconds": round(init, 1),
                "warmup_seconds": round(warmup, 1),
            }
            # the speculative counters: SpecStats, None without speculation
            stats = engine.verify.speculator.stats if engine.verify is not None else None
            queue.put(("ok", tokens, elapsed, facts, stats))
    except BaseException:
        queue.put(("error", rank, traceback.format_exc()))
        raise
    finally:
        engine = None  # (the frame's reference: see leave_parent_store_group)
        leave_parent_store_group()


def run_offline_tp(
    config,
    requests: list[BenchRequest],
    temperature: float = 0.6,
    disable_plugins: Iterable[str] = (),
    progress_every: float | None = None,
) -> dict[str, Any]:
    """``progress_every``: rank 0 prints a line to stderr this often (seconds) during the timed run,
    as ``run_offline`` does; None: nothing."""
    import torch.multiprocessing as mp

    from minisgl_core.distributed import parent_store

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    store = parent_store(config.tp_size)  # (kept until the ranks are done)
    port = store.port
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(
                r,
                config.tp_size,
                port,
                config,
                requests,
                temperature,
                queue,
                tuple(disable_plugins),
                progress_every,
            ),  # fmt: skip
        )
        for r in range(config.tp_size)
    ]
    for p in procs:
        p.start()
    try:
        while True:
            try:
                message = queue.get(timeout=1.0)
                break
            except queue_module.Empty:
                dead = [r for r, p in enumerate(procs) if not p.is_alive() and p.exitcode != 0]
                if dead:
                    raise RuntimeError(
                        f"TP rank {dead[0]} exited with code {procs[dead[0]].exitcode}"
                    ) from None
        if message[0] == "error":
            raise RuntimeError(f"TP rank {message[1]} failed:\n{message[2]}")
        _, tokens, elapsed, facts, spec_stats = message
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():  # a rank stuck in a collective its failed peer never joins
                p.kill()
    result: dict[str, Any] = {
        "requests": len(requests),
        "prompt_tokens": sum(len(r.prompt_ids) for r in requests),
        "output_tokens": tokens,
        "seconds": round(elapsed, 3),
        "output_tok_per_s": round(tokens / elapsed, 1),
        **facts,
    }
    if spec_stats is not None:  # rank 0's SpecStats (every rank accepts the same tokens)
        result["speculative"] = spec_stats
    return result
