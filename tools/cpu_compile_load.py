"""What grammar compiles running aside cost the requests beside them, and what those requests'
load costs a compile, on the CPU with the real default model (the compile threads' priority,
``minisgl_core.engine.grammar.COMPILE_NICE``).

    python tools/cpu_compile_load.py [--nice N] [--properties 1000]

1. A free greedy request of 48 tokens alone, then three times while six grammars compile aside
   (two JSON schemas of 2,000 optional properties and four regexes ``x(a?)...y`` of about 700
   optional characters, each many seconds of xgrammar's compile): seconds each.
2. In a fresh engine decoding eight requests, a JSON schema of ``--properties`` optional
   properties compiles aside: seconds until its compile has ended, and the engine's step time
   meanwhile (the first compile also builds the backend, which reads the vocabulary).
``--nice`` replaces COMPILE_NICE for the run."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def _engine(nice: int | None):
    from minisgl_core import LLM
    from minisgl_core.checkpoint.resolve import resolve_model
    from minisgl_core.engine import grammar

    if nice is not None:
        grammar.COMPILE_NICE = nice
    return LLM(resolve_model(None), device="cpu").engine


def _constrained(engine, rid: int, spec) -> None:
    from minisgl_core import SamplingParams

    engine.add_request(
        rid, [1, 2], engine.admit([1, 2], SamplingParams(max_tokens=4, grammar=spec)), compile_aside=True
    )


def beside_compiles(nice: int | None) -> None:
    from minisgl_core import SamplingParams
    from minisgl_core.api import GrammarSpec

    engine = _engine(nice)

    def free(rid: int) -> float:
        prompt = [1, 2, 3, 4]
        params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
        engine.add_request(rid, prompt, engine.admit(prompt, params), compile_aside=True)
        started = time.perf_counter()
        while engine.has_work:
            engine.step()
        return time.perf_counter() - started

    free(0)  # warm
    alone = free(1)
    for j in range(2):
        schema = {"type": "object", "properties": {f"q{j}_{i}": {"type": "integer"} for i in range(2000)}}
        _constrained(engine, 100 + j, GrammarSpec("json_schema", json.dumps(schema)))
    for j in range(4):
        _constrained(engine, 200 + j, GrammarSpec("regex", "x" + "a?" * (700 + j) + "y"))
    time.sleep(0.5)
    loaded = [free(10 + i) for i in range(3)]
    print(f"48 free tokens: alone {alone:.2f} s; beside {engine.compiling} compiles "
          + ", ".join(f"{s:.2f}" for s in loaded) + " s", flush=True)  # fmt: skip


def compile_under_load(nice: int | None, properties: int) -> None:
    from minisgl_core import SamplingParams
    from minisgl_core.api import GrammarSpec

    engine = _engine(nice)
    for r in range(8):
        prompt = [1, 2, 3, r + 5]
        params = SamplingParams(temperature=0.0, max_tokens=2000, ignore_eos=True)
        engine.add_request(r, prompt, engine.admit(prompt, params), compile_aside=True)
    for _ in range(5):
        engine.step()
    started = time.perf_counter()
    engine.step()
    step_alone = time.perf_counter() - started
    schema = {"type": "object", "properties": {f"q{i}": {"type": "integer"} for i in range(properties)}}
    started = time.perf_counter()
    _constrained(engine, 100, GrammarSpec("json_schema", json.dumps(schema)))
    steps = 0
    while engine.compiles_settled() == ([], []) and time.perf_counter() - started < 300:
        engine.step()
        steps += 1
    took = time.perf_counter() - started
    print(f"a schema of {properties} optional properties beside 8 decoding requests: compiled in "
          f"{took:.1f} s; a step {1000 * took / max(steps, 1):.0f} ms meanwhile ({1000 * step_alone:.0f} "
          "ms before)", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nice", type=int, default=None, help="the compile threads' nice value")
    parser.add_argument("--properties", type=int, default=1000)
    parser.add_argument("--part", choices=["both", "beside", "under"], default="both")
    args = parser.parse_args()
    if args.part == "both":  # each part in a process of its own: a fresh engine and backend
        for part in ("beside", "under"):
            subprocess.run([sys.executable, __file__, *sys.argv[1:], "--part", part], check=True)
        return
    if args.part == "beside":
        beside_compiles(args.nice)
    else:
        compile_under_load(args.nice, args.properties)
    os._exit(0)  # (compiles aside may still run: do not wait for them)


if __name__ == "__main__":
    main()
