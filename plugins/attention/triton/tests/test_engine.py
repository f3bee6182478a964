"""The Triton decode backend inside the engine: ``--attn torch,triton`` (the torch backend's
prefill, this decode) gives the greedy tokens of ``--attn torch`` and logprobs within float
rounding of them: a random Llama over a float8 pool, a random Qwen3 (QK-norm) over a float32
one, both of GQA group 4; and prompts sharing system prompts through the radix cache, where the
Triton backend runs cascade decode steps (its prefix kernel); and n-gram speculation, whose verify
steps hold several sequences a request (more than the page table's rows: the backend's partial
outputs are sized by ``AttentionConfig.max_sequences``); and a Mistral whose 8-token window
(API 2.7) the decode kernel applies, for which the core forms no cascade groups. On the CPU under Triton's
interpreter, in a child process (on a GPU the same comparison runs in tools/device_e2e.py's
configurations). The reference runs in PyTorch alone (rotary and the KV store eager, not the fused
rope + KV store kernel, which the Triton run uses as the GPU does), so the comparison checks that
kernel too."""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile

import pytest
import torch

from minisgl_core.testing.triton_interpreter import run_under_interpreter

pytest.importorskip("triton")

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [100, 3], list(range(40, 110))]
MAX_TOKENS = 6  # (each decode step under the interpreter costs seconds in CI)
#: the model's RMS norm and SiLU kernels (the same in both runs, checked by tests/test_triton_ops.py)
#: run eagerly: under the interpreter they cost as much as the attention under test
INTERPRETER_ENV = {"MINISGL_TRITON_NORM": "0", "MINISGL_TRITON_SILU": "0"}


def shared_prompts() -> list[list[int]]:
    """Two system prompts with three questions each, and two lone prompts."""
    rng = random.Random(0)
    systems = [[rng.randrange(5, 500) for _ in range(rng.randrange(40, 60))] for _ in range(2)]
    prompts = [
        s + [rng.randrange(5, 500) for _ in range(rng.randrange(1, 8))] for s in systems for _ in range(3)
    ]
    return prompts + [[rng.randrange(5, 500) for _ in range(15)] for _ in range(2)]


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="the interpreter's check; the GPU has tools/device_e2e.py"
)
@pytest.mark.parametrize(
    "arch, kv_cache_dtype, prompts",
    [("LlamaForCausalLM", "fp8_e4m3", "plain"), ("Qwen3ForCausalLM", "auto", "plain"),
     ("Qwen3ForCausalLM", "auto", "shared"), ("Qwen3ForCausalLM", "auto", "speculative"),
     ("MistralForCausalLM", "auto", "windowed")],
)  # fmt: skip
def test_triton_decode_gives_the_torch_backends_greedy_tokens(arch, kv_cache_dtype, prompts):
    out = run_under_interpreter(__file__, arch, kv_cache_dtype, prompts, env=INTERPRETER_ENV)
    runs = json.loads(out.splitlines()[-1])
    reference, triton = runs["torch"], runs["torch,triton"]
    if prompts == "shared":  # the Triton backend's cascade ran: two groups in (nearly) every step
        assert runs["cascade_steps"] >= MAX_TOKENS - 1 and runs["most_groups"] == 2, runs
    if prompts == "windowed":  # an 8-token window in every layer (API 2.7), under prompts of 40-60
        # tokens sharing system prompts: no cascade groups offered (a window may hide part of a
        # prefix; the backend's own guard is the kit's test_sliding_window_cascade_decode)
        assert runs["window"] == 8 and runs["cascade_steps"] == 0 and runs["offered_groups"] == 0, runs
    if prompts == "speculative":  # verify steps ran on the Triton backend, with more sequences than rows
        assert runs["spec_verify_steps"] > 0 and runs["spec_accepted_tokens"] > 0, runs
        assert runs["most_sequences"] > runs["max_requests"], runs
    for ref, got in zip(reference, triton, strict=True):
        assert got["tokens"] == ref["tokens"]
        worst = max(abs(a - b) for a, b in zip(got["logprobs"], ref["logprobs"], strict=True))
        # float32 products over the same pool (float8: both read the same dequantized values,
        # the kernel multiplies in float16)
        assert worst < (2e-2 if kv_cache_dtype == "fp8_e4m3" else 1e-4), worst


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the interpreter's case is above)")
def test_speculation_with_cuda_graphs_gives_the_plain_greedy_tokens(tmp_path):
    """On a GPU the verify steps replay CUDA graphs of up to ``max_requests x (1 + drafts)``
    sequences, captured at start-up: with the partial outputs sized for one sequence a request
    (until API 2.2) that capture failed with an illegal memory access. float32, so that the
    verify step's other batch shape moves no greedy token."""
    from minisgl_core.demo.factories import make_model_dir
    from minisgl_core.llm import LLM

    model = make_model_dir(tmp_path / "q", "Qwen3ForCausalLM", max_position_embeddings=1024)
    runs = []
    for spec in ({}, dict(speculative_algorithm="ngram", speculative_num_draft_tokens=4)):
        llm = LLM(
            str(model), device="cuda", dtype="float32", attn="torch,triton", page_size=16,
            num_kv_tokens=8192, max_running_requests=4, **spec,
        )  # fmt: skip
        try:
            params = llm.sampling_params(temperature=0.0, max_tokens=24, ignore_eos=True)
            runs.append([o.token_ids for o in llm.generate(copy_prompts(), params, use_tqdm=False)])
            stats = llm.engine.stats()
        finally:
            llm.close()
    assert runs[1] == runs[0]
    assert stats["spec_verify_steps"] > 0


