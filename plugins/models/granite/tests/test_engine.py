"""GraniteForCausalLM served by the engine (the offline ``LLM``, the plugin found by its entry
point): its greedy tokens and their logprobs are transformers'; under ``--quantization int8`` the multipliers are
folded into the weights before they are quantized, so the prompt's logprobs stay near
transformers'."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from minisgl_core.checkpoint.formats import load_hf_config
from minisgl_core.sampling import SamplingParams
from minisgl_core.testing import cpu_llm, make_model_dir
from minisgl_core.testing.reference import TransformersReference, random_prompt

MULTIPLIERS = dict(embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125,
                   logits_scaling=8.0)  # fmt: skip
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(
        tmp_path_factory.mktemp("granite") / "m", "GraniteForCausalLM", seed=3, **MULTIPLIERS
    )


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
        # (logprobs, not only tokens: a logits scale changes no greedy token)
        expected_logprobs = [float(step.log_softmax(-1).max()) for step in logits]
        for entry, logprob in zip(output.logprobs, expected_logprobs, strict=True):
            assert abs(entry.logprob - logprob) < 1e-4, (entry.logprob, logprob)
    assert len({t for output in outputs for t in output.token_ids}) > 5


def test_int8_quantizes_the_folded_weights(model_dir: Path) -> None:
    prompt = prompts(model_dir)[1]
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    with cpu_llm(model_dir, quantization="int8") as llm:
        (output,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    actual = torch.tensor([entry.logprob for entry in output.prompt_logprobs[1:]])
    with torch.inference_mode():
        logits = TransformersReference(model_dir).model(input_ids=torch.tensor([prompt])).logits[0, :-1]
    expected = logits.float().log_softmax(-1).gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
    error = float((actual - expected).abs().max())
    print("ERR", error)
    assert 0 < error < 0.005, error  # rounded (about 5e-4 here), and only rounded
