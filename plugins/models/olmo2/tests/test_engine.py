"""Olmo2ForCausalLM served by the engine (the offline ``LLM``, the plugin found by its entry
point): its greedy tokens and their logprobs are transformers'."""

from __future__ import annotations

from pathlib import Path

import pytest

from minisgl_core.checkpoint.formats import load_hf_config
from minisgl_core.sampling import SamplingParams
from minisgl_core.testing import cpu_llm, make_model_dir
from minisgl_core.testing.reference import TransformersReference, random_prompt

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("olmo2") / "m", "Olmo2ForCausalLM", seed=3)


def prompts(model_dir: Path) -> list[list[int]]:
    vocab_size = load_hf_config(model_dir)["vocab_size"]
    return [random_prompt(n, vocab_size, seed=i) for i, n in enumerate((7, 20, 13))]


def test_the_engine_generates_transformers_greedy_tokens(model_dir: Path) -> None:
    with cpu_llm(model_dir) as llm:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts(model_dir)], GREEDY, use_tqdm=False)
    reference = TransformersReference(model_dir)
    for prompt, output in zip(prompts(model_dir), outputs, strict=True):
        expected, logits = reference.greedy(prompt, GREEDY.max_tokens - 1)
        assert output.token_ids == expected
        expected_logprobs = [float(step.log_softmax(-1).max()) for step in logits]
        for entry, logprob in zip(output.logprobs, expected_logprobs, strict=True):
            assert abs(entry.logprob - logprob) < 1e-4, (entry.logprob, logprob)
    assert len({t for output in outputs for t in output.token_ids}) > 5