def copy_prompts() -> list[list[int]]:
    """Two prompts that repeat a piece (the n-gram drafter proposes its continuation), one that
    does not."""
    rng = random.Random(1)
    pieces = [[rng.randrange(5, 500) for _ in range(6)] for _ in range(2)]
    return [p * 4 for p in pieces] + [[rng.randrange(5, 500) for _ in range(12)]]


def child(arch: str, kv_cache_dtype: str, prompts: str) -> None:
    from minisgl_core.demo.factories import make_model_dir
    from minisgl_core.llm import LLM
    from minisgl_core.scheduler import cascade

    # cascade for any saving, so these short prompts run it (the engine is in this process)
    cascade.MIN_SAVED_TOKENS, cascade.MIN_SAVED_SHARE = 0, 0.0
    with tempfile.TemporaryDirectory() as tmp:
        window = {"sliding_window": 8} if prompts == "windowed" else {}
        model = make_model_dir(
            tmp, arch, num_attention_heads=8, num_key_value_heads=2, head_dim=32, hidden_size=128, **window
        )
        runs: dict = {"cascade_steps": 0, "most_groups": 0, "most_sequences": 0, "offered_groups": 0}
        # two requests in flight: a verify step of both holds 2 x (1 + 4) sequences, more than the
        # page table's three rows
        spec = (
            dict(speculative_algorithm="ngram", speculative_num_draft_tokens=4, max_running_requests=2)
            if prompts == "speculative"
            else {}
        )
        for attn in ("torch", "torch,triton"):
            # the reference in PyTorch alone; the Triton run with the fused rope + KV store
            os.environ["MINISGL_FUSED_KV"] = "0" if attn == "torch" else "1"
            llm = LLM(
                str(model), attn=attn, device="cpu", kv_cache_dtype=kv_cache_dtype, num_kv_tokens=1024, **spec
            )
            params = llm.sampling_params(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
            scheduler = llm.engine.scheduler
            build = scheduler._build_decode

            def spy(plan, build=build, attn=attn, decode=llm.engine.runner.decode_attn):
                scheduled = build(plan)
                groups = scheduled.forward.shared_prefixes if scheduled is not None else None
                if groups and attn == "torch,triton":
                    runs["offered_groups"] += 1
                    # (the backend's plan: a cascade step's has its skip and task rows)
                    if len(decode._plan(scheduled.forward.seq_lens_cpu, groups)) > 1:
                        runs["cascade_steps"] += 1
                        runs["most_groups"] = max(runs["most_groups"], len(groups))
                return scheduled

            scheduler._build_decode = spy
            if spec and attn == "torch,triton":
                backend = llm.engine.runner.decode_attn
                runs["max_requests"] = backend.config.max_requests
                metadata = backend._metadata

                def sized(req_slots, seq_lens, plan, bs, metadata=metadata):
                    runs["most_sequences"] = max(runs["most_sequences"], bs)
                    return metadata(req_slots, seq_lens, plan, bs)

                backend._metadata = sized
            chosen = {"plain": PROMPTS, "shared": shared_prompts(), "speculative": copy_prompts(),
                      "windowed": shared_prompts()}[prompts]  # fmt: skip
            runs["window"] = llm.engine.runner.decode_attn.config.sliding_window
            outputs = llm.generate(chosen, params, use_tqdm=False)
            runs[attn] = [
                {"tokens": o.token_ids, "logprobs": [lp.logprob for lp in o.logprobs]} for o in outputs
            ]
            if spec and attn == "torch,triton":
                runs.update({k: llm.engine.stats()[k] for k in ("spec_verify_steps", "spec_accepted_tokens")})
            llm.close()
        print(json.dumps(runs))


if __name__ == "__main__":
    child(*sys.argv[1:])
