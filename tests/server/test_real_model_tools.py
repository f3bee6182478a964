"""A tool-call round trip on the real default model (SmolLM2-135M-Instruct) through the official
``openai`` client: tools -> tool_calls -> a ``tool`` message -> a final answer, streamed and not.

SmolLM2's own chat template does not render ``tools`` (the server refuses them rather than drop
them silently), so the server runs with the Hermes-style template of these tests
(``--chat-template``) and the ``hermes`` parser; the named ``tool_choice`` makes the grammar
backend enforce the function's parameter schema, which is what these tests check with
``jsonschema``.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

TEMPLATE = Path(__file__).parent / "data" / "tools_template.jinja"
MODEL = "SmolLM2-135M-Instruct"
WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": WEATHER_PARAMS,
    },
}
FORCED = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# fmt: off
ARGS = ["--device", "cpu", "--attn", "torch", "--num-kv-tokens", "8192", "--max-running-requests", "8",
        "--max-context-len", "2048", "--chat-template", str(TEMPLATE), "--tool-call-parser", "hermes"]
# fmt: on


@pytest.fixture(scope="module")
def client(start_server, default_model_dir):
    import openai

    server = start_server(ARGS)  # no --model: the default, already in the cache (default_model_dir)
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def _round_trip(client, call_id: str, name: str, arguments: str) -> str:
    """Send the call back with a tool result; the model's final answer."""
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps({"temperature": 18, "sky": "clear"})},
    ]
    final = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=24
    )
    choice = final.choices[0]
    assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls
    return choice.message.content


def test_forced_tool_call_round_trip(client):
    resp = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice=FORCED, temperature=0, max_tokens=64
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)
    answer = _round_trip(client, call.id, call.function.name, call.function.arguments)
    assert isinstance(answer, str) and answer.strip()


def test_forced_tool_call_streamed_equals_the_whole_answer(client):
    whole = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice=FORCED, temperature=0, max_tokens=64
    )
    stream = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER],
        tool_choice=FORCED,
        temperature=0,
        max_tokens=64,
        stream=True,
    )
    name, arguments, call_id, finish = None, "", None, None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for part in delta.tool_calls or []:
            assert part.index == 0
            call_id = part.id or call_id
            if part.function is not None:
                name = part.function.name or name
                arguments += part.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and name == "get_weather" and call_id
    assert json.loads(arguments) == json.loads(whole.choices[0].message.tool_calls[0].function.arguments)
    jsonschema.validate(json.loads(arguments), WEATHER_PARAMS)
    assert _round_trip(client, call_id, name, arguments).strip()


def _streamed_calls(client, **kwargs) -> tuple[str, list[tuple[str, str]], str]:
    """A streamed answer's content, its calls (name, arguments) by index and its finish reason."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for part in delta.tool_calls or []:
            entry = calls.setdefault(part.index, ["", ""])
            entry[0] += part.function.name or ""
            entry[1] += part.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content, [tuple(calls[i]) for i in sorted(calls)], finish


@pytest.mark.parametrize(
    "tool_choice, max_tokens, expected",
    [
        # the call's arguments cut off at '{"city":"Paris","unit'
        (FORCED, 24, [("get_weather", '{"city":"Paris","unit')]),
        # parallel calls: a whole one, then the next one cut off in its arguments
        (
            "required",
            48,
            [("get_weather", '{"city":"Paris","unit":"celsius"}'), ("get_weather", '{"city":"')],
        ),
    ],
    ids=["named", "required"],
)
def test_a_forced_call_cut_off_by_max_tokens_is_a_partial_call_streamed_or_not(
    client, tool_choice, max_tokens, expected
):
    """max_tokens cutting the forced array of calls: the whole answer had no tool_calls (named) or
    only the whole ones, and the array's text in its content ('[{"name":"get_weather",...' /
    '{"name":"get_weather","arguments":{"city":"'), while the stream sent the call cut off. Both now
    answer the calls with the arguments so far (as vLLM does for a named function), no content."""
    kwargs = dict(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER],
        tool_choice=tool_choice,
        temperature=0,
        max_tokens=max_tokens,
    )
    choice = client.chat.completions.create(**kwargs).choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    assert (choice.finish_reason, choice.message.content, calls) == ("length", None, expected)
    assert _streamed_calls(client, **kwargs) == ("", expected, "length")


@pytest.fixture(scope="module")
def bundled_client(start_server, default_model_dir):
    """The real model served with the bundled ChatML tools template, by its name."""
    import openai

    args = ARGS[: ARGS.index("--chat-template")] + [
        "--chat-template",
        "chatml-tools",
        "--tool-call-parser",
        "hermes",
    ]
    server = start_server(args)
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_the_bundled_chatml_tools_template_serves_a_forced_call_round_trip(bundled_client):
    """``--chat-template chatml-tools`` lets the default model take tools with no template file of
    one's own: the forced call validates against the function's schema, streamed the same, and
    the tool's result goes back for a final answer."""
    kwargs = dict(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice=FORCED, temperature=0, max_tokens=64
    )
    choice = bundled_client.chat.completions.create(**kwargs).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)
    content, calls, finish = _streamed_calls(bundled_client, **kwargs)
    assert (content, finish) == ("", "tool_calls")
    assert [(n, json.loads(a)) for n, a in calls] == [("get_weather", json.loads(call.function.arguments))]
    assert _round_trip(bundled_client, call.id, call.function.name, call.function.arguments).strip()
