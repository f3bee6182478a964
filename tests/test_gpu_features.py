"""Every engine feature starts and steps on a GPU under the default backends (``--attn auto``):
speculation, a float8 KV pool, FP8 weights, mixed steps and page size 1, alone and together, on a
small random Qwen3 of a real head size (128), with more requests than the engine runs at once.

Greedy and sampled requests must each run to ``max_tokens``; with drafts on, verify steps must
run and accept some. CUDA only: on the CPU these features run under the ``torch`` backend in
their own tests. Added after speculation under ``auto`` had failed at start-up for a week
unnoticed (an illegal memory access in the Triton decode's verify graphs; BENCHMARKS.md, "Speculation
under `auto` failed at start-up...")."""

from __future__ import annotations

import random

import pytest
import torch

from minisgl_core import SamplingParams
from minisgl_core.demo.factories import make_model_dir

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SPEC = dict(speculative_algorithm="ngram", speculative_num_draft_tokens=4)
FEATURES = {
    "plain": {},
    "speculative": SPEC,
    "fp8_kv": dict(kv_cache_dtype="fp8_e4m3"),
    "fp8_weights": dict(quantization="fp8"),
    "mixed": dict(mixed_batch=True),
    "page_size_1": dict(page_size=1),
    "speculative_fp8_kv_fp8_weights": SPEC | dict(kv_cache_dtype="fp8_e4m3", quantization="fp8"),
}
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(
        tmp_path_factory.mktemp("features") / "q", "Qwen3ForCausalLM", hidden_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=128, intermediate_size=512,
        max_position_embeddings=2048,
    )  # fmt: skip


def prompts() -> list[list[int]]:
    """Twelve prompts, half of them a piece repeated (the n-gram drafter finds continuations)."""
    rng = random.Random(0)
    out = []
    for i in range(12):
        piece = [rng.randrange(5, 1000) for _ in range(rng.randrange(4, 12))]
        out.append(
            piece * 5 if i % 2 == 0 else [rng.randrange(5, 1000) for _ in range(rng.randrange(8, 300))]
        )
    return out


def feature_llm(model_dir, name: str):
    """An LLM on the GPU under the default backends with feature ``name`` on, fewer request slots
    than :func:`prompts` has."""
    from minisgl_core.llm import LLM

    return LLM(
        str(model_dir),
        device="cuda",
        attn="auto",
        max_running_requests=8,
        num_kv_tokens=16384,
        **FEATURES[name],
    )


@pytest.mark.parametrize("name", list(FEATURES))
def test_each_feature_runs_under_the_default_backends(model_dir, name):
    llm = feature_llm(model_dir, name)
    try:
        for params in (
            SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True),
            SamplingParams(temperature=0.8, top_p=0.9, max_tokens=MAX_TOKENS, ignore_eos=True, seed=1),
        ):
            outs = llm.generate(prompts(), params, use_tqdm=False)
            assert [len(o.token_ids) for o in outs] == [MAX_TOKENS] * len(outs), name
            assert {o.finish_reason for o in outs} == {"length"}, name
        stats = llm.engine.stats()
    finally:
        llm.close()
    if "speculative_algorithm" in FEATURES[name]:
        assert stats["spec_verify_steps"] > 0 and stats["spec_accepted_tokens"] > 0, stats


