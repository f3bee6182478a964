"""The default model (SmolLM2-135M-Instruct GGUF) in bf16 on the GPU against transformers in bf16.

Issue 16 asks that greedy output with the fi and fa3,fi backends agree with transformers bf16 on
at least 95% of tokens over the real-model prompts of ``minisgl_core.testing.real_model``. Two
measures per backend, both over our greedy tokens:

- ``prefix``: tokens before the first divergence from transformers' own greedy continuation,
  over the longer of the two (the strict one: after a near-tie flips, the rest differs too);
- ``forced``: tokens that transformers bf16 also picks as its argmax given our prefix (one
  teacher-forced forward per prompt), i.e. agreement position by position.

transformers float32 against transformers bf16 on the same measures shows how far bf16 alone
moves greedy output. Runs on CPU too (``--device cpu --attn torch --dtype float32``).

    python3 tools/device_real_bf16.py --model DIR [--attn fi fa3,fi] [--max-tokens 64] [--out F]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from minisgl_core.llm import LLM
from minisgl_core.sampling import SamplingParams
from minisgl_core.testing.real_model import PROMPTS, gguf_file
from minisgl_core.tokenizer.load import apply_chat_template


def load_transformers(model_dir: str, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM

    path = gguf_file(model_dir)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    return model.to(device).eval()


@torch.inference_mode()
def transformers_greedy(model, prompts: list[list[int]], max_tokens: int, eos: int) -> list[list[int]]:
    outputs = []
    for ids in prompts:
        inputs = torch.tensor([ids], device=model.device)
        out = model.generate(
            inputs,
            attention_mask=torch.ones_like(inputs),
            do_sample=False,
            max_new_tokens=max_tokens,
            eos_token_id=eos,
            pad_token_id=eos,
        )
        outputs.append(out[0, len(ids) :].tolist())
    return outputs


@torch.inference_mode()
def forced_matches(model, prompt: list[int], output: list[int]) -> int:
    """How many of ``output``'s tokens are ``model``'s argmax given the prompt and the tokens before."""
    ids = torch.tensor([prompt + output], device=model.device)
    logits = model(ids).logits[0, len(prompt) - 1 : len(prompt) + len(output) - 1]
    return int((logits.argmax(-1).cpu() == torch.tensor(output)).sum())


def agreement(model, prompts, outputs, references) -> dict[str, float]:
    prefix = total = forced = generated = exact = 0
    for prompt, ours, ref in zip(prompts, outputs, references, strict=True):
        same = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
        prefix += same
        total += max(len(ours), len(ref))
        forced += forced_matches(model, prompt, ours)
        generated += len(ours)
        exact += ours == ref
    return {
        "prefix": prefix / total,
        "forced": forced / generated,
        "exact_sequences": exact,
        "sequences": len(prompts),
        "tokens": generated,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="directory holding the GGUF")
    parser.add_argument("--attn", nargs="+", default=["fi", "fa3,fi"])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default=None, help="write the results as JSON here too")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)

    started = time.perf_counter()
    reference = load_transformers(args.model, dtype, args.device)
    from transformers import AutoTokenizer

    path = gguf_file(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts = [apply_chat_template(tokenizer, messages) for _, messages in PROMPTS]
    references = transformers_greedy(reference, prompts, args.max_tokens, eos)
    results: dict[str, object] = {"dtype": args.dtype, "max_tokens": args.max_tokens, "prompts": len(prompts)}

    # how far the precision alone moves greedy output: transformers float32 judged by transformers bf16
    if dtype != torch.float32:
        full = load_transformers(args.model, torch.float32, args.device)
        full_outputs = transformers_greedy(full, prompts, args.max_tokens, eos)
        del full
        results["transformers-float32"] = agreement(reference, prompts, full_outputs, references)
        print("transformers float32 vs bf16:", results["transformers-float32"], flush=True)

    for attn in args.attn:
        llm = LLM(args.model, device=args.device, attn=attn, dtype=args.dtype, num_kv_tokens=16384)
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=args.max_tokens))
        results[attn] = agreement(reference, prompts, [o.token_ids for o in outs], references)
        results[attn]["first_divergence"] = {
            label: next((i for i, (a, b) in enumerate(zip(o.token_ids, r)) if a != b), None)
            for (label, _), o, r in zip(PROMPTS, outs, references, strict=True)
        }
        print(f"minisgl {attn} vs transformers {args.dtype}:", results[attn], flush=True)
        llm.close()
    results["seconds"] = round(time.perf_counter() - started, 1)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
