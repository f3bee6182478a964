"""Where bf16 configurations part from the float32 reference on one prompt, layer by layer: a
diagnostic for the GPU machine, made for the Mixtral ``fa3,triton`` outlier (BENCHMARKS.md, "Qwen3-30B-A3B:
the experts' schedule in three Triton kernels...").

Each configuration prefills the prompt (one output token, CUDA graphs off so that the hooks run)
on the same random-weight test model as ``tools/device_e2e.py`` (its SHAPE and ARCH_SHAPE, its 32
prompts: ``--prompt`` is an index into them). Hooks record, for every decoder layer:

- the attention's output (o_proj's input): its relative distance ``‖x − ref‖ / ‖ref‖`` to the
  reference's. At layer 0 every bf16 configuration feeds the attention the same inputs, so that
  figure is the attention kernel's own error; later layers add what the layers before passed on;
- on a mixture of experts, the router's input (the same distance) and its choices: the tokens
  whose top-k set of experts differs from the reference's, and for those the reference's margin
  between its k-th and (k+1)-th logit. A choice flipped at a near tie is bf16 rounding; a flip
  across a wide margin, or a large distance at layer 0, points at the kernel.

The reference is the torch backend in float32. Also reported: the first token's logprob against
the reference's (the figure device_e2e's criterion (2) judges). The prompt runs alone here, where
device_e2e prefills all 32 together; ``--batched`` also reports each configuration's first token
and logprob for the prompt within that batch (no hooks). An outlier there and not alone points at
how the kernel handles a batch of sequences, not at the layers.

    python3 tools/device_layer_diff.py --arch MixtralForCausalLM --prompt 4 --batched \\
        --configs torch_bf16,fi,fa3_triton --json $OUT/layers.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from device_e2e import ARCH_SHAPE, SHAPE, e2e_prompts  # noqa: E402

from minisgl_core import LLM, SamplingParams  # noqa: E402
from minisgl_core.demo.factories import make_model_dir  # noqa: E402

#: configuration name -> LLM options (device_e2e's names); the hooked prefill runs without CUDA
#: graphs, ``--batched`` with them, as device_e2e runs its configurations
CONFIGS: dict[str, dict] = {
    "torch_bf16": dict(attn="torch"),
    "fi": dict(attn="fi"),
    "fi_triton": dict(attn="fi,triton"),
    "fa3_fi": dict(attn="fa3,fi"),
    "fa3_triton": dict(attn="fa3,triton"),
}


def capture(model_dir: str, prompt: list[int], device: str, dtype: str, **options) -> dict:
    """Prefill ``prompt`` once and return its per-layer records (CPU float32 tensors) and the
    first token with its logprob. Only the first forward is recorded (the prefill, in one step:
    overlap off, so no decode step runs after it)."""
    llm = LLM(
        model_dir,
        device=device,
        dtype=dtype,
        cuda_graph_max_bs=0,
        overlap=False,
        num_kv_tokens=20_000,
        **options,
    )
    layers = llm.engine.runner.model.model.layers
    records: list[dict[str, torch.Tensor]] = [{} for _ in layers]
    handles = []
    for i, layer in enumerate(layers):

        def attn_hook(module, args, i=i):
            if "attn" not in records[i]:
                records[i]["attn"] = args[0].detach().float().cpu()

        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(attn_hook))
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(layer.mlp, "top_k"):

            def router_hook(module, args, out, i=i):
                if "router_in" not in records[i]:
                    records[i]["router_in"] = args[0].detach().float().cpu()
                    records[i]["router_logits"] = out.detach().float().cpu()

            handles.append(gate.register_forward_hook(router_hook))
            records[i]["top_k"] = torch.tensor(layer.mlp.top_k)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, logprobs=1)
        out = llm.generate([prompt], params, use_tqdm=False)[0]
    finally:
        for h in handles:
            h.remove()
        del llm
        if device == "cuda":
            torch.cuda.empty_cache()
    rows = records[0]["attn"].shape[0]
    if rows != len(prompt):
        raise SystemExit(
            f"the first forward held {rows} of the prompt's {len(prompt)} tokens (a chunked prefill?)"
        )
    return {"layers": records, "token": out.token_ids[0], "logprob": out.logprobs[0].logprob}


def batched_first(model_dir: str, prompts: list[list[int]], index: int, device: str, dtype: str, **options):
    """The first token and its logprob for ``prompts[index]`` prefilled with all of ``prompts``."""
    llm = LLM(model_dir, device=device, dtype=dtype, num_kv_tokens=200_000, **options)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, logprobs=1)
        out = llm.generate(prompts, params, use_tqdm=False)[index]
    finally:
        del llm
        if device == "cuda":
            torch.cuda.empty_cache()
    return out.token_ids[0], out.logprobs[0].logprob


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


def compare(run: dict, ref: dict) -> dict:
    """One configuration's per-layer distances and router flips against the reference."""
    rows = []
    for layer, (got, want) in enumerate(zip(run["layers"], ref["layers"], strict=True)):
        row: dict = {"layer": layer, "attn_rel": round(rel(got["attn"], want["attn"]), 6)}
        if "router_logits" in want:
            k = int(want["top_k"])
            row["router_in_rel"] = round(rel(got["router_in"], want["router_in"]), 6)
            top_ref = want["router_logits"].topk(k + 1, -1)
            mine = got["router_logits"].topk(k, -1).indices.sort(-1).values
            theirs = top_ref.indices[:, :k].sort(-1).values
            flipped = (mine != theirs).any(-1)
            margins = top_ref.values[:, k - 1] - top_ref.values[:, k]
            row["router_flips"] = int(flipped.sum())
            row["last_token_flipped"] = bool(flipped[-1])
            if flipped.any():
                row["flip_margins"] = [round(float(m), 5) for m in margins[flipped].sort().values[:8]]
            row["ref_margin_min"] = round(float(margins.min()), 5)
        rows.append(row)
    return {
        "first_token": run["token"],
        "first_token_same": run["token"] == ref["token"],
        "first_logprob_diff": round(run["logprob"] - ref["logprob"], 4),
        "layers": rows,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="MixtralForCausalLM")
    parser.add_argument("--prompt", type=int, default=4, help="index into device_e2e's 32 prompts")
    parser.add_argument("--configs", default="torch_bf16,fi,fa3_triton", help=f"of {','.join(CONFIGS)}")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", help="write the report here too")
    parser.add_argument("--layers", type=int, help="override the test model's layer count")
    parser.add_argument(
        "--batched", action="store_true", help="also the prompt's first token within all 32 prompts' batch"
    )
    args = parser.parse_args()
    names = args.configs.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"unknown configurations {unknown}; choose from {', '.join(CONFIGS)}")
    shape = {**SHAPE, **ARCH_SHAPE.get(args.arch, {})}
    if args.layers:
        shape["num_hidden_layers"] = args.layers
    model_dir = str(make_model_dir(tempfile.mkdtemp() + "/m", args.arch, tokenizer_vocab_size=4096, **shape))
    prompts = e2e_prompts()
    prompt = prompts[args.prompt]
    ref = capture(model_dir, prompt, args.device, "float32", attn="torch")
    report = {
        "arch": args.arch,
        "prompt": args.prompt,
        "prompt_tokens": len(prompt),
        "reference": {"first_token": ref["token"], "first_logprob": round(ref["logprob"], 4)},
        "configs": {},
    }
    if args.batched:
        token, logprob = batched_first(model_dir, prompts, args.prompt, args.device, "float32", attn="torch")
        report["reference"]["batched"] = {"first_token": token, "first_logprob": round(logprob, 4)}
    for name in names:
        run = capture(model_dir, prompt, args.device, "bfloat16", **CONFIGS[name])
        report["configs"][name] = compare(run, ref)
        if args.batched:
            token, logprob = batched_first(
                model_dir, prompts, args.prompt, args.device, "bfloat16", **CONFIGS[name]
            )
            report["configs"][name]["batched"] = {
                "first_token": token,
                "first_logprob_diff": round(logprob - report["reference"]["batched"]["first_logprob"], 4),
            }
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
