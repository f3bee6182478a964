"""/v1/messages (Anthropic's Messages API) through the official ``anthropic`` client, checked against
/v1/chat/completions, which runs it: the same text, prompt and usage for the same conversation;
streamed, the SDK's assembled message is the whole answer's. Answers are validated strictly
against the client's own pydantic types (it builds them without validation). The tiny model's
weights are random: forced tool calls come from grammars (skipped without a grammar backend)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from anthropic.types import Message

from .conftest import API_KEY

TEMPLATE = Path(__file__).parent / "data" / "tools_template.jinja"
ASK = "What is the weather in Paris?"
TRIP = {
    "name": "plan_trip",
    "description": "Book a trip",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"enum": ["Paris", "Rome"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    },
}
#: greedy: the SDK has no temperature argument (newer Claude models take none); the route takes it
GREEDY = {"temperature": 0}
WEATHER = {
    "name": "get_weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def claude(server):
    """The anthropic client: it sends the key as ``x-api-key``."""
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tools_server(start_server, model_dir, engine_args):
    """A template that renders tools, tool calls and an assistant's reasoning, and the parsers."""
    return start_server(
        [
            "--model", str(model_dir), *engine_args, "--chat-template", str(TEMPLATE),
            "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3",
        ]
    )  # fmt: skip


@pytest.fixture(scope="module")
def tools_clients(tools_server):
    import openai

    return (
        anthropic.Anthropic(base_url=tools_server.url, api_key="unused", max_retries=0, timeout=120),
        openai.OpenAI(base_url=f"{tools_server.url}/v1", api_key="unused", max_retries=0, timeout=120),
    )


def strict(message: Message) -> dict[str, Any]:
    """The message as JSON, validated strictly as the SDK's Message; less its id and what the
    prefix cache changes between two sends of one prompt, to compare two answers."""
    Message.model_validate(message.to_dict())
    out = message.to_dict()
    del out["id"]
    out["usage"] = {k: v for k, v in out["usage"].items() if k != "cache_read_input_tokens"}
    for block in out["content"]:
        block.pop("id", None)  # (a tool_use's id is new each time)
    return out


def streamed(claude: anthropic.Anthropic, **body: Any) -> Message:
    with claude.messages.stream(**body) as stream:
        return stream.get_final_message()


# ------------------------------------------------------------------ text


def test_greedy_text_and_usage_are_the_chat_routes(claude, client, model_name):
    system = "You are terse."
    msg = claude.messages.create(
        model=model_name,
        system=system,
        messages=[{"role": "user", "content": ASK}],
        max_tokens=6,
        extra_body=GREEDY,
    )
    chat = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": ASK}],
        max_tokens=6,
        temperature=0,
    )
    strict(msg)
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert msg.model == model_name
    [block] = msg.content
    assert block.type == "text" and block.text == chat.choices[0].message.content
    assert msg.usage.input_tokens == chat.usage.prompt_tokens
    assert msg.usage.output_tokens == chat.usage.completion_tokens == 6
    assert msg.stop_reason == "max_tokens" and msg.stop_sequence is None


def test_blocks_and_a_multi_turn_conversation_are_the_chat_conversation(claude, client, model_name):
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello!"}]},
        {"role": "user", "content": ASK},
    ]
    chat_messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": ASK},
    ]
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    msg = claude.messages.create(
        model=model_name, system=system, messages=messages, max_tokens=5, extra_body=GREEDY
    )
    chat = client.chat.completions.create(
        model=model_name, messages=chat_messages, max_tokens=5, temperature=0
    )
    assert msg.content[0].text == chat.choices[0].message.content
    assert msg.usage.input_tokens == chat.usage.prompt_tokens
    count = claude.messages.count_tokens(model=model_name, system=system, messages=messages)
    assert count.input_tokens == msg.usage.input_tokens


def test_a_stream_assembles_the_whole_answers_message(claude, server, model_name):
    body = {
        "model": model_name,
        "messages": [{"role": "user", "content": ASK}],
        "max_tokens": 8,
        "extra_body": GREEDY,
    }
    whole = claude.messages.create(**body)
    final = streamed(claude, **body)
    assert strict(final) == strict(whole)
    # the events, in Anthropic's order
    headers = {"x-api-key": API_KEY}
    raw = {**{k: v for k, v in body.items() if k != "extra_body"}, **GREEDY}
    with httpx.stream(
        "POST", f"{server.url}/v1/messages", json={**raw, "stream": True}, headers=headers
    ) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        kinds = [line.removeprefix("event: ") for line in resp.iter_lines() if line.startswith("event: ")]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}


