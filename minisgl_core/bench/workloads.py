"""The benchmark workloads, generated from a seed so every run and every engine sees the same ones."""

from __future__ import annotations

import random
from typing import NamedTuple


class BenchRequest(NamedTuple):
    prompt_ids: list[int]
    max_tokens: int


#: the standard workload's longest prompt
STANDARD_MAX_PROMPT = 1024


def standard_offline(num_requests: int = 256, seed: int = 0) -> list[BenchRequest]:
    """The field's standard offline throughput workload (nano-vllm's bench): 100-1024 random prompt
    tokens, then 100-1024 output tokens per request. With the defaults: 142,827 prompt tokens and
    133,966 output tokens. Every prompt is drawn before the first output length (nano-vllm's order,
    which the peer's driver keeps), so ``standard_offline(n)`` is not the first ``n`` requests of
    ``standard_offline(256)``: their prompts are the same, their output lengths not."""
    rng = random.Random(seed)
    prompts = [
        [rng.randint(0, 10000) for _ in range(rng.randint(100, STANDARD_MAX_PROMPT))]
        for _ in range(num_requests)
    ]
    return [BenchRequest(p, rng.randint(100, 1024)) for p in prompts]


def shared_prefix(
    groups: int = 64,
    prompts_per_group: int = 16,
    prefix_len: int = 2048,
    question_len: int = 128,
    output_len: int = 256,
    seed: int = 0,
    vocab: int = 10000,
) -> list[BenchRequest]:
    """Groups of prompts sharing a long system prompt, interleaved across groups (as real traffic
    arrives). Ideal prefix-cache hit rate: (per_group - 1) * prefix / (per_group * (prefix + question))."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(vocab) for _ in range(prefix_len)] for _ in range(groups)]
    requests = [
        BenchRequest(prefixes[g] + [rng.randrange(vocab) for _ in range(question_len)], output_len)
        for _ in range(prompts_per_group)
        for g in range(groups)
    ]
    return requests


def ideal_hit_rate(groups: int, prompts_per_group: int, prefix_len: int, question_len: int) -> float:
    cached = groups * (prompts_per_group - 1) * prefix_len
    return cached / (groups * prompts_per_group * (prefix_len + question_len))