@pytest.mark.parametrize("name", ["plain", "speculative"])
def test_allowed_token_ids_and_bad_words_hold_on_the_gpu(model_dir, name):
    """vLLM's allowed_token_ids and bad_words under CUDA graphs and overlap (drafts too): every
    sampled token is an allowed one, no banned pair appears, greedy and sampled; a request whose
    constraints leave no token ends as "invalid" without the token its empty row gave (the GPU
    sampler's draw from a row of -inf), and the others run to max_tokens."""
    llm = feature_llm(model_dir, name)
    try:
        free = llm.generate(
            prompts(), SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        )
        allowed = sorted({t for o in free for t in o.token_ids[1::2]} | {7, 8, 9})
        pairs = [tuple(o.token_ids[2:4]) for o in free]  # a pair each free run wrote
        for temperature in (0.0, 0.8):
            params = SamplingParams(
                temperature=temperature, top_p=0.9, max_tokens=MAX_TOKENS, ignore_eos=True, seed=1,
                allowed_token_ids=allowed,
            )  # fmt: skip
            outs = llm.generate(prompts(), params, use_tqdm=False)
            assert all(len(o.token_ids) == MAX_TOKENS and set(o.token_ids) <= set(allowed) for o in outs)
            banned = [
                SamplingParams(temperature=temperature, max_tokens=MAX_TOKENS, ignore_eos=True, seed=2,
                               bad_words_token_ids=[pair])
                for pair in pairs
            ]  # fmt: skip
            outs = llm.generate(prompts(), banned, use_tqdm=False)
            for out, pair in zip(outs, pairs):
                assert len(out.token_ids) == MAX_TOKENS, name
                assert all(tuple(out.token_ids[i : i + 2]) != pair for i in range(MAX_TOKENS - 1)), (
                    pair,
                    out.token_ids,
                )
        # after a, both bad words ban what is left of the two allowed tokens: a dead second row
        # (one dead at the first token admission refuses, before anything runs)
        a, b = 40, 41
        empty = SamplingParams(
            temperature=0.0, max_tokens=MAX_TOKENS, allowed_token_ids=[a, b],
            bad_words_token_ids=[[a, a], [a, b]], logit_bias={a: 100},
        )  # fmt: skip
        outs = llm.generate(
            prompts()[:2], [empty, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)]
        )
        assert (outs[0].finish_reason, outs[0].token_ids) == ("invalid", [a]), outs[0]
        assert outs[0].error.startswith("no token is left to sample after 1 output token(s)")
        assert outs[1].finish_reason == "length" and len(outs[1].token_ids) == MAX_TOKENS
    finally:
        llm.close()


@pytest.mark.parametrize("name", ["plain", "fp8_weights", "speculative", "plain_staged_on_host"])
def test_new_weights_run_in_the_captured_graphs(model_dir, tmp_path, name, monkeypatch):
    """``update_weights_from_disk`` copies the new weights into the tensors the CUDA graphs (decode
    and piecewise prefill) were captured on: the engine then answers as one started on them, FP8
    weights (their scales) included, and back on the old ones as before. ``plain_staged_on_host``:
    the GPU has no room for the second copy (as when the KV pool took it), so the new weights load
    in host memory and are copied from there."""
    from minisgl_core.runner import model_runner

    staged_on: list[str] = []
    if name == "plain_staged_on_host":
        free = model_runner._free_for_tensors
        monkeypatch.setattr(
            model_runner, "_free_for_tensors", lambda device: 0 if device.type == "cuda" else free(device)
        )
        load = model_runner.ModelRunner._load_model

        def spied(self, plugins, before_weights=None, device=None):
            staged_on.append(str(device))
            return load(self, plugins, before_weights, device)

        monkeypatch.setattr(model_runner.ModelRunner, "_load_model", spied)
        name = "plain"
    other = make_model_dir(
        tmp_path / "q", "Qwen3ForCausalLM", seed=7, hidden_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=128, intermediate_size=512,
        max_position_embeddings=2048,
    )  # fmt: skip
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    fresh = feature_llm(other, name)
    try:
        reference = [o.token_ids for o in fresh.generate(prompts(), greedy, use_tqdm=False)]
    finally:
        fresh.close()
    llm = feature_llm(model_dir, name)
    try:
        assert llm.engine.runner.graphs is not None
        before = [o.token_ids for o in llm.generate(prompts(), greedy, use_tqdm=False)]
        assert before != reference
        llm.update_weights_from_disk(other)
        assert [o.token_ids for o in llm.generate(prompts(), greedy, use_tqdm=False)] == reference
        llm.update_weights_from_disk(model_dir)
        assert [o.token_ids for o in llm.generate(prompts(), greedy, use_tqdm=False)] == before
        if staged_on:
            assert staged_on[-2:] == ["cpu", "cpu"], staged_on
    finally:
        llm.close()