def test_stop_sequences_end_with_the_sequence(claude, model_name):
    body = {"model": model_name, "messages": [{"role": "user", "content": ASK}], "extra_body": GREEDY}
    text = claude.messages.create(**body, max_tokens=20).content[0].text
    sequence = next(text[i : i + 2] for i in range(3, len(text) - 2) if text[i : i + 2].strip())
    for msg in (
        claude.messages.create(**body, max_tokens=20, stop_sequences=[sequence]),
        streamed(claude, **body, max_tokens=20, stop_sequences=[sequence]),
    ):
        assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == sequence
        assert msg.content[0].text == text[: text.index(sequence)]


def test_count_tokens_is_the_usage(claude, model_name):
    messages = [{"role": "user", "content": ASK}]
    count = claude.messages.count_tokens(model=model_name, messages=messages)
    msg = claude.messages.create(model=model_name, messages=messages, max_tokens=1)
    assert count.input_tokens == msg.usage.input_tokens > 0


def test_an_assistant_turn_last_is_continued(claude, client, model_name):
    """Anthropic's prefill: chat's continue_final_message."""
    messages = [{"role": "user", "content": ASK}, {"role": "assistant", "content": "The weather"}]
    msg = claude.messages.create(model=model_name, messages=messages, max_tokens=4, extra_body=GREEDY)
    chat = client.chat.completions.create(
        model=model_name,
        messages=messages,
        max_tokens=4,
        temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    assert msg.content[0].text == chat.choices[0].message.content
    assert msg.usage.input_tokens == chat.usage.prompt_tokens


# ------------------------------------------------------------------ refusals and errors


def refused(claude: anthropic.Anthropic, model_name: str, **extra: Any) -> str:
    """The message of the 400 a request with ``extra`` gets, in Anthropic's error shape."""
    body = {"model": model_name, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}], **extra}
    with pytest.raises(anthropic.BadRequestError) as refusal:
        claude.messages.create(**body)
    error = refusal.value.body
    assert set(error) == {"type", "error"} and error["type"] == "error"
    assert set(error["error"]) == {"type", "message"} and error["error"]["type"] == "invalid_request_error"
    return error["error"]["message"]


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"messages": [{"role": "user", "content": [IMAGE]}]}, "messages.0.content.0.type"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
        ({"extra_body": {"service_tier": "auto"}}, "service_tier"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 2048}, "thinking.budget_tokens"),
        ({"thinking": {"type": "enabled", "budget_tokens": 4096}}, "thinking"),  # (no --reasoning-parser)
        ({"metadata": {"user_id": "u", "other": "x"}}, "metadata.other"),
        ({"tool_choice": {"type": "tool"}}, "tool_choice"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
         "messages.0.content.0.type"),
    ],
)  # fmt: skip
def test_what_the_chat_path_cannot_run_is_a_400_naming_the_field(claude, model_name, extra, field):
    assert field in refused(claude, model_name, **extra)


def test_max_tokens_is_required(server, model_name):
    resp = httpx.post(
        f"{server.url}/v1/messages",
        json={"model": model_name, "messages": [{"role": "user", "content": "Hi"}]},
        headers={"x-api-key": API_KEY},
    )
    assert resp.status_code == 400 and "max_tokens" in resp.json()["error"]["message"]
    assert resp.json()["type"] == "error"


def test_the_key_is_taken_as_x_api_key_and_refused_in_anthropics_shape(server, model_name):
    body = {"model": model_name, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}
    nobody = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as refusal:
        nobody.messages.create(**body)
    assert refusal.value.body["type"] == "error"
    assert refusal.value.body["error"]["type"] == "authentication_error"
    assert "x-api-key" in refusal.value.body["error"]["message"]
    bare = httpx.post(f"{server.url}/v1/messages/count_tokens", json=body)
    assert bare.status_code == 401 and bare.json()["error"]["type"] == "authentication_error"
    # Bearer works here too; and x-api-key is Anthropic's: the OpenAI routes keep their header and shape
    bearer = httpx.post(
        f"{server.url}/v1/messages", json=body, headers={"Authorization": f"Bearer {API_KEY}"}
    )
    assert bearer.status_code == 200 and bearer.json()["type"] == "message"
    chat = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers={"x-api-key": API_KEY})
    assert chat.status_code == 401 and set(chat.json()) == {"error"}


def test_the_body_gates_refusals_are_in_anthropics_shape(server):
    """The middleware's answers (before any route runs) follow the path too: a compressed body's 415."""
    headers = {"x-api-key": API_KEY, "Content-Encoding": "gzip", "Content-Type": "application/json"}
    resp = httpx.post(f"{server.url}/v1/messages", content=b"\x1f\x8b", headers=headers)
    assert resp.status_code == 415 and resp.json()["type"] == "error", resp.text
    assert "Content-Encoding" in resp.json()["error"]["message"]
    chat = httpx.post(f"{server.url}/v1/chat/completions", content=b"\x1f\x8b", headers=headers)
    assert chat.status_code in (401, 415) and set(chat.json()) == {"error"}


