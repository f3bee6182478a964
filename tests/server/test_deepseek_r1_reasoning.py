"""``--reasoning-parser deepseek_r1`` through the official ``openai`` client. DeepSeek-R1's template
opens ``<think>`` in the prompt, so its answer begins inside the reasoning and closes it with
``</think>`` alone: an output without the end tag is all reasoning, as vLLM's parser reads it.
The tiny random model's tokenizer has no single-token tags, so a grammar cannot wait for the end
of the reasoning: it applies from the first token, and then the whole output is the grammar's
answer, content, not reasoning, unless the grammar itself opens the reasoning. (How the parser splits outputs that close the reasoning, streamed
or not, is tested on ChoiceOutput in test_tool_output; with single-token tags in
test_reasoning_grammar.)"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import openai
import pytest

TEMPLATE = Path(__file__).parent / "data" / "tools_template.jinja"
ASK = [{"role": "user", "content": "2+2?"}]
OPENED = {"open_thinking": True}  # the template's variable: the prompt ends "<think>\n"
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def r1_server(start_server, model_dir, engine_args):
    from minisgl_core.plugins import Plugins

    if not Plugins.load().registry.get("grammars"):
        pytest.skip("no grammar backend installed")
    return start_server(
        ["--model", str(model_dir), *engine_args, "--reasoning-parser", "deepseek_r1", "--chat-template", str(TEMPLATE)]
    )  # fmt: skip


@pytest.fixture(scope="module")
def client(r1_server):
    return openai.OpenAI(base_url=f"{r1_server.url}/v1", api_key="unused", max_retries=0, timeout=120)


NOT_SINGLE = "reasoning tags '<think>' and '</think>' are not single tokens of this tokenizer"


def test_tags_that_are_not_single_tokens_are_said_at_start_up_once(r1_server, client):
    """The warning came with the first request that had a grammar, long after start-up, where a
    user reads what the server says of its settings. It is now in the log before the ready line,
    and a request with a grammar does not say it again."""
    from minisgl_core.testing.live_server import READY

    log = r1_server.log()
    assert log.count(NOT_SINGLE) == 1 and log.index(NOT_SINGLE) < READY.search(log).start(), log
    response_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    (_, content), _ = answer(client, {}, response_format=response_format)
    jsonschema.validate(json.loads(content), SCHEMA)
    assert r1_server.log().count(NOT_SINGLE) == 1, r1_server.log()


def answer(client, template_kwargs: dict, body: dict | None = None, **extra) -> tuple[tuple, tuple]:
    """(reasoning_content, content) of the answer whole, then streamed."""
    args = dict(
        model=client.models.list().data[0].id, messages=ASK, max_tokens=60, temperature=0,
        extra_body={"chat_template_kwargs": template_kwargs, **(body or {})}, **extra,
    )  # fmt: skip
    message = client.chat.completions.create(**args).choices[0].message
    deltas = [c.choices[0].delta for c in client.chat.completions.create(**args, stream=True) if c.choices]
    streamed = (
        "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) or None,
        "".join(d.content or "" for d in deltas) or None,
    )
    return (getattr(message, "reasoning_content", None), message.content), streamed


@pytest.mark.parametrize("template_kwargs", [{}, OPENED], ids=["plain", "opened"])
def test_an_output_without_the_end_tag_is_all_reasoning(client, template_kwargs):
    """deepseek_r1's reading, not Qwen3's (which took such an output as content)."""
    (reasoning, content), streamed = answer(client, template_kwargs)
    assert reasoning and "</think>" not in reasoning, reasoning
    assert content is None
    assert streamed == (reasoning, content)


@pytest.mark.parametrize("template_kwargs", [{}, OPENED], ids=["plain", "opened"])
def test_a_grammar_applied_from_the_first_token_is_the_answer_not_reasoning(client, template_kwargs):
    """The JSON the schema forced was all reasoning_content, and content None: the parser read the
    grammar's output as still inside the reasoning (the tags are not single tokens here)."""
    response_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    (reasoning, content), streamed = answer(client, template_kwargs, response_format=response_format)
    assert reasoning is None
    jsonschema.validate(json.loads(content), SCHEMA)
    assert streamed == (reasoning, content)


@pytest.mark.parametrize(
    "regex, reasoning, content",
    [
        # was ("Let me think.", "The answer is 4."): read as inside a reasoning no prompt opened
        ("Let me think\\.</think>The answer is 4\\.", None, "Let me think.</think>The answer is 4."),
        ("<think>Hm\\.</think>4", "Hm.", "4"),  # a grammar that opens the reasoning itself
    ],
)
def test_a_grammar_that_opens_the_reasoning_itself_is_split(client, regex, reasoning, content):
    whole, streamed = answer(client, {}, {"structured_outputs": {"regex": regex}})
    assert whole == (reasoning, content)
    assert streamed == whole
