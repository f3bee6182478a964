"""The offline engine on real weights: greedy output of the default model equals transformers'.

The default model (SmolLM2-135M-Instruct, GGUF Q4_1, dequantized to float32) runs through ``LLM``
with each cache plugin and page size the CPU supports; transformers loads the same GGUF file.
"""

from __future__ import annotations

import pytest

from minisgl_core.llm import LLM
from minisgl_core.sampling import SamplingParams
from minisgl_core.testing.real_model import MAX_TOKENS, PROMPTS
from minisgl_core.tokenizer.load import apply_chat_template


@pytest.fixture(scope="module")
def engines(default_model_dir):
    built: dict[tuple[str, int], LLM] = {}

    def get(cache: str, page_size: int) -> LLM:
        if (cache, page_size) not in built:
            built[cache, page_size] = LLM(
                default_model_dir,
                device="cpu",
                attn="torch",
                cache=cache,
                page_size=page_size,
                num_kv_tokens=8192,
            )
        return built[cache, page_size]

    yield get
    for llm in built.values():
        llm.close()


def test_the_default_model_is_smollm2_from_its_gguf(default_model_dir):
    llm = LLM(device="cpu", attn="torch", num_kv_tokens=2048)  # no model: the default one
    assert llm.config.model == str(default_model_dir)
    assert default_model_dir.name == "SmolLM2-135M-Instruct"
    assert llm.engine.runner.hf_config["architectures"] == ["LlamaForCausalLM"]
    assert llm.engine.eos_ids and 2 in llm.engine.eos_ids  # <|im_end|>
    assert llm.tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"
    ids = apply_chat_template(llm.tokenizer, [{"role": "user", "content": "hi"}])
    assert llm.tokenizer.convert_ids_to_tokens(ids[0]) == "<|im_start|>"  # no BOS in front


# each cache plugin and each page size once (the four pairs took 53 s of CI; the tiny models'
# tests run every pair). Radix at page size 1 (the defaults on the CPU) is the session's greedy run
# of these prompts (default_model_greedy_run, with logprobs: the quantization tests' reference)
# rather than a second run of the same engine; naive at 16 runs here, without logprobs.
@pytest.mark.parametrize(("cache", "page_size"), [("radix", 1), ("naive", 16)])
def test_greedy_output_equals_transformers(
    engines, real_references, default_model_greedy_run, cache, page_size
):
    llm = engines(cache, page_size)
    prompts = [ref.prompt_ids for ref in real_references]
    # our template rendering must agree with transformers' before the outputs can
    assert [apply_chat_template(llm.tokenizer, messages) for _, messages in PROMPTS] == prompts
    if (cache, page_size) == ("radix", 1):
        tokens, texts = default_model_greedy_run.tokens, default_model_greedy_run.texts
    else:
        outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
        tokens, texts = [out.token_ids for out in outputs], [out.text for out in outputs]
    for ref, token_ids, text in zip(real_references, tokens, texts, strict=True):
        assert token_ids == ref.output_ids, f"{ref.label}: {text!r} != transformers {ref.text!r}"
        assert text == ref.text, ref.label
    # and the prompt set covers what it claims: one ends early on eos, the long one is long
    by_label = {ref.label: ref for ref in real_references}
    assert len(by_label["early-eos"].output_ids) < MAX_TOKENS
    assert len(by_label["long-input"].prompt_ids) > 400


def test_capital_of_france(engines):
    llm = engines("radix", 1)
    ids = apply_chat_template(llm.tokenizer, [{"role": "user", "content": "What is the capital of France?"}])
    [out] = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=16))
    assert "Paris" in out.text


def test_stop_strings_of_multi_token_characters(engines):
    """On the default model an emoji is three tokens and a CJK character two or three: a stop of
    three emoji (nine tokens) was never found, and "\\ufffd" matched inside the first emoji."""
    llm = engines("radix", 1)
    prompt = "Emoji: 🎉🎉🎉🎉"
    [free] = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=24))
    assert free.text.startswith("🎉🎉🎉")  # what the stop must find
    [stopped] = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=24, stop=["🎉🎉🎉"]))
    assert (stopped.finish_reason, stopped.text) == ("stop", "")
    assert len(stopped.token_ids) == len(llm.tokenizer.encode("🎉🎉🎉", add_special_tokens=False))
    [fffd] = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=24, stop=["\ufffd"]))
    assert (fffd.finish_reason, fffd.text) == ("length", free.text)
