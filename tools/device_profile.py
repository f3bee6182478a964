"""Where the GPU time of a run goes. Run on the GPU machine (see ../shared/device/README.md):

    python tools/device_profile.py attn              # decode kernel variants, one layer, µs
    python tools/device_profile.py small             # the same at batch 1-64, page 16
    python tools/device_profile.py kv                # decode over a bf16 vs an fp8 KV pool, µs
    python tools/device_profile.py gemv              # batch-1 GEMMs, cuBLAS vs cuBLASLt, µs
    python tools/device_profile.py steps MODEL_DIR [--quantization fp8]   # standard offline workload, step by step
    python tools/device_profile.py steps MODEL_DIR --workload shared-prefix --max-running 128 [--disable-cascade] [--cache naive]
    python tools/device_profile.py steps MODEL_DIR --cprofile [--trace OUT.json]   # + host phases, Chrome trace
    python tools/device_profile.py steps MODEL_DIR --workload shared-prefix --max-running 128 --mixed --profile-kind mixed
    python tools/device_profile.py b1 MODEL_DIR [--quantization fp8] [--trace OUT.json]   # batch-1 decode, kernel table

``steps`` drives one Engine over the standard workload, times every step on the host (with
overlap on, a step's host time is the device time of the step before it once the device is the
bottleneck), sums them by kind and batch size, and profiles a window of decode steps with
``torch.profiler`` (kernel table sorted by device time; ``--trace`` writes that window as a Chrome
trace). ``--profile-kind decode|prefill|mixed`` profiles instead the first ``--window`` steps of
that kind from step ``--window-start`` on, each step alone and waited for (their kernels summed
into one table: where a mixed step's time goes); ``--mixed`` turns mixed steps on (off by
default on CUDA). ``--cprofile`` runs the host phases of every step (schedule, prepare, launch, sampling;
sampling's count includes its no-op calls) under cProfile, prefill and decode steps apart, and
prints each phase's top functions. ``b1`` does the same for a single
request's decode steps. Tables go to stdout; JSON summaries to --json.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from functools import partial

import torch


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _activities() -> list:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


def _table(prof, rows: int = 28) -> str:
    for key in ("self_device_time_total", "self_cuda_time_total"):
        try:
            return prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=70)
        except (AttributeError, KeyError, RuntimeError):
            continue
    return prof.key_averages().table(row_limit=rows)


def _device_events(prof):
    """(name, calls, device µs) of each kernel and copy the profile saw. Host-side events are left
    out: an operator's (``aten::copy_``) "self device time" is that of the kernels it launched,
    which are rows of their own, so summing both counted an eager copy twice (0.5 ms of a
    Qwen3-0.6B prefill step's 18.1 in the forty-third session's table)."""
    cpu = torch.autograd.DeviceType.CPU
    for e in prof.key_averages():
        if getattr(e, "device_type", None) == cpu:
            continue
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = getattr(e, "self_cuda_time_total", 0.0)
        if t > 0:
            yield e.key, e.count, t


def _device_us(prof) -> float:
    return sum(t for _, _, t in _device_events(prof))


def _graph_us(fn, reps: int = 20) -> float:
    """Device µs of one ``fn()`` replayed from a CUDA graph of ``reps`` calls (launch gaps included)."""
    from device_attention_check import cuda_time_us

    fn()
    _sync()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    return cuda_time_us(graph.replay, iters=10) / reps


def _paged_decode_problem(dev, qo: int, kv: int, bs: int, ctx: int, page: int):
    """``bs`` sequences of ``ctx`` tokens in a bf16 pool of ``page``-token pages in random order:
    (cache [2, pages, page, kv, 128], page indices, indptr, last page lengths, q [bs, qo, 128])."""
    pages_per = (ctx + page - 1) // page
    num_pages = bs * pages_per + 1
    cache = torch.randn(2, num_pages, page, kv, 128, dtype=torch.bfloat16, device=dev)
    indices = torch.randperm(num_pages - 1, device=dev)[: bs * pages_per].int()
    indptr = torch.arange(0, bs + 1, dtype=torch.int32) * pages_per
    last = torch.full((bs,), ctx - (pages_per - 1) * page, dtype=torch.int32)
    q = torch.randn(bs, qo, 128, dtype=torch.bfloat16, device=dev)
    return cache, indices, indptr, last, q


def _graph_decode_us(ws, qo: int, kv: int, bs: int, ctx: int, page: int, tc: bool, no_split: bool,
                     kv_dtype: torch.dtype = torch.bfloat16) -> float:  # fmt: skip
    """One layer's decode attention as the engine replays it (graph-mode wrapper, random page order), µs."""
    import flashinfer

    dev = ws.device
    cache, indices, indptr, last, q = _paged_decode_problem(dev, qo, kv, bs, ctx, page)
    cache = cache.to(kv_dtype)
    bufs = (torch.zeros(bs + 1, dtype=torch.int32, device=dev), torch.zeros(indices.numel(), dtype=torch.int32, device=dev),
            torch.ones(bs, dtype=torch.int32, device=dev))  # fmt: skip
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        ws, "NHD", use_tensor_cores=tc, backend="fa2", use_cuda_graph=True, paged_kv_indptr_buffer=bufs[0],
        paged_kv_indices_buffer=bufs[1], paged_kv_last_page_len_buffer=bufs[2])  # fmt: skip
    extra = {"disable_split_kv": True} if no_split else {}
    w.plan(indptr, indices, last, qo, kv, 128, page, q_data_type=torch.bfloat16,
           kv_data_type=kv_dtype, sm_scale=128**-0.5, **extra)  # fmt: skip
    return _graph_us(partial(w.run, q, (cache[0], cache[1])))


