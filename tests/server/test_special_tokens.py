"""A text prompt gets the tokenizer's special tokens (a Llama's BOS), as vLLM's and SGLang's
completions and vLLM's ``LLM`` encode it: text prompts were encoded without them, so a model whose
tokenizer adds a BOS (Llama 3, Mistral) saw another input than under those engines. The tiny model's
tokenizer gets a post-processor that puts ``<|endoftext|>`` (id 0) first, as Llama 3's puts
``<|begin_of_text|>``."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from minisgl_core import SamplingParams
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.testing import cpu_llm

from .conftest import ENGINE_ARGS

BOS = 0
PROMPT = "The quick brown fox"


def _add_bos(model_dir: Path) -> Path:
    path = model_dir / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {
            "<|endoftext|>": {"id": "<|endoftext|>", "ids": [BOS], "tokens": ["<|endoftext|>"]}
        },
    }
    path.write_text(json.dumps(tokenizer))
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["bos_token"] = "<|endoftext|>"
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    return model_dir


@pytest.fixture(scope="module")
def bos_model(tmp_path_factory) -> Path:
    return _add_bos(make_model_dir(tmp_path_factory.mktemp("bos") / "tiny-bos", "Qwen3ForCausalLM", seed=3))


@pytest.fixture(scope="module")
def reference(bos_model):
    """Greedy tokens of the prompt with and without the BOS, given as ids, from the offline engine;
    and what the offline engine makes of the prompt as text."""
    with cpu_llm(bos_model) as llm:
        plain = list(llm.tokenizer.encode(PROMPT, add_special_tokens=False))
        assert plain[0] != BOS
        greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        with_bos, without, as_text = llm.generate([[BOS, *plain], plain, PROMPT], greedy)
        assert with_bos.token_ids != without.token_ids  # the BOS changes the answer: the test can tell
        return {"plain": plain, "with_bos": with_bos.token_ids, "without": without.token_ids, "text": as_text}


def test_the_offline_llm_encodes_a_text_prompt_with_the_bos(reference):
    assert reference["text"].prompt_token_ids == [BOS, *reference["plain"]]
    assert reference["text"].token_ids == reference["with_bos"]


def test_completions_tokenize_and_generate_put_the_bos_first(start_server, bos_model, reference):
    server = start_server(["--model", str(bos_model), *ENGINE_ARGS])
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    out = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
    assert out["choices"][0]["prompt_token_ids"] == [BOS, *reference["plain"]], out
    assert out["choices"][0]["token_ids"] == reference["with_bos"]
    assert out["usage"]["prompt_tokens"] == len(reference["plain"]) + 1
    # vLLM's field turns it off
    out = httpx.post(
        f"{server.url}/v1/completions", json={**body, "add_special_tokens": False}, timeout=60
    ).json()
    assert out["choices"][0]["prompt_token_ids"] == reference["plain"], out
    assert out["choices"][0]["token_ids"] == reference["without"]
    # /tokenize counts as completions does, by default and with the field
    tokens = httpx.post(f"{server.url}/tokenize", json={"prompt": PROMPT}, timeout=60).json()
    assert tokens["tokens"] == [BOS, *reference["plain"]], tokens
    tokens = httpx.post(f"{server.url}/tokenize", json={"prompt": PROMPT, "add_special_tokens": False}).json()
    assert tokens["tokens"] == reference["plain"], tokens
    # SGLang's /generate
    native = {"text": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}
    out = httpx.post(f"{server.url}/generate", json=native, timeout=60).json()
    assert out["output_ids"] == reference["with_bos"], out
