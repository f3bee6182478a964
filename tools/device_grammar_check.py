"""GPU check of constrained decoding inside CUDA graphs with overlap (issue 18). With overlap the
engine launches a constrained step's sampling one step late (after the next step is planned and
prepared, while its bitmask is filled) and gathers the next step's inputs again; without overlap
nothing is deferred. The same batch of free (greedy) and constrained (seeded) requests must give
the same tokens both ways, and every constrained output must parse as its schema says.

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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model")
    p.add_argument("--out")
    p.add_argument("--device", default="cuda", help="cpu runs the same check in float32 (no graphs)")
    args = p.parse_args()
    model = args.model or make_model_dir(  # head_dim 64: FlashInfer has no kernels for the tiny default's 16
        Path(tempfile.mkdtemp()) / "qwen3", "Qwen3ForCausalLM", max_position_embeddings=1024,
        hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    )  # fmt: skip
    prompts = [[10 + i % 50, 20 + i % 7, 30 + i % 11, 40 + i % 13] for i in range(48)]
    spec = GrammarSpec("json_schema", json.dumps(NESTED_SCHEMA))
    params = [
        SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
        if i % 2 == 0
        else SamplingParams(temperature=1.0, seed=i, max_tokens=300, grammar=spec)
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
    same = sum(a.token_ids == b.token_ids for a, b in zip(runs[True], runs[False]))
    parsed, errors = 0, []
    for out in runs[True][1::2]:
        try:
            value = json.loads(out.text)
            parsed += out.finish_reason == "stop" and isinstance(value, dict)
        except ValueError as exc:
            errors.append(str(exc)[:100])
    try:
        import jsonschema

        for out in runs[True][1::2]:
            jsonschema.validate(json.loads(out.text), NESTED_SCHEMA)
        validated = "all"
    except ImportError:
        validated = "jsonschema not installed"
    except Exception as exc:  # noqa: BLE001
        validated = f"FAILED: {exc}"[:200]
    ok = same == 48 and parsed == 24 and not validated.startswith("FAILED")
    report = {
        "check": "grammar-overlap", "model": str(model), "identical_with_and_without_overlap": f"{same}/48",
        "constrained_parsed": f"{parsed}/24", "validated": validated, "cuda_graphs": graphs[True],
        "errors": errors[:3], "ok": ok,
    }  # fmt: skip
    line = json.dumps(report)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