def small(args: argparse.Namespace) -> dict:
    """Small-batch decode attention at page 16 (graph replay): which kernel for batch 1-16."""
    out = {}
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    for qo, kv in ((16, 8), (32, 8)):
        for bs in (1, 4, 16, 64):
            for ctx in (256, 1024, 4096):
                for tc, no_split in ((True, False), (True, True), (False, False)):
                    us = _graph_decode_us(ws, qo, kv, bs, ctx, 16, tc, no_split)
                    key = f"qo{qo}/kv{kv} bs{bs} ctx{ctx} tc={tc} no_split={no_split}"
                    out[key] = {"us": round(us, 2)}
                    print(f"{key:50s} {us:8.2f} us", flush=True)
    return out


def attn(args: argparse.Namespace) -> dict:
    import flashinfer
    from device_attention_check import cuda_time_us  # tools/ is on sys.path when run as a script

    out = {}
    dev = torch.device("cuda")
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=dev)
    for qo, kv in ((16, 8), (32, 8)):
        for bs, ctx in ((256, 800), (64, 1024), (1, 200)):
            for page in (1, 16):
                cache, indices, indptr, last, q = _paged_decode_problem(dev, qo, kv, bs, ctx, page)
                for tc in (True, False):
                    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                        ws, "NHD", use_tensor_cores=tc, backend="fa2"
                    )
                    w.plan(indptr, indices, last, qo, kv, 128, page, q_data_type=torch.bfloat16,
                           kv_data_type=torch.bfloat16, sm_scale=128**-0.5)  # fmt: skip
                    us = cuda_time_us(partial(w.run, q, (cache[0], cache[1])), iters=100)
                    tbps = 2 * bs * ctx * kv * 128 * 2 / (us * 1e-6) / 1e12
                    key = f"qo{qo}/kv{kv} bs{bs} ctx{ctx} page{page} tc={tc}"
                    out[key] = {"us": round(us, 1), "TB/s": round(tbps, 2)}
                    print(f"{key:45s} {us:8.1f} us  {tbps:5.2f} TB/s", flush=True)
    # graph mode, as the engine runs decode: tensor cores with and without split-KV, CUDA cores
    for qo, kv in ((16, 8), (32, 8)):
        for bs, ctx in ((256, 800), (32, 1500), (1, 200)):
            for tc, no_split in ((True, False), (True, True), (False, False)):
                us = _graph_decode_us(ws, qo, kv, bs, ctx, 1, tc, no_split)
                tbps = 2 * bs * ctx * kv * 128 * 2 / (us * 1e-6) / 1e12
                key = f"graph qo{qo}/kv{kv} bs{bs} ctx{ctx} tc={tc} no_split={no_split}"
                out[key] = {"us": round(us, 1), "TB/s": round(tbps, 2)}
                print(f"{key:55s} {us:8.1f} us  {tbps:5.2f} TB/s", flush=True)
    return out


