"""What a fresh engine's first workload run pays that its second does not (issue 19: throughput
from the first run). One engine, the standard offline workload twice; during each run, every
Triton kernel that was not yet in memory (compiled, or loaded from Triton's disk cache) with its
time, torch.compile's graph count, and the caching allocator's new device segments (cudaMalloc).

    python3 tools/device_first_run.py MODEL_DIR [--attn auto] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from triton import knobs

from minisgl_core.bench.offline import run_offline
from minisgl_core.bench.workloads import standard_offline
from minisgl_core.llm import LLM


class Compiles:
    """Triton's JIT hooks: ``jit_cache_hook`` runs before a kernel is compiled or loaded,
    ``jit_post_compile_hook`` after."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self._started: dict[int, float] = {}
        knobs.runtime.jit_cache_hook = self.before
        knobs.runtime.jit_post_compile_hook = self.after

    def before(self, *, key, repr, fn, compile, is_manual_warmup, already_compiled) -> bool:
        self._started[id(key)] = time.perf_counter()
        return False

    def after(self, *, key, repr, fn, compile, is_manual_warmup, already_compiled) -> bool:
        start = self._started.pop(id(key), None)
        seconds = time.perf_counter() - start if start is not None else None
        constants = {k: v for k, v in compile["constants"].items() if isinstance(v, (int, float, bool, str))}
        self.events.append({"kernel": fn.name, "module": fn.module, "seconds": seconds and round(seconds, 3),
                            "constants": str(constants)[:300], "at": time.perf_counter()})  # fmt: skip
        return False


def counters() -> dict:
    from torch._dynamo.utils import counters as dynamo

    stats = torch.cuda.memory_stats()
    return {"dynamo_unique_graphs": int(dynamo["stats"]["unique_graphs"]),
            "cuda_segments": int(stats.get("segment.all.allocated", 0)),
            "alloc_retries": int(stats.get("num_alloc_retries", 0))}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--attn", default="auto")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--json")
    args = p.parse_args()
    compiles = Compiles()
    llm = LLM(args.model, attn=args.attn)
    requests = standard_offline(256, seed=0)
    print(json.dumps({"start-up compiles": len(compiles.events), **counters()}), flush=True)
    report = []
    for run in range(args.runs):
        before, seen = counters(), len(compiles.events)
        start = time.perf_counter()
        result = run_offline(llm, requests)
        after = counters()
        events = [{k: v for k, v in e.items() if k != "at"} | {"after_s": round(e["at"] - start, 3)}
                  for e in compiles.events[seen:]]  # fmt: skip
        row = {"run": run + 1, "output_tok_per_s": result["output_tok_per_s"], "seconds": result["seconds"],
               "compiles": len(events), "compile_s": round(sum(e["seconds"] or 0 for e in events), 3),
               **{k: after[k] - before[k] for k in after}}  # fmt: skip
        print(json.dumps(row), flush=True)
        for e in events:
            print("   ", json.dumps(e)[:400], flush=True)
        report.append({**row, "events": events})
    llm.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