# ------------------------------------------------------------------ tools and thinking


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "plan_trip"}])
def test_a_forced_tool_is_a_tool_use_block_following_its_schema(
    grammar_backend, tools_clients, model_name, choice
):
    claude, _ = tools_clients
    tools = [TRIP] if choice["type"] == "any" else [WEATHER, TRIP]
    body = {
        "model": model_name,
        "messages": [{"role": "user", "content": ASK}],
        "tools": tools,
        "tool_choice": {**choice, "disable_parallel_tool_use": True},
        "max_tokens": 100,
        "extra_body": GREEDY,
    }
    msg = claude.messages.create(**body)
    assert msg.stop_reason == "tool_use", msg.content
    [call] = [b for b in msg.content if b.type == "tool_use"]
    assert call.name == "plan_trip" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, TRIP["input_schema"])
    assert strict(streamed(claude, **body)) == strict(msg)


def test_a_tool_result_sent_back_is_chats_tool_message(tools_clients, model_name):
    claude, openai_client = tools_clients
    arguments = {"city": "Paris"}
    messages = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": arguments}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sunny"}]}]},
    ]  # fmt: skip
    chat_messages = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "toolu_1", "type": "function",
         "function": {"name": "get_weather", "arguments": json.dumps(arguments)}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"},
    ]  # fmt: skip
    chat_tools = [
        {"type": "function", "function": {"name": WEATHER["name"], "parameters": WEATHER["input_schema"]}}
    ]
    msg = claude.messages.create(
        model=model_name, messages=messages, tools=[WEATHER], max_tokens=5, extra_body=GREEDY
    )
    chat = openai_client.chat.completions.create(
        model=model_name, messages=chat_messages, tools=chat_tools, max_tokens=5, temperature=0
    )
    assert msg.usage.input_tokens == chat.usage.prompt_tokens
    assert msg.usage.output_tokens == chat.usage.completion_tokens
    text = "".join(b.text for b in msg.content if b.type == "text")
    assert text == (chat.choices[0].message.content or "")
    count = claude.messages.count_tokens(model=model_name, messages=messages, tools=[WEATHER])
    assert count.input_tokens == msg.usage.input_tokens
    # a failed tool's result: chat's tool message has no error flag, so the text says it
    failed = [*messages[:2], {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                            "content": "Sunny", "is_error": True}]}]  # fmt: skip
    errored = [*chat_messages[:2], {**chat_messages[2], "content": "Error: Sunny"}]
    assert claude.messages.count_tokens(model=model_name, messages=failed, tools=[WEATHER]).input_tokens == (
        openai_client.chat.completions.create(
            model=model_name, messages=errored, tools=chat_tools, max_tokens=1
        ).usage.prompt_tokens
    )


def test_a_thinking_block_sent_back_is_the_assistants_reasoning(tools_clients, model_name):
    claude, openai_client = tools_clients
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Greet back.", "signature": ""},
                                          {"type": "text", "text": "Hello!"}]},
        {"role": "user", "content": ASK},
    ]  # fmt: skip
    chat_messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."},
        {"role": "user", "content": ASK},
    ]
    msg = claude.messages.create(model=model_name, messages=messages, max_tokens=3, extra_body=GREEDY)
    chat = openai_client.chat.completions.create(
        model=model_name, messages=chat_messages, max_tokens=3, temperature=0
    )
    plain = openai_client.chat.completions.create(
        model=model_name, messages=[{**m, "reasoning_content": None} for m in chat_messages], max_tokens=3
    )
    assert msg.usage.input_tokens == chat.usage.prompt_tokens > plain.usage.prompt_tokens


def test_thinking_comes_back_as_a_thinking_block(start_server, engine_args, tmp_path_factory):
    """A thinking-only model (its prompt ends with ``<think>``): the tiny model does not close it,
    so the whole output is a thinking block, streamed or not, as chat's reasoning_content."""
    from minisgl_core.demo.factories import make_model_dir

    folder = tmp_path_factory.mktemp("thinking")
    model = make_model_dir(folder / "thinker", added_tokens=("<think>", "</think>"), seed=1)
    template = folder / "thinking.jinja"
    template.write_text("{%- set open_thinking = true %}" + TEMPLATE.read_text())
    server = start_server(
        ["--model", str(model), *engine_args, "--chat-template", str(template), "--reasoning-parser", "qwen3"]
    )
    import openai

    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    chat = openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="unused", max_retries=0
    ).chat.completions.create(
        model="thinker", messages=[{"role": "user", "content": "Hi"}], max_tokens=12, temperature=0
    )
    body = {
        "model": "thinker",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 12,
        "extra_body": GREEDY,
        "thinking": {"type": "enabled", "budget_tokens": 12},
    }
    msg = claude.messages.create(**body)
    [block] = msg.content
    assert block.type == "thinking" and block.signature == ""
    assert block.thinking == chat.choices[0].message.reasoning_content
    assert strict(streamed(claude, **body)) == strict(msg)
