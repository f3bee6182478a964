"""``--reasoning-parser deepseek_r1`` through the official ``openai`` client: DeepSeek-R1's template
opens ``<think>`` in the prompt, so its answer begins inside the reasoning and closes it with
``</think>`` alone; whether this prompt ended with ``<think>`` or not, the answer is split alike,
streamed or not. A regex makes the tiny random model write such an answer (its tokenizer has no
single-token tags, so the grammar applies from the first token, and the server does not recognise
a prompt ending with ``<think>``: the parser alone reads the output as inside the reasoning; with
single-token tags the server feeds it the prompt's ``<think>`` first, see test_tool_output)."""

from __future__ import annotations

import re
from pathlib import Path

import openai
import pytest

TEMPLATE = Path(__file__).parent / "data" / "tools_template.jinja"
ASK = [{"role": "user", "content": "2+2?"}]
OPENED = {"open_thinking": True}  # the template's variable: the prompt ends "<think>\n"


@pytest.fixture(scope="module")
def client(start_server, model_dir, engine_args):
    from minisgl_core.plugins import Plugins

    if not Plugins.load().registry.get("grammars"):
        pytest.skip("no grammar backend installed")
    server = start_server(
        ["--model", str(model_dir), *engine_args, "--reasoning-parser", "deepseek_r1", "--chat-template", str(TEMPLATE)]
    )  # fmt: skip
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def answer(client, output: str, template_kwargs: dict) -> tuple[tuple, tuple]:
    """(reasoning_content, content) of ``output`` answered whole, then streamed."""
    args = dict(
        model=client.models.list().data[0].id, messages=ASK, max_tokens=60, temperature=0,
        extra_body={"structured_outputs": {"regex": re.escape(output)}, "chat_template_kwargs": template_kwargs},
    )  # fmt: skip
    message = client.chat.completions.create(**args).choices[0].message
    deltas = [c.choices[0].delta for c in client.chat.completions.create(**args, stream=True) if c.choices]
    streamed = (
        "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) or None,
        "".join(d.content or "" for d in deltas) or None,
    )
    return (getattr(message, "reasoning_content", None), message.content), streamed


R1_ANSWER = "Let me think.</think>The answer is 4."


@pytest.mark.parametrize(
    "output, template_kwargs, reasoning, content",
    [
        # was reasoning None, content with the raw "</think>" (deepseek_r1 was Qwen3's parser)
        (R1_ANSWER, {}, "Let me think.", "The answer is 4."),
        (R1_ANSWER, OPENED, "Let me think.", "The answer is 4."),
        ("Still thinking", {}, "Still thinking", None),  # no </think>: all reasoning, as vLLM's
        ("<think>Hm.</think>4", {}, "Hm.", "4"),  # an output that opens <think> itself, as before
    ],
)
def test_an_answer_closing_the_reasoning_it_begins_in_is_split(
    client, output, template_kwargs, reasoning, content
):
    whole, streamed = answer(client, output, template_kwargs)
    assert whole == (reasoning, content)
    assert streamed == whole
