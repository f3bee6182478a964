"""GPU check of constrained decoding inside CUDA graphs and overlap (issue 18): free requests get
the same greedy tokens alone as beside constrained ones (whose sampling the engine launches one
step late, after the next step is planned), and every constrained output parses as its schema says.

    python3 tools/device_grammar_check.py [--out FILE]     # prints one JSON line; exit 1 on failure
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
    p.add_argument("--out")
    p.add_argument("--device", default="cuda", help="cpu runs the same check in float32 (no graphs)")
    args = p.parse_args()
    model = make_model_dir(  # head_dim 64: FlashInfer has no kernels for the tiny default's 16
        Path(tempfile.mkdtemp()) / "qwen3", "Qwen3ForCausalLM", max_position_embeddings=1024,
        hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    )  # fmt: skip
    prompts = [[10 + i % 50, 20 + i % 7, 30 + i % 11, 40 + i % 13] for i in range(48)]
    free = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    spec = GrammarSpec("json_schema", json.dumps(NESTED_SCHEMA))
    report: dict = {"check": "grammar-gpu"}
    ok = True
    for overlap in (True, False):
        llm = LLM(
            str(model),
            device=args.device,
            dtype="bfloat16" if args.device == "cuda" else "float32",
            overlap=overlap,
        )
        alone = [o.token_ids for o in llm.generate(prompts[:24], free, use_tqdm=False)]
        mixed_prompts = [q for pair in zip(prompts[:24], prompts[24:]) for q in pair]
        mixed_params = [
            x
            for i in range(24)
            for x in (free, SamplingParams(temperature=1.0, seed=i, max_tokens=300, grammar=spec))
        ]
        mixed = llm.generate(mixed_prompts, mixed_params, use_tqdm=False)
        same = sum(a == m.token_ids for a, m in zip(alone, mixed[0::2]))
        parsed = 0
        for out in mixed[1::2]:
            try:
                value = json.loads(out.text)
                parsed += out.finish_reason == "stop" and isinstance(value, dict)
            except ValueError:
                pass
        try:
            import jsonschema

            for out in mixed[1::2]:
                jsonschema.validate(json.loads(out.text), NESTED_SCHEMA)
            validated = "all"
        except ImportError:
            validated = "jsonschema not installed"
        except Exception as exc:  # noqa: BLE001
            validated = f"FAILED: {exc}"[:200]
        graphs = llm.engine.runner.graphs is not None
        llm.close()
        key = "overlap" if overlap else "no_overlap"
        report[key] = {"free_identical": f"{same}/24", "constrained_parsed": f"{parsed}/24",
                       "validated": validated, "cuda_graphs": graphs}  # fmt: skip
        ok &= same == 24 and parsed == 24 and not validated.startswith("FAILED")
    report["ok"] = ok
    line = json.dumps(report)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
