"""Where a slow step of the offline benchmark spends its host time (GPU machine).

    python3 tools/diag_stall.py MODEL_DIR [--threshold-ms 100] [engine flags as `bench offline`...]

Runs the standard offline workload as `minisgl bench offline` does, timing each engine step's
phases (schedule, launch, complete: waiting for the previous step and processing it) and logging
the one-off events that can stall the host: Python's garbage collections, Triton compiles
(kernel and specialisation) and Dynamo compiles. Prints every step slower than the threshold
with its phases and the events inside it.
"""

from __future__ import annotations

import argparse
import gc
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--threshold-ms", type=float, default=100.0)
    parser.add_argument("--attn", default="fi")
    parser.add_argument("--max-prefill-tokens", type=int, default=8192)
    args = parser.parse_args()

    events: list[tuple[float, float, str]] = []  # (start, seconds, what)

    gc_start: list[float] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_start.append(time.monotonic())
        elif gc_start:
            t0 = gc_start.pop()
            events.append(
                (t0, time.monotonic() - t0, f"gc gen{info['generation']} collected {info['collected']}")
            )

    gc.callbacks.append(on_gc)

    import triton.knobs

    def on_triton_miss(
        *_, **kw
    ) -> None:  # an in-process cache miss: a compile (or a disk-cache load) follows
        events.append((time.monotonic(), 0.0, f"triton compile {str(kw.get('repr'))[:300]}"))

    triton.knobs.runtime.jit_cache_hook = on_triton_miss

    from torch._dynamo import callback as dynamo_callback

    dynamo_callback.on_compile_start(
        lambda *a, **k: events.append((time.monotonic(), 0.0, "dynamo compile start"))
    )

    from minisgl_core.bench import workloads
    from minisgl_core.bench.offline import run_offline
    from minisgl_core.engine import engine as engine_mod
    from minisgl_core.llm import LLM

    steps: list[dict] = []
    original_step = engine_mod.Engine._step
    original_launch = engine_mod.Engine._launch
    original_complete = engine_mod.Engine._complete
    current: dict = {}

    def timed(name, fn):
        def wrapper(self, *a, **k):
            t0 = time.monotonic()
            try:
                return fn(self, *a, **k)
            finally:
                current[name] = current.get(name, 0.0) + time.monotonic() - t0

        return wrapper

    def step(self):
        current.clear()
        t0 = time.monotonic()
        out = original_step(self)
        batch = self.launched_last
        kind = None if batch is None else ("prefill" if batch.forward.is_prefill else "decode")
        steps.append({"t": t0, "dt": time.monotonic() - t0, "kind": kind,
                      "reqs": 0 if batch is None else len(batch.requests), **current})  # fmt: skip
        return out

    engine_mod.Engine._step = step
    engine_mod.Engine._launch = timed("launch", original_launch)
    engine_mod.Engine._complete = timed("complete", original_complete)

    llm = LLM(args.model, attn=args.attn, max_prefill_tokens=args.max_prefill_tokens)
    sched = llm.engine.scheduler
    sched.schedule = timed("schedule", type(sched).schedule).__get__(sched)
    events.clear()
    steps.clear()
    result = run_offline(llm, workloads.standard_offline(256, seed=0))
    torch.cuda.synchronize()
    print("result", result)
    for i, s in enumerate(steps):
        if s["dt"] * 1e3 < args.threshold_ms:
            continue
        phases = " ".join(f"{k}={s[k] * 1e3:.1f}ms" for k in ("schedule", "launch", "complete") if k in s)
        print(f"step {i} {s['kind']} reqs={s['reqs']} dt={s['dt'] * 1e3:.1f}ms {phases}")
        for t, d, what in events:
            if s["t"] <= t <= s["t"] + s["dt"]:
                print(f"    +{(t - s['t']) * 1e3:7.1f}ms {d * 1e3:7.1f}ms {what}")
    print("all events during the run:")
    for _t, d, what in events:
        print(f"  {d * 1e3:7.1f}ms {what}")


if __name__ == "__main__":
    main()
