"""Summarise py-spy's raw (collapsed) stacks per thread: where each thread's samples go.

    python3 tools/pyspy_summary.py pyspy-constrained.txt.gz [--thread MainThread] [--top 40]

For each thread (or the one named): its samples, then the functions by inclusive share (a
function counted once per sample however deep it recurs) and by self share (the innermost frame).
"""

from __future__ import annotations

import argparse
import gzip
import re
from collections import Counter, defaultdict

FRAME = re.compile(r"^(.*) \((.*?):\d+\)$")


def read(path: str) -> dict[str, Counter]:
    """thread name -> Counter of stacks (tuples of 'function (file)' outermost first)."""
    opener = gzip.open if path.endswith(".gz") else open
    threads: dict[str, Counter] = defaultdict(Counter)
    with opener(path, "rt") as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            frames = stack.split(";")
            if frames[0].startswith("process "):  # --subprocesses: the process comes first
                frames = frames[1:]
            thread = frames[0].split(": ", 1)[-1]
            names = []
            for fr in frames[1:]:
                m = FRAME.match(fr)
                names.append(f"{m.group(1)} ({m.group(2).rsplit('/', 1)[-1]})" if m else fr)
            threads[thread][tuple(names)] += int(count)
    return threads


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path")
    p.add_argument("--thread", help="only threads whose name contains this")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--under", help="only samples whose stack passes through this function")
    args = p.parse_args()
    threads = read(args.path)
    for name, stacks in sorted(threads.items(), key=lambda kv: -sum(kv[1].values())):
        if args.thread and args.thread not in name:
            continue
        if args.under:
            stacks = Counter({s: c for s, c in stacks.items() if any(args.under in f for f in s)})
        total = sum(stacks.values())
        if not total:
            continue
        inclusive: Counter = Counter()
        self_: Counter = Counter()
        for stack, count in stacks.items():
            for fn in set(stack):
                inclusive[fn] += count
            self_[stack[-1] if stack else "(no frame)"] += count
        print(f"== {name}: {total} samples")
        print("  inclusive:")
        for fn, c in inclusive.most_common(args.top):
            print(f"    {100 * c / total:5.1f}%  {fn}")
        print("  self:")
        for fn, c in self_.most_common(args.top):
            print(f"    {100 * c / total:5.1f}%  {fn}")


if __name__ == "__main__":
    main()
