"""Offline throughput: the whole workload submitted at once through the LLM API."""

from __future__ import annotations

import functools
import sys
import threading
import time
from typing import Any, TextIO

from minisgl_core.api import GrammarSpec
from minisgl_core.bench.workloads import BenchRequest
from minisgl_core.llm import LLM
from minisgl_core.sampling import SamplingParams


class ProgressLines:
    """A progress report for ``LLM.generate``'s ``use_tqdm``: a line on ``stream`` (stderr) every
    ``every`` seconds with the requests done so far. A bar redraws only when a request finishes,
    and on a CPU none may for minutes: the run then said nothing at all after start-up."""

    def __init__(self, total: int, every: float, stream: TextIO | None = None, **_bar_options: Any) -> None:
        self.total, self.done = total, 0
        self._stream = stream if stream is not None else sys.stderr
        self._start = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._report, args=(every,), name="bench-progress", daemon=True
        )
        self._thread.start()

    def update(self, n: int = 1) -> None:
        self.done += n

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def _report(self, every: float) -> None:
        while not self._stop.wait(every):
            seconds = time.perf_counter() - self._start
            print(
                f"minisgl bench offline: {self.done}/{self.total} requests done, {seconds:.0f} s",
                file=self._stream,
                flush=True,
            )


def announce_timed_run(requests: list[BenchRequest], progress_every: float) -> None:
    print(
        f"minisgl bench offline: timing {len(requests)} requests "
        f"({sum(r.max_tokens for r in requests)} output tokens); a line every {progress_every:g} s",
        file=sys.stderr,
        flush=True,
    )


def run_offline(
    llm: LLM,
    requests: list[BenchRequest],
    temperature: float = 0.6,
    grammar: GrammarSpec | None = None,
    progress_every: float | None = None,
) -> dict[str, Any]:
    """``grammar``: constrain every request by it (compile it before, see bench.grammar.prepare).
    ``progress_every``: print a line to stderr this often (seconds) during the timed run (the
    JSON result stays alone on stdout); None: nothing."""
    params = [
        SamplingParams(temperature=temperature, max_tokens=r.max_tokens, ignore_eos=True, grammar=grammar)
        for r in requests
    ]
    # warm-up outside the timed region (JIT kernels, allocator, graphs already captured at load)
    warm_start = time.perf_counter()
    warm = requests[:4]
    if progress_every is not None:  # (minutes on a busy CPU)
        print(
            f"minisgl bench offline: warming up ({len(warm)} requests of 8 tokens)",
            file=sys.stderr,
            flush=True,
        )
    llm.generate([r.prompt_ids for r in warm], [SamplingParams(max_tokens=8, ignore_eos=True, grammar=grammar)] * len(warm),
                 use_tqdm=False)  # fmt: skip
    warmup = time.perf_counter() - warm_start
    progress: Any = False
    if progress_every is not None:
        announce_timed_run(requests, progress_every)
        progress = functools.partial(ProgressLines, every=progress_every)
    start = time.perf_counter()
    outs = llm.generate([r.prompt_ids for r in requests], params, use_tqdm=progress)
    elapsed = time.perf_counter() - start
    output_tokens = sum(len(o.token_ids) for o in outs)
    expected = sum(r.max_tokens for r in requests)
    # a grammar may be complete before max_tokens (a schema shorter than the workload's outputs,
    # unlike the builtin one): such a request stops there, and the figure counts what ran (the
    # run's result was lost to a RuntimeError after it)
    short = sum(len(o.token_ids) < r.max_tokens for o, r in zip(outs, requests))
    if output_tokens != expected and grammar is None:
        raise RuntimeError(f"generated {output_tokens} tokens, workload asks for {expected}")
    if short and progress_every is not None:
        print(
            f"minisgl bench offline: {short} of {len(requests)} requests ended when their grammar was "
            f"complete, before max_tokens: {output_tokens} of the workload's {expected} output tokens "
            "ran, and the figures count those",
            file=sys.stderr,
            flush=True,
        )
    return {
        "requests": len(requests),
        **(
            {"grammar_short_requests": short, "workload_output_tokens": expected}
            if grammar is not None
            else {}
        ),
        "prompt_tokens": sum(len(r.prompt_ids) for r in requests),
        "output_tokens": output_tokens,
        "seconds": round(elapsed, 3),
        "output_tok_per_s": round(output_tokens / elapsed, 1),
        "total_tok_per_s": round((output_tokens + sum(len(r.prompt_ids) for r in requests)) / elapsed, 1),
        "warmup_seconds": round(warmup, 1),
    }


def decode_latency(llm: LLM, prompt_len: int = 128, steps: int = 256) -> dict[str, Any]:
    """Batch-1 decode: ms per output token after the prefill."""
    prompt = list(range(100, 100 + prompt_len))
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    start = time.perf_counter()
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True), use_tqdm=False)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    llm.generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=steps + 1, ignore_eos=True), use_tqdm=False
    )
    total = time.perf_counter() - start
    return {
        "prompt_len": prompt_len,
        "steps": steps,
        "ms_per_token": round((total - prefill) / steps * 1000, 3),
    }
