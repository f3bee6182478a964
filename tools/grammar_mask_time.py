"""How long a grammar backend takes to compile JSON schemas and to fill one request's token mask,
on the default model's tokenizer (SmolLM2-135M-Instruct, 49,152 tokens), CPU only.

    python3 tools/grammar_mask_time.py [--backend xgrammar|llguidance] [--tokens N] [--seed S]

Each schema of :data:`SCHEMAS` is compiled once (ms), then a random walk of up to ``--tokens``
tokens through its bitmask times each ``fill_bitmask`` (µs a token, the mean over the walk; the
stop token is avoided while another token is allowed, so that the strings grow). The walk is
seeded: two runs of one backend walk the same tokens where their masks agree.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from minisgl_core.api import GrammarSpec, allocate_token_bitmask, allowed_tokens
from minisgl_core.checkpoint.resolve import resolve_model
from minisgl_core.testing.policy_suite import resolve
from minisgl_core.tokenizer.load import load_tokenizer

#: (name, schema): strings bounded by length, by pattern (bounded repetitions of ``.``, a negated
#: class, a class escape in a class), formats, and an object of several bounded strings
SCHEMAS: list[tuple[str, dict]] = [
    ("string", {"type": "string"}),
    ("maxLength 100", {"type": "string", "maxLength": 100}),
    ("minLength 2", {"type": "string", "minLength": 2}),
    ("maxLength 1", {"type": "string", "maxLength": 1}),
    ("pattern ^.{1,80}$", {"type": "string", "pattern": "^.{1,80}$"}),
    ('pattern ^[^"]{0,100}$', {"type": "string", "pattern": '^[^"]{0,100}$'}),
    ("pattern ^[a\\S]{1,50}$", {"type": "string", "pattern": "^[a\\S]{1,50}$"}),
    ("format email", {"type": "string", "format": "email"}),
    (
        "object of 5 maxLength 50",
        {
            "type": "object",
            "properties": {f"k{i}": {"type": "string", "maxLength": 50} for i in range(5)},
            "required": [f"k{i}" for i in range(5)],
        },
    ),
]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="xgrammar")
    p.add_argument("--tokens", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    tokenizer = load_tokenizer(resolve_model(None))
    vocab = len(tokenizer)
    stop = tokenizer.eos_token_id
    backend = resolve("grammars", args.backend)(tokenizer, vocab_size=vocab, stop_token_ids=[stop])
    print(f"{args.backend}, {vocab} tokens")
    for name, schema in SCHEMAS:
        started = time.perf_counter()
        compiled = backend.compile(GrammarSpec("json_schema", json.dumps(schema)))
        compile_ms = (time.perf_counter() - started) * 1e3
        matcher = backend.matcher(compiled)
        mask = allocate_token_bitmask(1, vocab)
        rng = random.Random(args.seed)
        fills: list[float] = []
        for _ in range(args.tokens):
            if matcher.is_terminated():
                break
            started = time.perf_counter()
            mask.fill_(0)
            matcher.fill_bitmask(mask, 0)
            fills.append(time.perf_counter() - started)
            allowed = allowed_tokens(mask[0], vocab).nonzero().flatten().tolist()
            if not allowed:
                break
            matcher.accept_token(rng.choice([t for t in allowed if t != stop] or allowed))
        mean_us = sum(fills) / len(fills) * 1e6
        print(f"  {name:28s} compile {compile_ms:8.1f} ms   fill {mean_us:9.1f} µs/token over {len(fills)}")


if __name__ == "__main__":
    main()
