"""GPU check of constrained decoding inside CUDA graphs with overlap (issue 18). With overlap the
engine launches a constrained step's sampling one step late (after the next step is planned and
prepared, while its bitmask is filled) and gathers the next step's inputs again; without overlap
nothing is deferred. The same batch of free (greedy) and constrained (seeded) requests must give
the same tokens both ways, and every constrained output must parse as its schema says. A quarter
of the constrained requests constrain after a reasoning (``reasoning_tag_ids``, the tokenizer's
``<think>``/``</think>``, drawn by a mild logit bias): their answer after the end tag must parse.

    python3 tools/device_grammar_check.py [--model DIR] [--out FILE]   # one JSON line; exit 1 on failure

Without --model a small random Qwen3 (head_dim 64) is written first.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from minisgl_core import LLM, SamplingParams
from minisgl_core.api import GrammarSpec
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.testing.grammar_suite import NESTED_SCHEMA
from minisgl_core.tokenizer.load import load_tokenizer


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model")
    p.add_argument("--out")
    p.add_argument("--device", default="cuda", help="cpu runs the same check in float32 (no graphs)")
    args = p.parse_args()
    model = args.model or make_model_dir(  # head_dim 64: FlashInfer has no kernels for the tiny default's 16
        Path(tempfile.mkdtemp()) / "qwen3", "Qwen3ForCausalLM", max_position_embeddings=1024,
        hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        added_tokens=("<think>", "</think>"),
    )  # fmt: skip
    prompts = [[10 + i % 50, 20 + i % 7, 30 + i % 11, 40 + i % 13] for i in range(48)]
    spec = GrammarSpec("json_schema", json.dumps(NESTED_SCHEMA))
    tags = tuple(load_tokenizer(model).convert_tokens_to_ids(["<think>", "</think>"]))
    reasoning = {"reasoning_tag_ids": tags, "logit_bias": {tags[0]: 4.0, tags[1]: 5.0}}
    params = [
        SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
        if i % 2 == 0
        else SamplingParams(
            temperature=1.0, seed=i, max_tokens=300, grammar=spec, **(reasoning if i % 4 == 3 else {})
        )
        for i in range(48)
    ]
    runs = {}
    graphs = {}
    for overlap in (True, False):
        llm = LLM(
            str(model),
            device=args.device,
            dtype="bfloat16" if args.device == "cuda" else "float32",
            overlap=overlap,
        )
        runs[overlap] = llm.generate(prompts, params, use_tqdm=False)
        graphs[overlap] = llm.engine.runner.graphs is not None
        llm.close()
    llm_tokenizer = load_tokenizer(model)
    same = sum(a.token_ids == b.token_ids for a, b in zip(runs[True], runs[False]))
    parsed, errors, reasoned = 0, [], 0
    answers = []
    for i, out in enumerate(runs[True]):
        if i % 2 == 0:
            continue
        ids = out.token_ids
        if i % 4 == 3 and ids and ids[0] == tags[0] and tags[1] in ids:  # the answer after the reasoning
            reasoned += 1
            ids = ids[ids.index(tags[1]) + 1 :]
        answers.append(llm_tokenizer.decode(ids, skip_special_tokens=True))
    for text in answers:
        try:
            value = json.loads(text)
            parsed += isinstance(value, dict)
        except ValueError as exc:
            errors.append(str(exc)[:100])
    try:
        import jsonschema

        for text in answers:
            jsonschema.validate(json.loads(text), NESTED_SCHEMA)
        validated = "all"
    except ImportError:
        validated = "jsonschema not installed"
    except Exception as exc:  # noqa: BLE001
        validated = f"FAILED: {exc}"[:200]
    finished = sum(out.finish_reason == "stop" for out in runs[True][1::2])
    ok = same == 48 and parsed == 24 == finished and reasoned > 0 and not validated.startswith("FAILED")
    report = {
        "check": "grammar-overlap", "model": str(model), "identical_with_and_without_overlap": f"{same}/48",
        "constrained_parsed": f"{parsed}/24", "constrained_stopped": f"{finished}/24",
        "reasoned_then_answered": f"{reasoned}/12", "validated": validated, "cuda_graphs": graphs[True],
        "errors": errors[:3], "ok": ok,
    }  # fmt: skip
    line = json.dumps(report)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
