"""Gemma and Gemma 2 served by the engine (the offline ``LLM``, the plugin found by its entry
point): greedy tokens, their logprobs and the prompt's logprobs are transformers' (the final
soft-cap applied to every logit the engine reads); a context of at most Gemma 2's sliding window
is served as transformers computes it (longer ones: ``tests/test_sliding_window.py``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from minisgl_core.checkpoint.formats import load_hf_config
from minisgl_core.sampling import SamplingParams
from minisgl_core.testing import cpu_llm, make_model_dir
from minisgl_core.testing.reference import TransformersReference, random_prompt

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2, prompt_logprobs=2)
CAPS = dict(attn_logit_softcapping=2.0, final_logit_softcapping=3.0, query_pre_attn_scalar=8)


@pytest.fixture(
    scope="module",
    params=[("GemmaForCausalLM", dict(initializer_range=0.7)), ("Gemma2ForCausalLM", dict(tie_word_embeddings=False, **CAPS))],
    ids=["gemma-tied", "gemma2-capped"],
)  # fmt: skip
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    arch, overrides = request.param
    return make_model_dir(tmp_path_factory.mktemp("gemma") / "m", arch, seed=3, **overrides)


def prompts(model_dir: Path) -> list[list[int]]:
    vocab_size = load_hf_config(model_dir)["vocab_size"]
    return [random_prompt(n, vocab_size, seed=i) for i, n in enumerate((7, 40, 13))]


@torch.inference_mode()
def prompt_log_softmax(reference: TransformersReference, prompt: list[int]) -> torch.Tensor:
    """[len(prompt), vocab] log-probabilities of the next token after each prompt position."""
    return reference.model(input_ids=torch.tensor([prompt])).logits[0].float().log_softmax(-1)


def test_the_engine_generates_transformers_greedy_tokens_and_logprobs(model_dir: Path) -> None:
    with cpu_llm(model_dir) as llm:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts(model_dir)], GREEDY, use_tqdm=False)
    reference = TransformersReference(model_dir)
    for prompt, output in zip(prompts(model_dir), outputs, strict=True):
        expected, logits = reference.greedy(prompt, GREEDY.max_tokens - 1)
        assert output.token_ids == expected
        for entry, step in zip(output.logprobs, logits, strict=True):
            logprobs = step.log_softmax(-1)
            assert abs(entry.logprob - float(logprobs.max())) < 1e-4, (entry.logprob, float(logprobs.max()))
            for token, logprob in entry.top:
                assert abs(logprob - float(logprobs[token])) < 1e-4
        # the prompt's own logprobs (the whole prompt's logits, not only the last position's)
        expected_prompt = prompt_log_softmax(reference, prompt)
        assert output.prompt_logprobs[0] is None and len(output.prompt_logprobs) == len(prompt)
        for position, entry in enumerate(output.prompt_logprobs[1:]):
            want = float(expected_prompt[position, prompt[position + 1]])
            assert abs(entry.logprob - want) < 1e-4, (position, entry.logprob, want)
    assert len({t for output in outputs for t in output.token_ids}) > 5


def test_a_context_of_at_most_the_window_is_served_as_transformers_computes_it(tmp_path: Path) -> None:
    """A 48-token window with the context capped at 48: every sequence fits in the window, where
    transformers' sliding-window layers attend fully; greedy tokens and logprobs match."""
    model_dir = make_model_dir(
        tmp_path / "g2", "Gemma2ForCausalLM", seed=5, sliding_window=48, tie_word_embeddings=False, **CAPS
    )
    prompt = random_prompt(28, load_hf_config(model_dir)["vocab_size"], seed=2)
    params = SamplingParams(
        temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=0
    )  # 28 + 20: the window
    with cpu_llm(model_dir, max_context_len=48) as llm:
        (out,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    want, logits = TransformersReference(model_dir).greedy(prompt, 19)
    assert out.token_ids == want and len(set(want)) > 1
    for entry, step in zip(out.logprobs, logits, strict=True):
        assert math.isclose(entry.logprob, float(step.log_softmax(-1).max()), abs_tol=1e-4)
