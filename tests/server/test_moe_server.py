"""A mixture-of-experts model served end to end: ``minisgl serve --tp 2`` (two scheduler ranks on
gloo, every expert split across them) answered through the official ``openai`` client gives the
greedy tokens the offline engine computes on one rank, for completions and chat alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from minisgl_core.demo.factories import make_model_dir
from minisgl_core.sampling import SamplingParams

from .conftest import API_KEY, ENGINE_ARGS

PROMPTS = [[11, 42, 7, 99, 5], [300, 2, 18, 77, 5, 6, 9, 120, 64]]


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("moe") / "tiny-moe", "Qwen3MoeForCausalLM", seed=9)


@pytest.fixture(scope="module")
def moe_client(start_server, moe_dir: Path):
    import openai

    server = start_server(["--model", str(moe_dir), "--api-key", API_KEY, "--tp", "2", *ENGINE_ARGS])
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def test_tp2_server_gives_the_offline_engines_greedy_tokens(moe_client, moe_dir: Path) -> None:
    from minisgl_core.llm import LLM

    llm = LLM(moe_dir, device="cpu", attn="torch", max_context_len=2048, num_kv_tokens=4096)
    try:
        want = [
            out.token_ids
            for out in llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
        ]
        chat_want = llm.chat(
            [{"role": "user", "content": "route me"}],
            SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
        )
    finally:
        llm.close()
    assert len({t for ids in want for t in ids}) > 3, "constant output: the comparison would be weak"
    for prompt, ids in zip(PROMPTS, want, strict=True):
        out = moe_client.completions.create(
            model="tiny-moe", prompt=prompt, max_tokens=10, temperature=0, extra_body={"ignore_eos": True}
        )
        assert out.usage.completion_tokens == 10
        assert out.choices[0].text == llm_text(moe_dir, ids)
    chat = moe_client.chat.completions.create(
        model="tiny-moe",
        messages=[{"role": "user", "content": "route me"}],
        max_tokens=10,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert chat.choices[0].message.content == llm_text(moe_dir, chat_want[0].token_ids)


def llm_text(model_dir: Path, ids: list[int]) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir).decode(ids, skip_special_tokens=True)
