"""Where a decode step's device time goes, from a Chrome trace of ``torch.profiler`` (CPU only).

    python tools/trace_steps.py TRACE.json[.gz] [--marker argmax] [--skip 10] [--steps 50] [--show 40]

Reads the trace that ``tools/device_profile.py b1 ... --trace`` (or ``steps --trace``) writes,
keeps the GPU events (kernels, copies, memsets) in start order and cuts them into steps after each
event whose name contains ``--marker`` (the sampler's argmax kernel ends every decode step). Over
``--steps`` steps after the first ``--skip``, prints per kernel name: calls a step, device µs a
step and the idle µs before it (negative where a kernel launched with programmatic dependent
launch starts before the one before it ends: its time then includes its wait), then the step
period, and the first ``--show`` events of one step with their start, length and gap."""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict


def load_events(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    kinds = ("kernel", "gpu_memcpy", "gpu_memset")
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in kinds]
    return sorted(events, key=lambda e: e["ts"])


def split_steps(events: list[dict], marker: str) -> list[list[dict]]:
    """The events cut after each one whose name contains ``marker`` (a trailing part is dropped)."""
    steps, current = [], []
    for e in events:
        current.append(e)
        if marker in e["name"]:
            steps.append(current)
            current = []
    return steps


def summarize(steps: list[list[dict]], skip: int, count: int) -> dict:
    """Per kernel name (first 60 characters): calls, device µs and idle µs before it, each per
    step, over ``steps[skip:skip + count]``; and the mean step period (start to next start)."""
    window = steps[skip : skip + count + 1]
    if len(window) < 2:
        raise ValueError(f"{len(steps)} steps in the trace: not enough after skipping {skip}")
    measured = window[:-1]
    rows: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for step in measured:
        previous = None
        for e in step:
            row = rows[e["name"][:60]]
            row[0] += 1
            row[1] += e["dur"]
            if previous is not None:
                row[2] += e["ts"] - (previous["ts"] + previous["dur"])
            previous = e
    n = len(measured)
    period = (window[-1][0]["ts"] - window[0][0]["ts"]) / n
    table = {
        name: {"calls": calls / n, "us": us / n, "idle_before_us": idle / n}
        for name, (calls, us, idle) in sorted(rows.items(), key=lambda kv: -kv[1][1])
    }
    return {"steps": n, "period_us": period, "kernels": table}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--marker", default="argmax", help="a name part of the last event of every step")
    p.add_argument("--skip", type=int, default=10)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--show", type=int, default=0, help="list this many events of the step after --skip")
    args = p.parse_args()
    steps = split_steps(load_events(args.trace), args.marker)
    s = summarize(steps, args.skip, args.steps)
    busy = sum(r["us"] for r in s["kernels"].values())
    idle = sum(r["idle_before_us"] for r in s["kernels"].values())
    print(f"{len(steps)} steps; over {s['steps']}: period {s['period_us']:.1f} µs, device busy {busy:.1f}, "
          f"idle between events {idle:.1f}")  # fmt: skip
    print(f"{'kernel':60s} {'calls':>6s} {'µs':>8s} {'idle':>7s} {'µs/call':>8s}")
    for name, r in s["kernels"].items():
        print(
            f"{name:60s} {r['calls']:6.1f} {r['us']:8.1f} {r['idle_before_us']:7.1f} {r['us'] / r['calls']:8.2f}"
        )
    if args.show:
        step = steps[args.skip]
        t0, previous = step[0]["ts"], None
        for e in step[: args.show]:
            gap = e["ts"] - (previous["ts"] + previous["dur"]) if previous else 0.0
            print(f"{e['ts'] - t0:9.1f} +{e['dur']:7.2f} gap {gap:6.2f}  {e['name'][:70]}")
            previous = e


if __name__ == "__main__":
    main()
