"""Read a serving run step by step: the scheduler's step trace, and the client's request trace.

    MINISGL_STEP_TRACE=/tmp/steps.jsonl minisgl serve ...          # the server writes the steps
    minisgl bench serve ... --trace /tmp/requests.jsonl             # the client writes the requests
    python tools/step_trace.py /tmp/steps.jsonl [--requests /tmp/requests.jsonl] [--bucket 0.5]

Prints where the scheduler's wall time went (prefill steps, decode steps by batch size, idle
between steps), the decode steps that stalled (5x their batch bucket's median or more, with their
host phases: a kernel compiled mid-run shows there), a timeline in buckets (share of prefill, decode and idle; mean running requests;
arrivals), and with the request trace the client's view (time to first chunk, split into the
wait before the request's prefill began on the server and the rest). Both traces use the
monotonic clock, so they line up when client and server run on one machine.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import io
import json
import math
import zlib
from collections import defaultdict


class TraceError(Exception):
    """A trace this tool cannot read: the message names the file and what is wrong."""


#: what a busy step's record (one with a ``kind``) holds besides ``t`` and ``dt``
STEP_FIELDS = ("reqs", "tokens", "running")
#: fields a record may leave None (a request that got no chunk has no ``first``)
MAY_BE_NONE = frozenset({"first"})


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load(path: str, needs: tuple[str, ...] = ("t", "dt")) -> list[dict]:
    """The records of a trace, gzipped (as benchmarks/results keeps them) or not, whatever the
    file's name says (the engine writes plain lines, even to a ``.gz`` name); the engine's idle
    records (no ``kind``) included. Each record must be a JSON object with the keys ``needs``."""
    records = []
    try:
        # opened once, its first bytes peeked: a pipe (``<(zcat ...)``) cannot be read twice
        with open(path, "rb") as raw:
            zipped = raw.peek(2)[:2] == b"\x1f\x8b"
            lines = io.TextIOWrapper(gzip.GzipFile(fileobj=raw) if zipped else raw, encoding="utf-8")
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    raise TraceError(
                        f"{path}, line {number}: not a JSON record: {line.strip()[:80]!r}"
                    ) from None
                wanted = needs + (STEP_FIELDS if isinstance(record, dict) and "kind" in record else ())
                missing = [k for k in wanted if k not in record] if isinstance(record, dict) else list(needs)
                if missing:
                    raise TraceError(
                        f"{path}, line {number}: a record without {', '.join(missing)}: is this the "
                        "right kind of trace (MINISGL_STEP_TRACE for the steps, bench serve --trace "
                        "for --requests)?"
                    )
                # (a string, a NaN or a list there was a TypeError or ValueError traceback mid-summary)
                bad = [
                    k
                    for k in wanted
                    if not _is_number(record[k]) and not (k in MAY_BE_NONE and record[k] is None)
                ]
                if bad:
                    raise TraceError(
                        f"{path}, line {number}: {bad[0]} is {str(record[bad[0]])[:40]!r}, not a finite number"
                    )
                records.append(record)
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as e:
        raise TraceError(f"cannot read {path}: {e}") from None
    if not records:
        raise TraceError(f"{path} holds no records (a run that has not stepped yet?)")
    return records


def check_order(path: str, steps: list[dict]) -> None:
    """Steps in time order, each of a duration >= 0, as the engine appends them: a trace going back
    in time (two runs' traces joined, from machines or boots apart) or a negative ``dt`` was an
    IndexError traceback from the timeline."""
    for i, step in enumerate(steps):
        if step["dt"] < 0:
            raise TraceError(f"{path}: record {i + 1} lasts {step['dt']} s, less than nothing")
        if i and step["t"] < steps[i - 1]["t"]:
            raise TraceError(
                f"{path}: record {i + 1} starts at {step['t']}, before record {i}'s {steps[i - 1]['t']}: "
                "a trace of more than one run? give one run's records"
            )


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round((len(s) - 1) * q / 100)))]


def summarise(steps: list[dict], bucket: float) -> dict:
    busy = [s for s in steps if "kind" in s]
    t0, t1 = steps[0]["t"], steps[-1]["t"] + steps[-1]["dt"]
    idle = sum(max(0.0, b["t"] - (a["t"] + a["dt"])) for a, b in zip(steps, steps[1:]))
    kinds: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0, 0])
    for s in busy:
        key = (
            s["kind"]
            if s["kind"] in ("prefill", "mixed")
            else f"decode bs<={next(b for b in (8, 32, 64, 128, 192, 256, 10**9) if s['reqs'] <= b)}"
        )
        k = kinds[key]
        k[0] += 1
        k[1] += s["dt"]
        k[2] += s["reqs"]
        k[3] += s["tokens"]
    print(f"wall {t1 - t0:.2f} s, {len(busy)} steps, idle between steps {idle:.2f} s")
    for key, (n, dt, reqs, tokens) in sorted(kinds.items()):
        print(
            f"  {key:16s} {n:6d} steps {dt:8.2f} s {dt / n * 1e3:8.2f} ms/step  {reqs / n:7.1f} reqs {tokens / n:8.1f} tokens"
        )
    phases_by_kind(busy)
    stalls(busy)
    decode_during_prefill = sum(1 for s in busy if s["kind"] == "prefill" and s["running"] > s["reqs"])
    print(f"  prefill steps while others were running: {decode_during_prefill}")
    mixed = [s for s in busy if s["kind"] == "mixed"]
    if mixed:
        print(f"  mixed steps (prefill with the running decodes): {len(mixed)}, "
              f"{sum(s.get('decodes', 0) for s in mixed)} decode rows")  # fmt: skip
    print(f"timeline ({bucket} s buckets): prefill% decode% idle%  mean running  arrivals  decode tokens")
    nb = int((t1 - t0) / bucket) + 1
    rows = [
        [0.0, 0.0, 0.0, 0, 0, 0] for _ in range(nb)
    ]  # prefill s, decode s, running*steps, steps, new, decode tokens
    for s in steps:
        row = rows[min(nb - 1, int((s["t"] - t0) / bucket))]
        row[4] += s.get("new", 0)
        if "kind" in s:
            row[0 if s["kind"] in ("prefill", "mixed") else 1] += s["dt"]
            row[2] += s["running"]
            row[3] += 1
            if s["kind"] == "decode":
                row[5] += s["tokens"]
            elif s["kind"] == "mixed":
                row[5] += s.get("decodes", 0)
    for i, (pf, dc, run, n, new, toks) in enumerate(rows):
        idle_share = max(0.0, 1 - (pf + dc) / bucket)
        print(f"  {i * bucket:7.2f}  {pf / bucket * 100:5.0f} {dc / bucket * 100:6.0f} {idle_share * 100:5.0f}"
              f"  {run / max(n, 1):11.1f}  {new:8d}  {toks:8d}")  # fmt: skip
    return {"t0": t0, "t1": t1}


#: prefill and mixed steps of at least this many tokens are shown apart from the smaller ones
LONG_PREFILL_TOKENS = 4096


def step_key(step: dict) -> str:
    """The row a step's phases are averaged in: decode steps by 64 requests, prefill and mixed
    steps long (≥ ``LONG_PREFILL_TOKENS``, an offline run's full chunks) or short."""
    if step["kind"] == "decode":
        return f"decode bs>{(step['reqs'] - 1) // 64 * 64}"
    if step["kind"] in ("prefill", "mixed"):
        side = ">=" if step["tokens"] >= LONG_PREFILL_TOKENS else "<"
        return f"{step['kind']} {side}{LONG_PREFILL_TOKENS}"
    return step["kind"]


def phases_by_kind(busy: list[dict]) -> dict[str, dict[str, float]]:
    """Mean host ms per phase (the trace's ``ms``: schedule, forward launch, sample launch, sync
    wait for the device, grammar accept / fill / wait for the fill, process) per step kind
    (:func:`step_key`), printed and returned."""
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[str, int] = defaultdict(int)
    for s in busy:
        if "ms" not in s:
            continue
        key = step_key(s)
        counts[key] += 1
        for phase, ms in s["ms"].items():
            sums[key][phase] += ms
    if counts:
        print("host ms per step by phase (mean):")
    means = {key: {k: v / counts[key] for k, v in sums[key].items()} for key in sorted(counts)}
    for key, phases in means.items():
        print(f"  {key:14s} {counts[key]:6d} steps: {phase_text(phases)}")
    return means


def phase_text(phases: dict[str, float], digits: int = 2) -> str:
    """Phases by host time, most first; the parts of ``schedule`` (``schedule.<part>``, traces
    since the sixty-sixth session) in brackets after it, in the order planning runs them."""
    parts = {k.removeprefix("schedule."): v for k, v in phases.items() if k.startswith("schedule.")}
    order = ("plan", "admit", "lists", "rows", "pack", "copy", "index", "cache")
    inner = ", ".join(
        f"{k} {parts[k]:.{digits}f}"
        for k in sorted(parts, key=lambda k: order.index(k) if k in order else len(order))
    )
    text = []
    for k, v in sorted(
        ((k, v) for k, v in phases.items() if not k.startswith("schedule.")), key=lambda kv: -kv[1]
    ):
        text.append(f"{k} {v:.{digits}f}" + (f" ({inner})" if k == "schedule" and inner else ""))
    return "  ".join(text)


def stalls(busy: list[dict], factor: float = 5.0, top: int = 5) -> None:
    """Decode steps that took ``factor`` times the median decode step of their batch-size bucket
    or more (a kernel compiled mid-run, a collector pause...): how many, and the longest with
    their host phases. A Triton compile inside a run showed as 0.6-1 s steps whose ``sample``
    phase held the time (BENCHMARKS.md, 2026-11-27). A decode step right after a prefill or mixed
    step is left out: with overlap its ``sync`` waits for that step's GPU work (a Llama-3.1-8B run's
    first decode step, 52 ms, was its 2,680-token prefill)."""
    buckets: dict[int, list[float]] = defaultdict(list)
    decodes = [s for prev, s in zip(busy, busy[1:]) if s["kind"] == "decode" and prev["kind"] == "decode"]
    for s in decodes:
        buckets[(s["reqs"] - 1) // 64].append(s["dt"])
    medians = {b: sorted(v)[len(v) // 2] for b, v in buckets.items()}
    slow = [s for s in decodes if s["dt"] >= factor * medians[(s["reqs"] - 1) // 64]]
    print(f"decode steps over {factor:g}x their bucket's median: {len(slow)}, "
          f"{sum(s['dt'] for s in slow):.2f} s")  # fmt: skip
    for s in sorted(slow, key=lambda s: -s["dt"])[:top]:
        phases = phase_text(s.get("ms", {}), digits=1)
        print(
            f"  {s['dt'] * 1e3:8.1f} ms at {s['reqs']} requests (median {medians[(s['reqs'] - 1) // 64] * 1e3:.2f}): {phases}"
        )


def requests_view(steps: list[dict], reqs: list[dict]) -> None:
    """TTFT as the client saw it, and how much of it passed before the server's next prefill step."""
    prefill_starts = [s["t"] for s in steps if s.get("kind") in ("prefill", "mixed")]
    ttft, before_prefill = [], []
    for r in reqs:
        if r["first"] is None:
            continue
        ttft.append(r["first"] - r["sent"])
        i = bisect.bisect_left(prefill_starts, r["sent"])
        if i < len(prefill_starts):
            before_prefill.append(prefill_starts[i] - r["sent"])
    sent = sorted(r["sent"] for r in reqs)
    print(f"requests {len(reqs)}; sent over {sent[-1] - sent[0]:.2f} s")
    print(
        f"  client TTFT ms p50 {pct(ttft, 50) * 1e3:.0f} p90 {pct(ttft, 90) * 1e3:.0f} p99 {pct(ttft, 99) * 1e3:.0f}"
    )
    print(
        f"  send -> next prefill step ms p50 {pct(before_prefill, 50) * 1e3:.1f} p99 {pct(before_prefill, 99) * 1e3:.1f}"
    )
    chunks = [r["chunks"] / max(r["tokens"], 1) for r in reqs]
    print(f"  chunks per token p50 {pct(chunks, 50):.2f} (1.00: one SSE chunk per token)")


#: the most timeline rows --bucket may ask for
MAX_BUCKETS = 100_000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("steps")
    p.add_argument("--requests")
    p.add_argument("--bucket", type=float, default=0.5, help="timeline bucket, seconds (default 0.5)")
    args = p.parse_args()
    if not (0 < args.bucket < float("inf")):
        p.error(f"--bucket {args.bucket}: give a positive number of seconds")
    try:
        steps = load(args.steps)
        reqs = load(args.requests, ("sent", "first", "chunks", "tokens")) if args.requests else None
    except TraceError as e:
        p.exit(2, f"step_trace: {e}\n")
    try:
        check_order(args.steps, steps)
    except TraceError as e:
        p.exit(2, f"step_trace: {e}\n")
    span = steps[-1]["t"] + steps[-1]["dt"] - steps[0]["t"]
    if not span / args.bucket <= MAX_BUCKETS:  # (an infinite span too)
        p.error(f"--bucket {args.bucket}: {span:.1f} s of trace would print over {MAX_BUCKETS:,} rows")
    summarise(steps, args.bucket)
    if reqs is not None:
        requests_view(steps, reqs)


if __name__ == "__main__":
    main()
