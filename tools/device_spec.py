"""Speculative decoding on the GPU: batch-1 tokens/s with and without n-gram drafts on copy-heavy
prompts, the acceptance length, and whether greedy output is the same.

    python3 tools/device_spec.py --model PATH [--draft-tokens 4] [--max-tokens 256] --out $OUT/spec.json

PATH: a model directory or .gguf (the real default model when it can be brought), or
``--shape llama-3.1-8b``-style random weights (``minisgl bench make-model``): then only the timing
means something, since a random model does not copy its prompt. Each prompt runs alone (batch 1)
after a warm-up; one engine at a time on the GPU. A verify step is a decode batch of more
sequences than the plain decode step it replaces (other CUDA graph, other kernel split), so in
bf16 greedy paths may fork where two logits nearly tie: the report gives, per prompt, whether the
tokens are identical and where they first differ. ``--quantization NAME`` and
``--kv-cache-dtype fp8_e4m3`` apply to both runs (speculation on quantized weights / an fp8 pool).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from minisgl_core import LLM, SamplingParams

TEXTS = [
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single "
    "step. All that glitters is not gold, and not all those who wander are lost. Fortune favors the bold.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
    "def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result\n",
    "Roses are red, violets are blue, sugar is sweet, and so are you. The sun rises in the east and sets "
    "in the west; the moon follows the tides, and the stars keep their quiet watch over the sleeping town.",
    "Item 1: apples, 3 kg, 4.50 EUR. Item 2: pears, 2 kg, 3.20 EUR. Item 3: plums, 1 kg, 2.10 EUR. "
    "Item 4: grapes, 2 kg, 5.80 EUR. Item 5: cherries, 1 kg, 6.40 EUR. Total: 22.00 EUR.",
]
ASKS = ["Repeat this text exactly:\n\n{}", "Copy the following word for word, then stop.\n\n{}"]


def prompts_for(llm: LLM) -> list[list[int]]:
    tok = llm.tokenizer
    if getattr(tok, "chat_template", None):
        from minisgl_core.tokenizer.load import apply_chat_template

        return [
            apply_chat_template(tok, [{"role": "user", "content": ask.format(text)}])
            for text in TEXTS
            for ask in ASKS
        ]
    return [tok.encode(ask.format(text)) for text in TEXTS for ask in ASKS]


def measure(model: str, max_tokens: int, ignore_eos: bool, **options) -> dict:
    llm = LLM(model, **options)
    prompts = prompts_for(llm)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))  # warm-up
    before = llm.engine.stats()
    tokens, seconds, outputs = 0, 0.0, []
    for prompt in prompts:
        torch.cuda.synchronize()
        started = time.perf_counter()
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        torch.cuda.synchronize()
        seconds += time.perf_counter() - started
        tokens += len(out.token_ids)
        outputs.append(out.token_ids)
    stats = {k: v - before.get(k, 0) for k, v in llm.engine.stats().items() if k.startswith("spec_")}
    result = {"tok_s": round(tokens / seconds, 1), "tokens": tokens, "seconds": round(seconds, 3)}
    if stats:
        result["acceptance_length"] = round(
            stats["spec_emitted_tokens"] / max(stats["spec_request_steps"], 1), 3
        )
        result["acceptance_rate"] = round(
            stats["spec_accepted_tokens"] / max(stats["spec_draft_tokens"], 1), 3
        )
        result["stats"] = stats
    result["sample_text"] = llm.tokenizer.decode(outputs[0][:80])
    llm.close()
    return result | {"_outputs": outputs}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--draft-tokens", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--attn", default="auto")
    parser.add_argument("--ignore-eos", action="store_true", help="always run max_tokens (random weights)")
    parser.add_argument("--quantization", default=None, help="both runs: int8, fp8, ... (default: none)")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8_e4m3"], help="both runs")
    parser.add_argument("--out")
    args = parser.parse_args()
    common = dict(
        attn=args.attn,
        num_kv_tokens=65536,
        max_running_requests=8,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    plain = measure(args.model, args.max_tokens, args.ignore_eos, **common)
    spec = measure(
        args.model,
        args.max_tokens,
        args.ignore_eos,
        speculative_algorithm="ngram",
        speculative_num_draft_tokens=args.draft_tokens,
        **common,
    )
    a, b = plain.pop("_outputs"), spec.pop("_outputs")
    first_diff = [next((i for i, (x, y) in enumerate(zip(p, s)) if x != y), None) for p, s in zip(a, b)]
    report = {
        "model": args.model,
        "device": torch.cuda.get_device_name(0),
        "draft_tokens": args.draft_tokens,
        "quantization": args.quantization,
        "kv_cache_dtype": args.kv_cache_dtype,
        "plain": plain,
        "ngram": spec,
        "speedup": round(spec["tok_s"] / plain["tok_s"], 3),
        "identical_prompts": sum(d is None for d in first_diff),
        "prompts": len(first_diff),
        "first_difference": first_diff,
    }
    line = json.dumps(report)
    print(line)
    if args.out:
        with open(args.out, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
