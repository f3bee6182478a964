"""Offline throughput: the whole workload submitted at once through the LLM API."""

from __future__ import annotations

import time
from typing import Any

from minisgl_core.api import GrammarSpec
from minisgl_core.bench.workloads import BenchRequest
from minisgl_core.llm import LLM
from minisgl_core.sampling import SamplingParams


def run_offline(
    llm: LLM, requests: list[BenchRequest], temperature: float = 0.6, grammar: GrammarSpec | None = None
) -> dict[str, Any]:
    """``grammar``: constrain every request by it (compile it before, see bench.grammar.prepare)."""
    params = [
        SamplingParams(temperature=temperature, max_tokens=r.max_tokens, ignore_eos=True, grammar=grammar)
        for r in requests
    ]
    # warm-up outside the timed region (JIT kernels, allocator, graphs already captured at load)
    warm_start = time.perf_counter()
    warm = requests[:4]
    llm.generate([r.prompt_ids for r in warm], [SamplingParams(max_tokens=8, ignore_eos=True, grammar=grammar)] * len(warm),
                 use_tqdm=False)  # fmt: skip
    warmup = time.perf_counter() - warm_start
    start = time.perf_counter()
    outs = llm.generate([r.prompt_ids for r in requests], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    output_tokens = sum(len(o.token_ids) for o in outs)
    expected = sum(r.max_tokens for r in requests)
    if output_tokens != expected:
        raise RuntimeError(f"generated {output_tokens} tokens, workload asks for {expected}")
    return {
        "requests": len(requests),
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