def kv(args: argparse.Namespace) -> dict:
    """Decode attention over a bf16 vs an fp8 (e4m3) KV pool, graph mode, as the engine runs it."""
    out = {}
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    for qo, kvh in ((16, 8), (32, 8)):
        for bs, ctx in ((256, 800), (32, 1500), (1, 200)):
            for page in (1, 16):
                for kv_dtype in (torch.bfloat16, torch.float8_e4m3fn):
                    for tc in (True, False):
                        key = f"qo{qo}/kv{kvh} bs{bs} ctx{ctx} page{page} {str(kv_dtype)[6:]} tc={tc}"
                        try:
                            us = _graph_decode_us(ws, qo, kvh, bs, ctx, page, tc, False, kv_dtype)
                        except Exception as exc:  # an unsupported combination: say so, go on
                            out[key] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                            print(f"{key:60s} ERROR {out[key]['error']}", flush=True)
                            continue
                        nbytes = 2 * bs * ctx * kvh * 128 * torch.empty((), dtype=kv_dtype).element_size()
                        out[key] = {"us": round(us, 1), "TB/s": round(nbytes / (us * 1e-6) / 1e12, 2)}
                        print(f"{key:60s} {us:8.1f} us  {out[key]['TB/s']:5.2f} TB/s", flush=True)
    return out


