"""Shared-prefix load through an OpenAI-compatible router, as text (the SGLang Model Gateway
routes on text and takes no token-id prompts): GROUPS groups of PER_GROUP prompts that share a
PREFIX-word system text (drawn from SEED), sent CONCURRENCY at a time; prints one JSON line (requests, output
tokens, seconds, output tok/s). Used by tools/device_router.sh."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

import httpx


async def main(
    url: str,
    model: str,
    groups: int,
    per_group: int,
    prefix: int,
    output_len: int,
    concurrency: int,
    seed: int = 0,
):
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(2000)]
    prompts = []
    for _ in range(groups):
        shared = " ".join(rng.choice(words) for _ in range(prefix))
        prompts += [
            f"{shared} question: {' '.join(rng.choice(words) for _ in range(32))}" for _ in range(per_group)
        ]
    rng.shuffle(prompts)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600) as client:

        async def one(prompt: str) -> int:
            async with gate:
                body = {
                    "model": model,
                    "prompt": prompt,
                    "max_tokens": output_len,
                    "temperature": 0,
                    "ignore_eos": True,
                }
                resp = await client.post(f"{url}/v1/completions", json=body)
                resp.raise_for_status()
                return resp.json()["usage"]["completion_tokens"]

        start = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(p) for p in prompts)))
        seconds = time.perf_counter() - start
    print(json.dumps({"requests": len(prompts), "output_tokens": tokens, "seconds": round(seconds, 3),
                      "output_tok_per_s": round(tokens / seconds, 1)}))  # fmt: skip


if __name__ == "__main__":
    url, model, *nums = sys.argv[1:]
    asyncio.run(main(url, model, *map(int, nums)))
