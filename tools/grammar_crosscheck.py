"""The two grammar backends against each other on random JSON schemas (CPU, no model).

For each schema of :func:`minisgl_core.testing.grammar_suite.random_schema` that both xgrammar and
llguidance compile, random walks through each backend's bitmask must end in JSON that
``jsonschema`` finds valid, patterns read as ECMA-262 reads them (``ecma_validator``; "invalid
walk": a backend let wrong output through), and each valid text must be taken by the other backend
("refuses": it could not have written it; often a documented limit, such as xgrammar's cap on a
number's digits). Schemas only one backend compiles are counted. This probe found xgrammar's
hex-escape and length-limited-string bugs and its one-character strings without escapes
(2026-12-01).

    python3 tools/grammar_crosscheck.py [--seed N] [--schemas N] [--walks N] [--tokenizer DIR]

Exit status 1 when any walk was invalid.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile

from minisgl_plugin_llguidance.backend import LLGuidanceBackend
from minisgl_plugin_xgrammar.backend import XGrammarBackend
from transformers import AutoTokenizer

from minisgl_core.api import GrammarError, GrammarSpec
from minisgl_core.testing.grammar_suite import ecma_validator, random_schema, walk


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--schemas", type=int, default=200)
    p.add_argument("--walks", type=int, default=3, help="walks each way per schema")
    p.add_argument("--tokenizer", help="a tokenizer directory (default: a 400-token BPE trained here)")
    args = p.parse_args()
    if args.tokenizer:
        tok = AutoTokenizer.from_pretrained(args.tokenizer)
        stop = tok.eos_token_id
    else:
        from minisgl_core.demo.factories import train_tokenizer

        tok = AutoTokenizer.from_pretrained(str(train_tokenizer(tempfile.mkdtemp(), vocab_size=400)))
        stop = 2
    vocab = len(tok)
    backends = {
        "xgrammar": XGrammarBackend(tok, vocab_size=vocab, stop_token_ids=[stop]),
        "llguidance": LLGuidanceBackend(tok, vocab_size=vocab, stop_token_ids=[stop]),
    }

    def takes(name: str, compiled: object, text: str) -> bool:
        matcher = backends[name].matcher(compiled)
        tokens = tok.encode(text, add_special_tokens=False)
        return all(matcher.accept_token(t) for t in tokens) and (
            matcher.accept_token(stop) or matcher.is_terminated()
        )

    rng = random.Random(args.seed)
    counts = {"both": 0, "xgrammar only": 0, "llguidance only": 0, "neither": 0, "walks": 0}
    findings: list[str] = []
    invalid = 0
    for _ in range(args.schemas):
        schema = random_schema(rng)
        spec = GrammarSpec("json_schema", json.dumps(schema))
        compiled = {}
        for name, backend in backends.items():
            try:
                compiled[name] = backend.compile(spec)
            except GrammarError:
                pass
        counts[
            "both" if len(compiled) == 2 else f"{next(iter(compiled))} only" if compiled else "neither"
        ] += 1
        if len(compiled) != 2:
            continue
        validator = ecma_validator(schema)
        for source, other in (("xgrammar", "llguidance"), ("llguidance", "xgrammar")):
            for _ in range(args.walks):
                try:
                    tokens = walk(backends[source].matcher(compiled[source]), vocab, stop, rng, max_steps=200)
                except AssertionError:  # a long string or array: no verdict
                    continue
                text = tok.decode([t for t in tokens if t != stop])
                errors = [e.message for e in validator.iter_errors(json.loads(text))]
                if errors:
                    invalid += 1
                    findings.append(
                        f"invalid walk of {source}: {json.dumps(schema)} gave {text!r}: {errors[0]}"
                    )
                    continue
                counts["walks"] += 1
                if not takes(other, compiled[other], text):
                    findings.append(f"{other} refuses {source}'s valid {text!r} for {json.dumps(schema)}")
    print(json.dumps(counts))
    for line in findings:
        print(line[:600])
    print(f"{invalid} invalid walks, {len(findings) - invalid} refusals")
    return 1 if invalid else 0


if __name__ == "__main__":
    raise SystemExit(main())