def gemv(args: argparse.Namespace) -> dict:
    """Batch-1 (and small-batch) GEMMs of Llama-3.1-8B's shapes, cuBLAS vs cuBLASLt, graph mode."""
    out = {}
    dev = torch.device("cuda")
    shapes = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
              "lm_head": (128256, 4096)}  # fmt: skip
    for lib in ("cublas", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(lib)
        for m in (1, 8):
            for name, (n, k) in shapes.items():
                w = torch.randn(n, k, dtype=torch.bfloat16, device=dev) * 0.02
                x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
                us = _graph_us(partial(torch.nn.functional.linear, x, w))
                key = f"{lib} m{m} {name}"
                out[key] = {"us": round(us, 1), "TB/s": round(w.numel() * 2 / (us * 1e-6) / 1e12, 2)}
                print(f"{key:30s} {us:8.1f} us  {out[key]['TB/s']:5.2f} TB/s", flush=True)
    torch.backends.cuda.preferred_blas_library("cublas")
    return out


def _engine(model: str, attn_name: str, **options):
    from minisgl_core.llm import LLM

    return LLM(model, attn=attn_name, **options)


def steps(args: argparse.Namespace) -> dict:
    from minisgl_core.bench.workloads import shared_prefix, standard_offline
    from minisgl_core.sampling import SamplingParams

    llm = _engine(
        args.model,
        args.attn,
        cache=args.cache,
        max_running_requests=args.max_running,
        cascade=not args.disable_cascade,
        mixed_batch=True if args.mixed else None,
        **({"quantization": args.quantization} if args.quantization else {}),
    )
    engine = llm.engine
    runner = engine.runner
    seen: list[tuple[str, int]] = []  # (kind, batch size) of every batch prepared
    cascade_steps: list[int] = []  # groups per cascade decode step
    prepare = runner.prepare  # the engine runs prepare(batch)() (plan, then launch), not forward

    def recording_prepare(batch):
        seen.append((_kind(batch), batch.batch_size))
        if batch.shared_prefixes is not None:
            cascade_steps.append(len(batch.shared_prefixes))
        return prepare(batch)

    runner.prepare = recording_prepare
    # warm-up
    llm.generate([[1, 2, 3, 4]] * 4, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    seen.clear()
    host = _HostProfiles(engine) if args.cprofile else None
    vocab = runner.vocab_size  # the demo model (CPU smoke test) has a small vocabulary
    workload = standard_offline(args.num_requests, seed=0) if args.workload == "standard" else shared_prefix()
    for i, r in enumerate(workload):
        prompt = [t % vocab for t in r.prompt_ids]
        engine.add_request(
            10_000 + i, prompt, SamplingParams(temperature=0.6, max_tokens=r.max_tokens, ignore_eos=True)
        )
    records: list[tuple[str, int, float]] = []
    window = (args.window_start, args.window_start + args.window)
    prof = None
    by_kind = _KindProfiles(args.profile_kind, args.window) if args.profile_kind else None
    _sync()
    begin = last = time.perf_counter()
    n = 0
    while engine.has_work:
        if n == window[0] and by_kind is None:
            prof = torch.profiler.profile(activities=_activities())
            prof.__enter__()
            pstart = time.perf_counter()
        before = len(seen)
        if by_kind is not None and n >= window[0]:
            by_kind.step(engine, seen)
        else:
            engine.step()
        now = time.perf_counter()
        kind = seen[before] if len(seen) > before else ("idle", 0)
        records.append((kind[0], kind[1], now - last))
        last = now
        n += 1
        if n == window[1] and prof is not None:
            _sync()
            pwall = time.perf_counter() - pstart
            prof.__exit__(None, None, None)
            last = time.perf_counter()
    total = time.perf_counter() - begin
    buckets: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for kind, bs, dt in records:
        key = (
            kind
            if kind != "decode"
            else f"decode bs<= {next(b for b in (8, 32, 64, 128, 192, 256, 10**9) if bs <= b)}"
        )

        buckets[key][0] += 1
        buckets[key][1] += dt
    output_tokens = sum(r.max_tokens for r in workload)
    summary = {"total_s": round(total, 3), "steps": len(records), "output_tok_per_s": round(output_tokens / total, 1),
               "cascade_steps": len(cascade_steps),
               "groups_per_cascade_step": round(sum(cascade_steps) / max(len(cascade_steps), 1), 1),
               "buckets": {k: {"steps": v[0], "s": round(v[1], 3), "ms_per_step": round(v[1] / v[0] * 1e3, 3)}
                           for k, v in sorted(buckets.items())}}  # fmt: skip
    print(json.dumps(summary, indent=1))
    if prof is not None:
        dev_us = _device_us(prof)
        summary["window"] = {"steps": args.window, "wall_ms": round(pwall * 1e3, 2),
                             "device_busy_ms": round(dev_us / 1e3, 2),
                             "batch_sizes": sorted({bs for _, bs, _ in records[window[0]:window[1]]})}  # fmt: skip
        print(json.dumps(summary["window"]))
        print(_table(prof))
        if args.trace:
            prof.export_chrome_trace(args.trace)
    if by_kind is not None:
        summary["profiled"] = by_kind.report()
    if host is not None:
        host.report()
    llm.close()
    return summary


def _kind(batch) -> str:
    """decode, prefill, or mixed (a prefill batch whose first rows are decode rows: one new token
    after a KV of more than one)."""
    if not batch.is_prefill:
        return "decode"
    first_new, first_len = batch.extend_lens_cpu[0], batch.seq_lens_cpu[0]
    return "mixed" if first_new == 1 and first_len > 1 and batch.batch_size > 1 else "prefill"


class _KindProfiles:
    """``torch.profiler`` around single steps, each waited for, keeping those of one kind until
    ``wanted`` are kept; their kernels are summed into one table (device µs per step)."""

    def __init__(self, kind: str, wanted: int) -> None:
        self.kind, self.wanted = kind, wanted
        self.kept: list[tuple[int, float]] = []  # (batch size, device µs) per kept step
        self.kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])  # name: [calls, µs]

    def step(self, engine, seen: list[tuple[str, int]]) -> None:
        if len(self.kept) >= self.wanted:
            engine.step()
            return
        _sync()
        before = len(seen)
        with torch.profiler.profile(activities=_activities()) as prof:
            engine.step()
            _sync()
        if len(seen) == before or seen[before][0] != self.kind:
            return
        for key, count, t in _device_events(prof):
            self.kernels[key][0] += count
            self.kernels[key][1] += t
        self.kept.append((seen[before][1], _device_us(prof)))

    def report(self) -> dict:
        steps = max(len(self.kept), 1)
        device_ms = sum(us for _, us in self.kept) / steps / 1e3
        print(f"{len(self.kept)} {self.kind} steps profiled alone (batch sizes "
              f"{sorted(bs for bs, _ in self.kept)}): device {device_ms:.2f} ms per step")  # fmt: skip
        print(f"{'kernel':<80} {'calls/step':>10} {'ms/step':>9}")
        top = sorted(self.kernels.items(), key=lambda kv: -kv[1][1])[:30]
        for name, (calls, us) in top:
            print(f"{name[:80]:<80} {calls / steps:>10.1f} {us / steps / 1e3:>9.3f}")
        return {"kind": self.kind, "steps": len(self.kept), "device_ms_per_step": round(device_ms, 3),
                "kernels_ms_per_step": {n: round(us / steps / 1e3, 4) for n, (_, us) in top}}  # fmt: skip


