"""Sliding-window attention (API 2.7) on the GPU, through the engine: random-weight models of
three windowed architectures at real head sizes, with a window of 100 tokens (not a multiple of
a page), served in bf16 by the torch backend (eager, the reference) and by the GPU backends that
declare "sliding_window" (fi, fa3's prefill, triton's decode, and ``--attn auto``), graphs on and
off:

- Mistral: every layer slides (head size 128);
- Gemma 2: the even layers slide, with its soft-caps (head size 256);
- Gemma 3: every second layer slides, each kind of layer with its own rope (head size 256).

The prompts: 16 of 8-699 tokens, 4 of 90-99 (their decode crosses the window), and 4 that share
a 320-token prefix (the prefix cache, and a decode batch with shared prefixes: cascade, which a
windowed model must not run). Each configuration is judged against the reference: the first
greedy token where the reference's top-2 margin is clear (> 0.1), and the logprob of every
generated token while its tokens are the reference's (the same context) within 0.05. Also: the
window bites (the same weights with a window as long as the context move those logprobs by more
than 0.05 on the reference).

    source .whl/prelude.sh && python3 tools/device_window.py --out $OUT/window.json [--models mistral,gemma2]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
import traceback

from minisgl_core import LLM, SamplingParams
from minisgl_core.demo.factories import make_model_dir

WINDOW = 100
CONTEXT = 4096
COMMON = dict(hidden_size=512, num_attention_heads=8, num_key_value_heads=2, intermediate_size=1024,
              max_position_embeddings=CONTEXT, sliding_window=WINDOW, initializer_range=0.1)  # fmt: skip
MODELS = {
    "mistral": ("MistralForCausalLM", dict(COMMON, num_hidden_layers=4, head_dim=128)),
    "gemma2": (
        "Gemma2ForCausalLM",
        dict(
            COMMON,
            num_hidden_layers=4,
            head_dim=256,
            query_pre_attn_scalar=256,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
            tie_word_embeddings=False,
        ),
    ),  # fmt: skip
    "gemma3": (
        "Gemma3ForCausalLM",
        dict(
            COMMON,
            num_hidden_layers=4,
            head_dim=256,
            query_pre_attn_scalar=256,
            sliding_window_pattern=2,
            tie_word_embeddings=False,
        ),
    ),  # fmt: skip
}
#: model -> configurations; every one runs with graphs up to 32 sequences unless it says
CONFIGS = {
    "mistral": {
        "fi": dict(attn="fi"),
        "fi_no_graph": dict(attn="fi", cuda_graph_max_bs=0),
        "fa3,fi": dict(attn="fa3,fi"),
        "auto": dict(attn="auto"),
        "fi,triton": dict(attn="fi,triton"),
        "torch,triton": dict(attn="torch,triton"),
    },
    "gemma2": {
        "fi": dict(attn="fi"),
        "fi_no_graph": dict(attn="fi", cuda_graph_max_bs=0),
        "fa3,fi": dict(attn="fa3,fi"),
        "auto": dict(attn="auto"),
    },  # fmt: skip
    "gemma3": {"fi": dict(attn="fi"), "fi,triton": dict(attn="fi,triton")},  # fmt: skip
}
PARAMS = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=2)
LIMIT = 0.05


def prompts() -> list[list[int]]:
    rng = random.Random(0)
    out = [[rng.randrange(3, 1000) for _ in range(rng.randrange(8, 700))] for _ in range(16)]
    out += [[rng.randrange(3, 1000) for _ in range(rng.randrange(90, 100))] for _ in range(4)]
    prefix = [rng.randrange(3, 1000) for _ in range(320)]
    out += [prefix + [rng.randrange(3, 1000) for _ in range(rng.randrange(5, 60))] for _ in range(4)]
    return out


def serve(model_dir: str, batch: list[list[int]], **options) -> tuple[list, float]:
    options.setdefault("cuda_graph_max_bs", 32)
    options.setdefault("dtype", "bfloat16")
    start = time.perf_counter()
    with LLM(model_dir, **options) as llm:
        outs = llm.generate(batch, PARAMS, use_tqdm=False)
    return outs, time.perf_counter() - start


def agreeing_diffs(outs, ref) -> tuple[list[float], float]:
    """|Δ logprob| of every generated token while the tokens so far are the reference's, and the
    share of all generated tokens that is."""
    diffs, total = [], 0
    for o, r in zip(outs, ref, strict=True):
        total += len(r.token_ids)
        for a, b, la, lb in zip(o.token_ids, r.token_ids, o.logprobs, r.logprobs):
            diffs.append(abs(la.logprob - lb.logprob))
            if a != b:
                break
    return diffs, len(diffs) / total


def check_model(name: str, batch: list[list[int]]) -> tuple[dict, bool]:
    arch, shape = MODELS[name]
    model_dir = str(make_model_dir(tempfile.mkdtemp() + "/m", arch, tokenizer_vocab_size=4096, **shape))
    ref, seconds = serve(model_dir, batch, attn="torch", cuda_graph_max_bs=0, dtype="float32")
    clear = [o.logprobs[0].top[0][1] - o.logprobs[0].top[1][1] > 0.1 for o in ref]
    report: dict = {"clear_margin_prompts": sum(clear), "reference_seconds": round(seconds, 1), "configs": {}}
    ok = True
    # the yardstick: the torch backend in bf16 (the window applied exactly, only rounded)
    yard, _ = agreeing_diffs(serve(model_dir, batch, attn="torch", cuda_graph_max_bs=0)[0], ref)
    limit_max, limit_mean = max(LIMIT, 2 * max(yard)), max(LIMIT / 5, 1.5 * sum(yard) / len(yard))
    report["torch_bf16_max_diff"] = round(max(yard), 4)
    report["torch_bf16_mean_diff"] = round(sum(yard) / len(yard), 5)
    for config, options in CONFIGS[name].items():
        try:
            outs, seconds = serve(model_dir, batch, **options)
        except Exception:  # noqa: BLE001 - report and go on with the other configurations
            report["configs"][config] = {"error": traceback.format_exc()[-2500:]}
            ok = False
            continue
        first_ok = all(o.token_ids[0] == r.token_ids[0] for o, r, c in zip(outs, ref, clear) if c)
        diffs, share = agreeing_diffs(outs, ref)
        row = {
            "first_token_ok": first_ok,
            "logprob_max_diff": round(max(diffs), 4),
            "logprob_mean_diff": round(sum(diffs) / len(diffs), 5),
            "tokens_compared_share": round(share, 3),
            "seconds": round(seconds, 1),
        }
        row["ok"] = first_ok and max(diffs) <= limit_max and sum(diffs) / len(diffs) <= limit_mean
        ok &= row["ok"]
        report["configs"][config] = row
    config_path = f"{model_dir}/config.json"
    with open(config_path) as f:
        config = json.load(f)
    with open(config_path, "w") as f:
        json.dump({**config, "sliding_window": CONTEXT}, f)
    unwindowed, _ = serve(model_dir, batch, attn="torch", cuda_graph_max_bs=0, dtype="float32")
    bite, _ = agreeing_diffs(unwindowed, ref)
    report["no_window_logprob_max_diff"] = round(max(bite), 4)
    ok &= max(bite) > LIMIT
    report["ok"] = bool(ok)
    return report, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="/tmp/out/window.json")
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    batch = prompts()
    report: dict = {"window": WINDOW, "limit": LIMIT, "models": {}}
    ok = True
    for name in args.models.split(","):
        try:
            report["models"][name], passed = check_model(name, batch)
        except Exception:  # noqa: BLE001
            report["models"][name], passed = {"error": traceback.format_exc()[-2500:]}, False
        ok &= passed
        with open(args.out, "w") as f:  # after each model: a cut-off run keeps what finished
            json.dump({**report, "passed": bool(ok)}, f, indent=2)
    print(json.dumps({**report, "passed": bool(ok)}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
