"""Structured output after the reasoning, through the official ``openai`` client: on a server with
``--reasoning-parser qwen3`` a response_format or a forced tool call applies after ``</think>``
(as vLLM and SGLang do), so ``reasoning_content`` is the model's and ``content`` the grammar's.

The tiny model's tokenizer has ``<think>`` and ``</think>`` as single tokens and its weights are
random: a logit bias draws ``<think>`` first and ``</think>`` right after, where the grammar allows
them; the grammar engine's own tests cover free reasoning text between the tags."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import openai
import pytest

from minisgl_core.demo.factories import make_model_dir
from minisgl_core.tokenizer.load import load_tokenizer

TEMPLATE = Path(__file__).parent / "data" / "tools_template.jinja"
ASK = [{"role": "user", "content": "Pick a number."}]
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "pick", "schema": SCHEMA}}
PICK = {"type": "function", "function": {"name": "pick", "parameters": SCHEMA}}


@pytest.fixture(scope="module")
def thinker_dir(tmp_path_factory) -> Path:
    return make_model_dir(
        tmp_path_factory.mktemp("model") / "thinker", added_tokens=("<think>", "</think>"), seed=1
    )


@pytest.fixture(scope="module")
def tags(thinker_dir) -> dict[str, int]:
    tokenizer = load_tokenizer(thinker_dir)
    return {t: tokenizer.encode(t, add_special_tokens=False)[0] for t in ("<think>", "</think>")}


@pytest.fixture(scope="module")
def client(grammar_backend, start_server, thinker_dir, engine_args):
    server = start_server(
        [
            "--model", str(thinker_dir), *engine_args, "--reasoning-parser", "qwen3",
            "--tool-call-parser", "hermes", "--chat-template", str(TEMPLATE),
        ]
    )  # fmt: skip
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def ask(client, tags, **kwargs):
    bias = {str(tags["<think>"]): 60, str(tags["</think>"]): 100}
    kwargs.setdefault("max_tokens", 24)
    return client.chat.completions.create(
        model=client.models.list().data[0].id, messages=ASK, temperature=0,
        logit_bias=bias, extra_body={"return_token_ids": True, **kwargs.pop("extra_body", {})}, **kwargs,
    )  # fmt: skip


def test_response_format_applies_after_the_reasoning(client, tags):
    resp = ask(client, tags, response_format=RESPONSE_FORMAT)
    choice = choice_of(resp)
    assert choice.token_ids[:2] == [tags["<think>"], tags["</think>"]], choice.token_ids
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    assert not getattr(choice.message, "reasoning_content", None)  # (empty reasoning)


def test_streamed_too(client, tags):
    chunks = list(ask(client, tags, response_format=RESPONSE_FORMAT, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(content), SCHEMA)
    ids = [t for c in chunks if c.choices for t in (getattr(c.choices[0], "token_ids", None) or [])]
    assert ids[:2] == [tags["<think>"], tags["</think>"]], ids


def test_a_prompt_that_closes_the_reasoning_gets_the_grammar_from_the_first_token(client, tags):
    """``enable_thinking`` false: the template writes an empty ``<think></think>`` into the prompt,
    so the answer is all content and the tags cannot be drawn (as vLLM does)."""
    resp = ask(
        client,
        tags,
        response_format=RESPONSE_FORMAT,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    choice = choice_of(resp)
    assert not set(choice.token_ids) & set(tags.values()), choice.token_ids
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_a_forced_tool_call_applies_after_the_reasoning(client, tags):
    resp = ask(client, tags, tools=[PICK], tool_choice="required", max_tokens=96)
    choice = choice_of(resp)
    assert choice.token_ids[:2] == [tags["<think>"], tags["</think>"]], choice.token_ids
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "pick"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMA)


def test_an_answer_opening_with_whitespace_keeps_it(client, tags):
    """A choice of " yes" / " no" after the reasoning: the parser drops the whitespace after
    ``</think>`` (a model's "</think>\n\n"), which here is the grammar's, so ``content`` was "yes",
    none of the choices; the answer is kept as generated, streamed or not."""
    choices = [" yes", " no"]
    resp = ask(client, tags, extra_body={"structured_outputs": {"choice": choices}})
    choice = choice_of(resp)
    assert choice.token_ids[:2] == [tags["<think>"], tags["</think>"]], choice.token_ids
    assert choice.message.content in choices, choice.message
    chunks = list(ask(client, tags, extra_body={"structured_outputs": {"choice": choices}}, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) in choices


def choice_of(resp):
    choice = resp.choices[0]
    choice.token_ids = (choice.model_extra or {}).get("token_ids") or getattr(choice, "token_ids", None)
    return choice


OPENED = {"chat_template_kwargs": {"open_thinking": True}}  # the prompt ends "<think>\n"


def test_a_prompt_that_opened_the_reasoning_gets_its_answer_split(client, tags):
    """A template that ends the prompt with ``<think>`` (Qwen3's thinking-only models, DeepSeek-R1):
    the output begins inside the reasoning, so ``reasoning_content`` is its text up to
    ``</think>`` and ``content`` what follows (it was all content), streamed or not; with a
    response_format the grammar applies after ``</think>``."""
    model = client.models.list().data[0].id
    free = client.chat.completions.create(
        model=model,
        messages=ASK,
        max_tokens=8,
        temperature=0,
        extra_body={**OPENED, "return_token_ids": True},
    )
    choice = choice_of(free)
    assert tags["</think>"] not in choice.token_ids  # (the random model does not close it in 8 tokens)
    assert choice.message.content is None and choice.message.reasoning_content
    streamed = client.chat.completions.create(
        model=model, messages=ASK, max_tokens=8, temperature=0, stream=True, extra_body=OPENED
    )
    deltas = [c.choices[0].delta for c in streamed if c.choices]
    assert (
        "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
        == choice.message.reasoning_content
    )
    assert not "".join(d.content or "" for d in deltas)
    constrained = choice_of(ask(client, tags, response_format=RESPONSE_FORMAT, extra_body=OPENED))
    assert constrained.token_ids[0] == tags["</think>"], constrained.token_ids
    jsonschema.validate(json.loads(constrained.message.content), SCHEMA)