class _HostProfiles:
    """cProfile of the host phases of a step (schedule, prepare + launch, sampling), kept apart
    for prefill and decode steps: which Python lines a step's host time goes to."""

    def __init__(self, engine) -> None:
        self.stats: dict[tuple[str, str], object] = {}
        self.calls: dict[tuple[str, str], int] = defaultdict(int)
        self.kind = "decode"
        scheduler, runner = engine.scheduler, engine.runner
        schedule, prepare, sample = scheduler.schedule, runner.prepare, engine._sample

        def profiled(fn, *a):
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
            try:
                return prof, fn(*a)
            finally:
                prof.disable()

        def keep(phase, prof) -> None:
            import pstats

            key = (self.kind, phase)
            self.calls[key] += 1
            if key in self.stats:
                self.stats[key].add(prof)
            else:
                self.stats[key] = pstats.Stats(prof)

        def on_schedule():
            prof, batch = profiled(schedule)
            if batch is not None:  # a step's kind is known once it is scheduled
                self.kind = "decode" if getattr(batch, "kind", "decode") == "decode" else "prefill"
            keep("schedule", prof)
            return batch

        def on_prepare(batch):
            prof, run = profiled(prepare, batch)
            keep("forward", prof)

            def launch():
                prof, out = profiled(run)
                keep("launch", prof)
                return out

            return launch

        def on_sample(launched):
            prof, out = profiled(sample, launched)
            keep("sample", prof)
            return out

        scheduler.schedule = on_schedule
        runner.prepare = on_prepare
        engine._sample = on_sample

    def report(self, rows: int = 22) -> None:
        import io

        for (kind, phase), stats in sorted(self.stats.items()):
            calls = self.calls[(kind, phase)]
            out = io.StringIO()
            stats.stream = out
            print(
                f"=== {kind} {phase}: {calls} calls, {stats.total_tt * 1e3 / calls:.3f} ms each (under cProfile)"
            )
            stats.sort_stats("tottime").print_stats(rows)
            print("\n".join(line for line in out.getvalue().splitlines()[4:] if line.strip()))


def b1(args: argparse.Namespace) -> dict:
    from minisgl_core.sampling import SamplingParams

    llm = _engine(args.model, args.attn, **({"quantization": args.quantization} if args.quantization else {}))
    prompt = list(range(100, 228))
    greedy = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    llm.generate([prompt], greedy, use_tqdm=False)
    _sync()
    steps = 64
    with torch.profiler.profile(activities=_activities()) as prof:
        start = time.perf_counter()
        llm.generate(
            [prompt], SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True), use_tqdm=False
        )
        _sync()
        wall = time.perf_counter() - start
    summary = {
        "steps": steps,
        "wall_ms": round(wall * 1e3, 2),
        "device_busy_ms": round(_device_us(prof) / 1e3, 2),
        "kernels": sorted(([k, n, round(t, 1)] for k, n, t in _device_events(prof)), key=lambda r: -r[2]),
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "kernels"}))
    print(_table(prof, 40))
    if args.trace:
        prof.export_chrome_trace(args.trace)
    llm.close()
    return summary


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["attn", "small", "kv", "gemv", "steps", "b1"])
    p.add_argument("model", nargs="?")
    p.add_argument("--attn", default="fi")
    p.add_argument("--window-start", type=int, default=120)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--workload", choices=["standard", "shared-prefix"], default="standard")
    p.add_argument("--max-running", type=int, default=256)
    p.add_argument("--disable-cascade", action="store_true")
    p.add_argument("--cache", default="radix")
    p.add_argument("--json")
    p.add_argument("--quantization", help="steps, b1: a --quantization method (fp8, ...)")
    p.add_argument("--cprofile", action="store_true", help="steps: cProfile the host phases by step kind")
    p.add_argument("--trace", help="steps, b1: write the profiled window as a Chrome trace here")
    p.add_argument("--mixed", action="store_true", help="steps: mixed prefill + decode steps on")
    p.add_argument(
        "--profile-kind",
        choices=["decode", "prefill", "mixed"],
        help="steps: profile the first --window steps of this kind from --window-start on, each alone",
    )
    args = p.parse_args()
    result = {"attn": attn, "small": small, "kv": kv, "gemv": gemv, "steps": steps, "b1": b1}[args.what](args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
