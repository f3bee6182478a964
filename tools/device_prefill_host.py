"""Where the host time of a serving-sized prefill step goes (issue 19, mixed batches).

The H100 serve run of 2026-11-25 spent 27 ms of host time in ``forward`` for a prefill step of
≈ 580 tokens (35 ms in a mixed one), where the device needs a few ms. This drives one Engine the
way a server does: requests decoding, a new one arriving every few steps with a prompt of a new
length, and times every step's forward (``runner.prepare(batch)()``: plan, then launch) on the
host; every other prefill (and mixed) forward runs under cProfile, and a window of them under
``torch.profiler`` for the device side.

    python3 tools/device_prefill_host.py MODEL_DIR [--attn fi] [--mixed] [--piecewise N] [--json OUT.json]
    python3 tools/device_prefill_host.py --probe-gemm    # host µs of one F.linear: M repeated vs new

Prints the host ms of decode and prefill forwards (mean, median; the prefill forwards under a
profiler apart), cProfile's top functions of every other prefill forward by cumulative and by own
time, and the torch profiler's tables for prefill forwards 8-12. Runs on the CPU too
(``--device cpu --attn torch``, the model ``demo``) as a smoke test.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import random
import statistics
import time

import torch


def probe_gemm() -> dict:
    """Host time of one bf16 ``F.linear`` ([M, 1024] x [3072, 1024]ᵀ, small enough that the device
    keeps up): the same M every call, then a new M every call (as prefill steps have)."""
    import torch.nn.functional as F

    w = torch.randn(3072, 1024, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)  # up to 2,047 rows below
    result = {"default_blas": str(torch.backends.cuda.preferred_blas_library())}
    for lib, start in (("cublas", 400), ("cublaslt", 1000), ("default", 1600)):
        if lib != "default":
            torch.backends.cuda.preferred_blas_library(lib)
        else:
            torch.backends.cuda.preferred_blas_library(result["default_blas"].split(".")[-1].lower())
        for name, sizes in (("same_m", [start] * 300), ("new_m", list(range(start + 1, start + 301)))):
            F.linear(x[:64], w)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for m in sizes:
                F.linear(x[:m], w)
            host = time.perf_counter() - t
            torch.cuda.synchronize()
            result[f"{lib}_{name}_host_us"] = round(host / len(sizes) * 1e6, 1)
            result[f"{lib}_{name}_wall_us"] = round((time.perf_counter() - t) / len(sizes) * 1e6, 1)
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?")
    p.add_argument("--probe-gemm", action="store_true")
    p.add_argument("--attn", default="fi")
    p.add_argument("--device", default=None)
    p.add_argument("--mixed", action="store_true", help="mixed prefill + decode steps on")
    p.add_argument("--running", type=int, default=32, help="requests decoding throughout")
    p.add_argument("--arrivals", type=int, default=40, help="requests arriving one by one")
    p.add_argument("--every", type=int, default=4, help="steps between arrivals")
    p.add_argument(
        "--piecewise", type=int, default=None, help="--piecewise-cuda-graph-max-tokens (0: prefill eager)"
    )
    p.add_argument("--json")
    args = p.parse_args()
    if args.probe_gemm:
        print(json.dumps(probe_gemm()))
        return

    from minisgl_core.llm import LLM
    from minisgl_core.sampling import SamplingParams

    options = {"mixed_batch": args.mixed}
    if args.piecewise is not None:
        options["piecewise_cuda_graph_max_tokens"] = args.piecewise
    if args.device:
        options["device"] = args.device
    llm = LLM(args.model, attn=args.attn, **options)
    engine, runner = llm.engine, llm.engine.runner
    vocab = runner.vocab_size
    rng = random.Random(0)
    params = SamplingParams(temperature=0.6, max_tokens=400, ignore_eos=True)
    # warm-up: every compile and JIT outside the measurement, prompts of a few lengths
    llm.generate([[rng.randrange(vocab) for _ in range(n)] for n in (5, 77, 300, 513)],
                 SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)  # fmt: skip

    prepare = runner.prepare  # the engine calls prepare(batch)() (plan, then launch)
    records: list[tuple[str, int, float]] = []
    prof = cProfile.Profile()
    torch_prof = None
    finished: list = []  # the torch profiler once its window of prefill forwards is over
    prefills = 0

    def timed_prepare(batch):
        nonlocal prefills, torch_prof
        lens = batch.extend_lens_cpu
        mixed = len(lens) > 1 and 1 in lens  # decode rows ride along (one token each)
        kind = "decode" if not batch.is_prefill else ("mixed" if mixed else "prefill")
        profiled = False
        if kind != "decode":
            prefills += 1
            # every other prefill forward under cProfile (which slows the host), the rest timed
            # plain; the torch profiler's window (forwards 8-12) is left out of the plain times
            profiled = prefills % 2 == 1 or 8 <= prefills <= 12
            if prefills == 8 and torch.cuda.is_available():
                torch_prof = torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
                )
                torch_prof.__enter__()
        if profiled:
            prof.enable()
        t = time.perf_counter()
        run = prepare(batch)
        planned = time.perf_counter() - t
        if profiled:
            prof.disable()

        def timed_run():
            nonlocal torch_prof
            if profiled:
                prof.enable()
            t = time.perf_counter()
            out = run()
            records.append(
                (kind + (" (profiled)" if profiled else ""), sum(lens), planned, time.perf_counter() - t)
            )
            if profiled:
                prof.disable()
                if prefills == 12 and torch_prof is not None:
                    torch.cuda.synchronize()
                    torch_prof.__exit__(None, None, None)
                    finished.append(torch_prof)
                    torch_prof = None
            return out

        return timed_run

    runner.prepare = timed_prepare
    rid = 0
    for _ in range(args.running):
        n = rng.randint(100, 1024)
        engine.add_request(rid, [rng.randrange(vocab) for _ in range(n)], params)
        rid += 1
    step = 0
    arrived = 0
    while engine.has_work:
        if step >= 20 and step % args.every == 0 and arrived < args.arrivals:
            n = rng.randint(100, 1024)
            engine.add_request(rid, [rng.randrange(vocab) for _ in range(n)], params)
            rid += 1
            arrived += 1
        engine.step()
        step += 1
    llm.close()

    summary: dict = {}
    for kind in ("decode", "prefill", "mixed", "prefill (profiled)", "mixed (profiled)"):
        rows = [r for r in records if r[0] == kind]
        if rows:
            ms = [(p + r) * 1e3 for _, _, p, r in rows]
            toks = [n for _, n, _, _ in rows]
            summary[kind] = {"forwards": len(ms), "host_ms_mean": round(statistics.mean(ms), 3),
                             "host_ms_median": round(statistics.median(ms), 3), "host_ms_max": round(max(ms), 3),
                             "prepare_ms_mean": round(statistics.mean(p * 1e3 for _, _, p, _ in rows), 3),
                             "tokens_mean": round(statistics.mean(toks), 1)}  # fmt: skip
    print(json.dumps(summary, indent=1))
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("cumulative").print_stats(45)
    stats.sort_stats("tottime").print_stats(30)
    print(text.getvalue())
    for done in finished:
        print(
            done.key_averages().table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=70)
        )
        print(
            done.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70)
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
