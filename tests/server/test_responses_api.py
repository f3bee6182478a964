"""/v1/responses (OpenAI's Responses API) through the official ``openai`` client, checked against
/v1/chat/completions, which runs it: the same text, prompt and usage for the same conversation.
Every answer and stream event is also validated strictly against the client's own pydantic types
(the client itself builds them without validation). The tiny model's weights are random: forced
tool calls and JSON output come from grammars (skipped without a grammar backend)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from minisgl_plugin_hermes.parser import HermesToolParser
from minisgl_plugin_qwen3_reasoning.parser import Qwen3ReasoningParser
from openai.types.responses import InputTokenCountResponse, Response, ResponseItem, ResponseStreamEvent
from pydantic import TypeAdapter

from minisgl_core.demo.factories import make_model_dir
from minisgl_core.server.chat_output import ChoiceOutput
from minisgl_core.server.responses import Choice
from minisgl_core.server.responses_output import EventStream, read_whole
from minisgl_core.server.responses_schema import ResponsesRequest
from minisgl_core.server.tools import ToolPlan
from minisgl_core.tokenizer.load import load_tokenizer

from .conftest import API_KEY

TEMPLATE = Path(__file__).parent / "data" / "tools_template.jinja"
ASK = "What is the weather in Paris?"
BOUNDED = {
    "type": "function",
    "name": "plan_trip",
    "description": "Book a trip",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"enum": ["Paris", "Rome"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    },
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
#: parameters no arguments can follow: at least three items in a list of at most one
UNSATISFIABLE = {
    "type": "object",
    "properties": {"xs": {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 1}},
    "required": ["xs"],
}
EVENTS = TypeAdapter(ResponseStreamEvent)
RESPONSE_ITEM = TypeAdapter(ResponseItem)


def chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A Responses function tool as chat writes it."""
    return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}


@pytest.fixture(scope="module")
def tools_server(start_server, model_dir, engine_args):
    """A template that renders tools, tool calls and an assistant's reasoning (the demo's has
    none), and the output parsers that read them back."""
    return start_server(
        [
            "--model", str(model_dir), *engine_args, "--chat-template", str(TEMPLATE),
            "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3",
        ]
    )  # fmt: skip


@pytest.fixture(scope="module")
def tools_client(tools_server):
    return openai.OpenAI(base_url=f"{tools_server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def create(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST /v1/responses; the JSON answer, validated strictly as the client's Response."""
    resp = httpx.post(
        f"{url}/v1/responses", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120
    )
    assert resp.status_code == 200, resp.text
    Response.model_validate(resp.json())
    return resp.json()


def stream_events(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of a streamed response, each validated strictly as a ResponseStreamEvent, its
    ``event:`` line naming its type."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    events = []
    with httpx.stream(
        "POST", f"{url}/v1/responses", json={**body, "stream": True}, headers=headers, timeout=120
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        kind = None
        for line in resp.iter_lines():
            if line.startswith("event: "):
                kind = line[len("event: ") :]
            elif line.startswith("data: "):
                event = json.loads(line[len("data: ") :])
                assert event["type"] == kind
                EVENTS.validate_python(event)
                events.append(event)
    return events


def refusal(client: openai.OpenAI, model_name: str, **extra: Any) -> dict[str, Any]:
    """The 400 OpenAI's error body of a /v1/responses request (``extra``: its fields)."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=model_name, max_output_tokens=2, **extra)
    error = refused.value.body
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    return error


def without_ids(response: dict[str, Any]) -> dict[str, Any]:
    """A response less what differs between two runs: its id, times, item ids and call ids, and
    the prompt tokens read from the prefix cache (the first of two sends computes the prompt, the
    second reads it, whichever test sent it first: tests/server/test_cached_tokens.py checks them)."""
    out = {k: v for k, v in response.items() if k not in ("id", "created_at", "completed_at")}
    out["output"] = [
        {k: v for k, v in item.items() if k not in ("id", "call_id")} for item in response["output"]
    ]
    if out.get("usage"):
        out["usage"] = {**out["usage"], "input_tokens_details": None}
    return out


# ------------------------------------------------------------------ text


def test_greedy_text_is_the_chat_routes(client, server, model_name):
    resp = client.responses.create(model=model_name, input=ASK, max_output_tokens=6, temperature=0)
    chat = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": ASK}], max_tokens=6, temperature=0
    )
    assert isinstance(resp, Response) and resp.object == "response" and resp.id.startswith("resp_")
    assert resp.output_text == chat.choices[0].message.content
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.usage.output_tokens == chat.usage.completion_tokens == 6
    assert resp.usage.total_tokens == resp.usage.input_tokens + 6
    assert resp.model == model_name and resp.temperature == 0
    [message] = resp.output
    assert message.type == "message" and message.role == "assistant"
    assert [p.type for p in message.content] == ["output_text"] and message.content[0].annotations == []
    create(server.url, {"input": ASK, "max_output_tokens": 6, "temperature": 0})  # strictly valid


def test_instructions_are_a_system_message_first(client, model_name):
    system = "You are terse."
    resp = client.responses.create(
        model=model_name, instructions=system, input=ASK, max_output_tokens=5, temperature=0
    )
    messages = [{"role": "system", "content": system}, {"role": "user", "content": ASK}]
    chat = client.chat.completions.create(model=model_name, messages=messages, max_tokens=5, temperature=0)
    plain = client.chat.completions.create(
        model=model_name, messages=messages[1:], max_tokens=5, temperature=0
    )
    assert resp.instructions == system
    assert resp.usage.input_tokens == chat.usage.prompt_tokens > plain.usage.prompt_tokens
    assert resp.output_text == chat.choices[0].message.content


def test_a_list_of_messages_with_parts_is_the_chat_conversation(client, model_name):
    items = [
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}, {"type": "input_text", "text": "there"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!", "annotations": []}]},
        {"role": "user", "content": ASK},
    ]  # fmt: skip
    messages = [
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": ASK},
    ]
    resp = client.responses.create(model=model_name, input=items, max_output_tokens=5, temperature=0)
    chat = client.chat.completions.create(model=model_name, messages=messages, max_tokens=5, temperature=0)
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.output_text == chat.choices[0].message.content


def test_max_output_tokens_makes_the_response_incomplete(client, model_name):
    resp = client.responses.create(model=model_name, input=ASK, max_output_tokens=3, temperature=0)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.output[-1].status == "incomplete" and resp.usage.output_tokens == 3
    assert resp.max_output_tokens == 3


def test_a_summary_left_to_the_model_is_taken_and_none_is_written(client, model_name):
    """``reasoning.summary: "auto"``, what agents such as Codex send by default, is taken (as vLLM
    takes it): the answer is the one without it, and the request's reasoning is echoed."""
    asked = {"model": model_name, "input": ASK, "max_output_tokens": 4, "temperature": 0}
    resp = client.responses.create(**asked, reasoning={"summary": "auto"})
    assert resp.output_text == client.responses.create(**asked).output_text
    assert resp.reasoning.summary == "auto"
    assert all(item.summary == [] for item in resp.output if item.type == "reasoning")


def test_the_default_verbosity_is_taken_and_echoed(client, model_name):
    """``text.verbosity: "medium"`` (OpenAI's default, which some agents send) is taken: the
    same answer as without it, echoed as the request gave it; ``"low"``/``"high"`` are refused
    in test_what_is_not_served_is_a_400_naming_the_field."""
    asked = {"model": model_name, "input": ASK, "max_output_tokens": 4, "temperature": 0}
    resp = client.responses.create(**asked, text={"verbosity": "medium"})
    assert resp.output_text == client.responses.create(**asked).output_text
    assert resp.text.verbosity == "medium" and resp.text.format.type == "text"


def test_a_bound_on_built_in_tool_calls_and_in_memory_caching_hold_and_are_echoed(client, model_name):
    """``max_tool_calls`` bounds calls to OpenAI's built-in tools, which minisgl does not run, and
    ``prompt_cache_retention: "in_memory"`` is how its prefix cache keeps prefixes: both hold as
    asked (the same answer) and are echoed; ``"24h"`` is refused in
    test_what_is_not_served_is_a_400_naming_the_field."""
    asked = {"model": model_name, "input": ASK, "max_output_tokens": 4, "temperature": 0}
    resp = client.responses.create(**asked, max_tool_calls=0, prompt_cache_retention="in_memory")
    plain = client.responses.create(**asked)
    assert resp.output_text == plain.output_text
    assert (resp.max_tool_calls, resp.prompt_cache_retention) == (0, "in_memory")
    assert (plain.max_tool_calls, plain.prompt_cache_retention) == (None, None)


def test_json_schema_format_is_the_chat_routes_response_format(grammar_backend, client, model_name):
    schema = BOUNDED["parameters"]
    resp = client.responses.create(
        model=model_name,
        input=ASK,
        max_output_tokens=60,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "trip", "schema": schema, "strict": True}},
    )
    chat = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": ASK}],
        max_tokens=60,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "trip", "schema": schema, "strict": True},
        },
    )
    assert resp.status == "completed" and resp.incomplete_details is None and resp.completed_at
    jsonschema.validate(json.loads(resp.output_text), schema)
    assert resp.output_text == chat.choices[0].message.content
    assert resp.text.format.type == "json_schema" and resp.text.format.schema_ == schema


# ------------------------------------------------------------------ tools


def test_a_function_call_round_trip_is_the_chat_conversation(tools_client, model_name):
    """function_call and function_call_output items are the assistant's tool_calls and the tool
    message, as an agent sends them back with the response's output."""
    arguments = '{"city": "Paris", "days": 2}'
    items = [
        {"role": "user", "content": ASK},
        {"type": "function_call", "call_id": "call_1", "name": "plan_trip", "arguments": arguments},
        {"type": "function_call_output", "call_id": "call_1", "output": "booked"},
    ]
    call = {"id": "call_1", "type": "function", "function": {"name": "plan_trip", "arguments": arguments}}
    messages = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "booked"},
    ]
    resp = tools_client.responses.create(
        model=model_name, input=items, tools=[BOUNDED], max_output_tokens=5, temperature=0
    )
    chat = tools_client.chat.completions.create(
        model=model_name, messages=messages, tools=[chat_tool(BOUNDED)], max_tokens=5, temperature=0
    )
    asked = tools_client.chat.completions.create(
        model=model_name, messages=messages[:1], tools=[chat_tool(BOUNDED)], max_tokens=1
    )
    assert resp.usage.input_tokens == chat.usage.prompt_tokens > asked.usage.prompt_tokens
    assert resp.output_text == chat.choices[0].message.content


def test_a_reasoning_item_sent_back_is_the_assistants_reasoning(tools_client, model_name):
    items = [
        {"role": "user", "content": ASK},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Look."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny.", "annotations": []}]},
        {"role": "user", "content": "Thanks"},
    ]  # fmt: skip
    messages = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": "Sunny.", "reasoning_content": "Look."},
        {"role": "user", "content": "Thanks"},
    ]
    resp = tools_client.responses.create(model=model_name, input=items, max_output_tokens=4, temperature=0)
    chat = tools_client.chat.completions.create(
        model=model_name, messages=messages, max_tokens=4, temperature=0
    )
    del messages[1]["reasoning_content"]
    unreasoned = tools_client.chat.completions.create(model=model_name, messages=messages, max_tokens=1)
    assert resp.usage.input_tokens == chat.usage.prompt_tokens > unreasoned.usage.prompt_tokens
    assert resp.output_text == chat.choices[0].message.content


def test_reasoning_cut_off_and_sent_back_stays_before_the_next_user_message(tools_client, model_name):
    """An output cut off mid-reasoning is a reasoning item alone; sent back with the user's next
    message, it is the assistant's turn where it stands (it was rendered after that message, as
    if the model had reasoned about it)."""
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "status": "incomplete",
                 "content": [{"type": "reasoning_text", "text": "Let me think about it"}]}  # fmt: skip
    items = [{"role": "user", "content": ASK}, reasoning, {"role": "user", "content": "Go on"}]
    messages = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": "", "reasoning_content": "Let me think about it"},
        {"role": "user", "content": "Go on"},
    ]
    body = ResponsesRequest.model_validate({"input": items})
    assert body.chat_request()[0].model_dump(exclude_unset=True)["messages"] == messages
    resp = tools_client.responses.create(
        model=model_name, input=items, max_output_tokens=1, temperature=0,
        include=["message.output_text.logprobs"], top_logprobs=5,
    )  # fmt: skip
    chat = tools_client.chat.completions.create(
        model=model_name, messages=messages, max_tokens=1, temperature=0, logprobs=True, top_logprobs=5
    )
    [part] = resp.output[0].content
    [expected] = chat.choices[0].logprobs.content
    # (the same top tokens; their logprobs to float rounding: the second request reuses the
    # first's cached prefix, which a batch of another shape computed)
    assert [t.token for t in part.logprobs[0].top_logprobs] == [t.token for t in expected.top_logprobs]
    assert [t.logprob for t in part.logprobs[0].top_logprobs] == pytest.approx(
        [t.logprob for t in expected.top_logprobs], abs=1e-4
    )


@pytest.fixture(scope="module")
def thinking(start_server, engine_args, tmp_path_factory) -> tuple[str, Path]:
    """A tokenizer whose ``<think>`` and ``</think>`` are single tokens, and a template whose
    prompt always ends with ``<think>`` (a thinking-only model's): the output begins inside the
    reasoning, which the tiny model does not close."""
    folder = tmp_path_factory.mktemp("thinking")
    model = make_model_dir(folder / "thinker", added_tokens=("<think>", "</think>"), seed=1)
    template = folder / "thinking.jinja"
    template.write_text("{%- set open_thinking = true %}" + TEMPLATE.read_text())
    server = start_server(
        [
            "--model", str(model), *engine_args, "--chat-template", str(template),
            "--reasoning-parser", "qwen3",
        ]
    )  # fmt: skip
    return server.url, model


def test_reasoning_tokens_are_the_generated_ones_streamed_or_not(thinking):
    """An unclosed reasoning: every generated token is a reasoning token, as chat's token ids
    show, streamed or not; its text encoded again is 16 tokens (the old count, capped at the
    output's 12, hid that here: test_responses_order has the cases it got wrong)."""
    thinking_url, model = thinking
    body = {"input": "Hi", "max_output_tokens": 12, "temperature": 0}
    whole = create(thinking_url, body)
    final = stream_events(thinking_url, body)[-1]["response"]
    for response in (final, whole):
        del response["usage"]["input_tokens_details"]  # (the second read the prompt from the cache)
    assert without_ids(final) == without_ids(whole)
    [reasoning] = whole["output"]
    assert reasoning["type"] == "reasoning" and reasoning["status"] == "incomplete"
    assert whole["usage"]["output_tokens"] == 12
    assert whole["usage"]["output_tokens_details"] == {"reasoning_tokens": 12}
    chat = httpx.post(
        f"{thinking_url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "temperature": 0,
              "return_token_ids": True},
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=120,
    ).json()  # fmt: skip
    [choice] = chat["choices"]
    text = choice["message"]["reasoning_content"]
    assert text == reasoning["content"][0]["text"] and len(choice["token_ids"]) == 12
    assert len(load_tokenizer(model).encode(text, add_special_tokens=False)) == 16


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "plan_trip"}])
def test_a_forced_tool_call_is_a_function_call_item(
    grammar_backend, tools_client, tools_server, model_name, choice
):
    body = {
        "model": model_name,
        "input": ASK,
        "tools": [WEATHER, BOUNDED] if choice != "required" else [BOUNDED],
        "tool_choice": choice,
        "parallel_tool_calls": False,
        "max_output_tokens": 100,
        "temperature": 0,
    }
    resp = tools_client.responses.create(**body)
    whole = create(tools_server.url, body)
    assert resp.status == "completed", resp.output
    [call] = resp.output
    assert (
        call.type == "function_call"
        and call.name == "plan_trip"
        and call.call_id
        and call.status == "completed"
    )
    jsonschema.validate(json.loads(call.arguments), BOUNDED["parameters"])
    assert resp.output_text == "" and resp.parallel_tool_calls is False
    assert resp.tools[-1].name == "plan_trip"
    # streamed: the call's item built by its arguments' deltas, the final response the same
    events = stream_events(tools_server.url, body)
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    [done] = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert deltas == done["arguments"] == call.arguments and done["name"] == "plan_trip"
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    assert without_ids(final) == without_ids(whole) and whole["output"][0]["arguments"] == call.arguments
    with tools_client.responses.stream(**body) as stream:
        helper_final = stream.get_final_response()
    assert helper_final.output[0].arguments == call.arguments and helper_final.status == "completed"


# ------------------------------------------------------------------ streaming


TEXT_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


def test_a_stream_builds_the_same_response(client, server, model_name):
    body = {"model": model_name, "input": ASK, "max_output_tokens": 6, "temperature": 0}
    whole = create(server.url, body)
    events = stream_events(server.url, body)
    kinds = [e["type"] for e in events]
    deduplicated = [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]
    assert deduplicated == [*TEXT_ORDER, "response.incomplete"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    [done] = [e for e in events if e["type"] == "response.output_text.done"]
    assert text == done["text"] == whole["output"][0]["content"][0]["text"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    final = events[-1]["response"]
    assert without_ids(final) == without_ids(whole)
    item_id = events[2]["item"]["id"]
    assert all(e.get("item_id", item_id) == item_id for e in events) and final["output"][0]["id"] == item_id
    # the client's own stream helper reads the same events (get_final_response() wants
    # response.completed: see the forced tool call's test)
    with client.responses.stream(**body) as stream:
        typed = list(stream)
    helper_kinds = [event.type for event in typed]
    # (as many text deltas as the route's deltas: tokens merge when it falls behind)
    assert [k for i, k in enumerate(helper_kinds) if i == 0 or k != helper_kinds[i - 1]] == deduplicated
    assert typed[-1].response.output_text == text and typed[-1].response.status == "incomplete"


def test_logprobs_come_with_the_text_streamed_or_not(client, server, model_name):
    body = {"model": model_name, "input": ASK, "max_output_tokens": 4, "temperature": 0,
            "include": ["message.output_text.logprobs"], "top_logprobs": 2}  # fmt: skip
    whole = create(server.url, body)
    [part] = whole["output"][0]["content"]
    chat = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": ASK}], max_tokens=4, temperature=0,
        logprobs=True, top_logprobs=2,
    )  # fmt: skip
    assert part["logprobs"] == chat.model_dump(mode="json")["choices"][0]["logprobs"]["content"]
    events = stream_events(server.url, body)
    streamed = [lp for e in events if e["type"] == "response.output_text.delta" for lp in e["logprobs"]]
    assert streamed == part["logprobs"]
    assert without_ids(events[-1]["response"]) == without_ids(whole)


def test_a_client_that_leaves_mid_stream_aborts_the_request(server, auth, read_metrics):
    from .test_load import wait_idle

    before = wait_idle(read_metrics)
    body = {"input": "Tell me a very long story", "max_output_tokens": 1900, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, headers=auth, timeout=60) as resp:
        lines = resp.iter_lines()
        deltas = 0
        while deltas < 3:
            deltas += next(lines) == "event: response.output_text.delta"
    idle = wait_idle(read_metrics, timeout=5)
    abort = 'minisgl_requests_total{finish_reason="abort"}'
    assert idle[abort] == before[abort] + 1
    assert idle["minisgl_generation_tokens_total"] < before["minisgl_generation_tokens_total"] + 1900


def test_an_error_mid_stream_is_an_error_event_then_response_failed(server, auth, model_name):
    """The request's own timeout running out mid-stream: the chat route's error event (the 504's
    code and param), as Responses events."""
    body = {"model": model_name, "input": "Once", "max_output_tokens": 1500, "temperature": 0, "timeout": 0.3}
    refused = httpx.post(f"{server.url}/v1/responses", json=body, headers=auth, timeout=60)
    assert refused.status_code == 504 and refused.json()["error"]["code"] == "request_timeout"
    events = stream_events(server.url, body)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert (events[-2]["code"], events[-2]["param"]) == ("request_timeout", "timeout")
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert "0.3s" in failed["error"]["message"] and failed["usage"] is None


def test_reasoning_and_calls_are_items_of_their_own():
    """What a reasoning parser and a tool parser make of an answer, whole and streamed (no server:
    the tiny model's text has no reasoning tags)."""
    plan = ToolPlan(HermesToolParser, [{"type": "function", "function": {"name": "f", "parameters": {}}}])
    output = ChoiceOutput(plan, Qwen3ReasoningParser)
    text = '<think>Think.</think>Hi<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    items = read_whole(output, Choice(0, text=text, finish_reason="length"), logprobs=False).items
    Response.model_validate(
        {
            "id": "resp_1",
            "object": "response",
            "created_at": 0,
            "model": "m",
            "output": items,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }  # fmt: skip
    )
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call"]
    assert items[0]["content"] == [{"type": "reasoning_text", "text": "Think."}]
    assert items[2]["call_id"].startswith("call_") and items[2]["arguments"] == '{"a": 1}'
    stream = EventStream(logprobs=False)
    events = [
        *stream.delta({"reasoning_content": "Thi"}, []),
        *stream.delta({"reasoning_content": "nk."}, []),
        *stream.delta({"content": "Hi"}, []),
        *stream.delta(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"a"'},
                    }
                ]
            },
            [],
        ),  # fmt: skip
        *stream.delta({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}, []),
        *stream.finish(incomplete=True),
    ]
    parsed = [json.loads(e.split("data: ", 1)[1]) for e in events]
    for event in parsed:
        EVENTS.validate_python(event)
    assert [e["type"] for e in parsed] == [
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        *TEXT_ORDER[2:],
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done",
    ]  # fmt: skip
    assert [i["status"] for i in stream.items] == ["completed", "completed", "incomplete"]
    assert [i["status"] for i in items] == ["completed", "completed", "incomplete"]
    assert [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in stream.items] == [
        {k: v for k, v in i.items() if k not in ("id", "call_id")} for i in items
    ]


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"conversation": "conv_1"}, "conversation", "send the whole conversation in input"),
        ({"background": True}, "background", "leave background false"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt", "send the text in instructions and input"),
        ({"include": ["file_search_call.results"]}, "include", "message.output_text.logprobs"),
        ({"include": ["code_interpreter_call.outputs"]}, "include", "minisgl encrypts no reasoning"),
        # (accepted, and the reasoning item's summary came back an empty list; "auto" is taken)
        (
            {"reasoning": {"summary": "detailed"}},
            "reasoning.summary",
            "reasoning summaries are not supported",
        ),
        (
            {"reasoning": {"effort": "low", "generate_summary": "concise"}},
            "reasoning.generate_summary",
            "leave reasoning.generate_summary out",
        ),
        ({"truncation": "auto"}, "truncation", 'leave truncation "disabled"'),
        ({"text": {"verbosity": "low"}}, "text.verbosity", '"medium" (the default)'),
        ({"prompt_cache_retention": "24h"}, "prompt_cache_retention", 'or "in_memory"'),
        ({"text": {"verbosity": "high"}}, "text.verbosity", "bound the answer"),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type", "'web_search' is not supported"),
        (
            {"tools": [WEATHER, {"type": "file_search", "vector_store_ids": []}]},
            "tools.1.type",
            "'file_search'",
        ),
        (
            {"tool_choice": {"type": "web_search_preview"}},
            "tool_choice",
            "'web_search_preview' is not supported",
        ),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input.0.type", "'web_search_call'"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x"}]}]},
            "input.0.content.0.type",
            "text only",
        ),  # fmt: skip
        # (a tool's image: it was "input.1.output.0.text: Field required", as if a text part lacked it)
        (
            {
                "input": [
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                    {
                        "type": "function_call_output",
                        "call_id": "c",
                        "output": [{"type": "input_image", "image_url": "https://x"}],
                    },
                ]
            },
            "input.1.output.0.type",
            "text only",
        ),
        # (an item's type not a string: a 400, not a 500 "unhashable type", found by test_fuzz)
        ({"input": [{"type": {"a": 1}, "role": "user", "content": "Hi"}]}, "input.0.type", "'message'"),
        ({"context_management": [{"type": "compaction"}]}, "context_management", "unsupported field"),
        ({"top_logprobs": 2}, "top_logprobs", "message.output_text.logprobs"),
        ({"max_output_tokens": 0}, "max_output_tokens", "max_output_tokens must be"),
        ({"max_output_tokens": 5000}, "max_output_tokens", "shorten the prompt or lower max_output_tokens"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x"}}},
            "text.format",
            "needs a name and a schema",
        ),
        (
            {"tools": [{**WEATHER, "parameters": {"type": "string"}}], "tool_choice": "required"},
            "tools.0.parameters",
            "type 'object'",
        ),  # fmt: skip
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "'nope'"),
        ({"input": [{"role": "wizard", "content": "Hi"}]}, "input.0.role", "'user'"),
        ({"input": []}, "input", "at least one item"),
        ({"temperature": -1}, "temperature", ">= 0"),
        # OpenAI's bounds on metadata (16 pairs, keys of 64 characters, values of 512)
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata", "at most 16 pairs"),
        ({"metadata": {"k" * 65: "v"}}, "metadata", "keys of at most 64 characters"),
        ({"metadata": {"k": "v" * 513}}, "metadata", "values of at most 512 characters"),
    ],
)
def test_what_is_not_served_is_a_400_naming_the_field(client, model_name, extra, param, words):
    body = {"model": model_name, "input": ASK, "max_output_tokens": 2, **extra}
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(**body)
    error = refused.value.body
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param and words in error["message"], error


@pytest.mark.parametrize("choice", ["required", "named"])
def test_a_tool_schema_a_forced_call_cannot_follow_is_a_400_naming_its_parameters(
    grammar_backend, tools_client, model_name, choice
):
    """Parameters no arguments can follow, under a tool_choice that forces calls: the 400 named
    tool_choice (the forced grammar's compile failed as a whole); it names the tool's parameters
    as this API spells them (``tools.1.parameters``) and says what the grammar backend found."""
    pick = {**WEATHER, "name": "pick", "parameters": UNSATISFIABLE}
    tool_choice = {"type": "function", "name": "pick"} if choice == "named" else choice
    with pytest.raises(openai.BadRequestError) as refused:
        tools_client.responses.create(
            model=model_name, input=ASK, max_output_tokens=2, tools=[WEATHER, pick], tool_choice=tool_choice
        )
    error = refused.value.body
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == "tools.1.parameters", error
    message = error["message"]
    assert message.startswith("tools.1.parameters: the parameters of function 'pick'"), error
    assert "minItems" in message or "nsatisfiable" in message, error  # (xgrammar's words, llguidance's)


def test_an_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input=ASK, max_output_tokens=2)


# ------------------------------------------------------------------ stored responses


def get(url: str, path: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{url}{path}", params=params, headers={"Authorization": f"Bearer {API_KEY}"})


def output_items(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A response's output items, as an agent sends them back in input."""
    return response["output"]


def same_answer(chained: dict[str, Any], written: dict[str, Any]) -> None:
    """The same prompt (its token count) and the same greedy output."""
    assert chained["usage"]["input_tokens"] == written["usage"]["input_tokens"]
    assert [i["type"] for i in chained["output"]] == [i["type"] for i in written["output"]]
    assert without_ids(chained)["output"] == without_ids(written)["output"]


def test_a_chain_of_previous_response_ids_is_the_conversation_written_out(server, model_name):
    """Each turn continues the stored conversation: its input, then its output, then the new
    input; a chain of three is the three turns written out by hand (greedy: the same output)."""
    turn = {"model": model_name, "max_output_tokens": 5, "temperature": 0}
    first = create(server.url, {**turn, "input": ASK})
    second = create(server.url, {**turn, "input": "And tomorrow?", "previous_response_id": first["id"]})
    third = create(
        server.url,
        {**turn, "input": [{"role": "user", "content": "Thanks"}], "previous_response_id": second["id"]},
    )
    assert second["previous_response_id"] == first["id"] and first["previous_response_id"] is None
    conversation = [
        {"role": "user", "content": ASK},
        *output_items(first),
        {"role": "user", "content": "And tomorrow?"},
        *output_items(second),
        {"role": "user", "content": "Thanks"},
    ]
    written = create(server.url, {**turn, "input": conversation})
    same_answer(third, written)
    two_turns = create(server.url, {**turn, "input": conversation[:3]})
    same_answer(second, two_turns)
    assert third["usage"]["input_tokens"] > second["usage"]["input_tokens"] > first["usage"]["input_tokens"]


def test_instructions_are_not_carried_over(client, server, model_name):
    """OpenAI's rule: a turn's instructions are its own; the previous turn's are not part of the
    conversation it continues."""
    turn = {"model": model_name, "max_output_tokens": 5, "temperature": 0}
    first = create(server.url, {**turn, "input": ASK, "instructions": "You are terse."})
    chained = create(server.url, {**turn, "input": "Why?", "previous_response_id": first["id"]})
    conversation = [
        {"role": "user", "content": ASK},
        *output_items(first),
        {"role": "user", "content": "Why?"},
    ]
    same_answer(chained, create(server.url, {**turn, "input": conversation}))
    assert chained["instructions"] is None
    # new instructions: a system message first, before the stored conversation
    other = client.responses.create(
        **turn, input="Why?", previous_response_id=first["id"], instructions="Be kind."
    )
    written = create(server.url, {**turn, "input": conversation, "instructions": "Be kind."})
    assert other.usage.input_tokens == written["usage"]["input_tokens"] and other.instructions == "Be kind."
    assert other.output_text == written["output"][0]["content"][0]["text"]


def test_the_tool_loop_chains_a_call_and_its_output(grammar_backend, tools_client, tools_server, model_name):
    """The agent loop: the model calls a function (forced), the client runs it and sends only its
    function_call_output with previous_response_id; the prompt holds the call and its output as
    if the whole conversation had been sent."""
    forced = {"model": model_name, "tools": [BOUNDED], "temperature": 0, "parallel_tool_calls": False}
    called = tools_client.responses.create(
        **forced, input=ASK, tool_choice={"type": "function", "name": "plan_trip"}, max_output_tokens=100
    )
    [call] = called.output
    assert call.type == "function_call" and call.status == "completed"
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "booked"}
    body = {**forced, "max_output_tokens": 5}
    chained = create(tools_server.url, {**body, "input": [result], "previous_response_id": called.id})
    conversation = [{"role": "user", "content": ASK}, call.model_dump(exclude_none=True), result]
    written = create(tools_server.url, {**body, "input": conversation})
    same_answer(chained, written)
    # the call and its output are in the prompt: without them it is shorter
    asked = create(tools_server.url, {**body, "input": ASK})
    assert chained["usage"]["input_tokens"] > asked["usage"]["input_tokens"]
    # continued without the call's output: OpenAI's 400 (the call would go unanswered)
    error = refusal(tools_client, model_name, input="Thanks", previous_response_id=called.id)
    assert error["param"] == "input", error
    assert error["message"].startswith(f"No tool output found for function call '{call.call_id}'"), error


CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"}
ANSWER = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}


def test_a_function_call_output_that_answers_no_call_is_a_400(client, model_name):
    """A function_call_output whose call_id no function_call has, in input or in the
    previous_response_id chain, was accepted: its output rendered as a tool result after no call
    of that id. OpenAI answers it 400 "No tool call found for function call output with call_id
    call_....", type invalid_request_error, param "input" (the error bodies quoted in
    continuedev/continue#10092 and leookun/cursor-byok#307, GitHub issues corpus); ours is that
    400, its message starting the same, its param the item's field (``input.1.call_id``, as this
    API's other item errors name theirs: ``input.1.id`` for a duplicate id). An output sent before
    its call answers no call made yet: the same 400."""
    orphan = {**ANSWER, "call_id": "call_nope"}
    user = {"role": "user", "content": ASK}
    plain = client.responses.create(model=model_name, input=ASK, max_output_tokens=2)
    answered = client.responses.create(model=model_name, input=[user, CALL, ANSWER], max_output_tokens=2)
    for extra, index, call_id in [
        ({"input": [user, orphan]}, 1, "call_nope"),
        ({"input": [user, CALL, ANSWER, orphan]}, 3, "call_nope"),
        ({"input": [orphan], "previous_response_id": plain.id}, 0, "call_nope"),  # (the chain has no call)
        ({"input": [orphan], "previous_response_id": answered.id}, 0, "call_nope"),
        ({"input": [user, ANSWER, CALL]}, 1, "call_1"),  # (the output before its call)
    ]:
        error = refusal(client, model_name, **extra)
        assert error["param"] == f"input.{index}.call_id", error
        assert error["message"].startswith(
            f"No tool call found for function call output with call_id '{call_id}'"
        ), error
    # an output answering a call of input, or of the previous response's conversation, is served:
    # test_a_function_call_round_trip_is_the_chat_conversation and test_the_tool_loop_chains_...
    assert answered.status in ("completed", "incomplete")


def test_a_function_call_without_its_output_is_openais_400(client, model_name):
    """A function_call item with no function_call_output after it was accepted: the call rendered
    unanswered, and the model answered as if it had returned nothing. OpenAI answers 400 "No tool
    output found for function call call_....", param "input" (openai/openai-support-agent-demo#12:
    a call last in input; openai/openai-agents-python#673: a previous response's calls left
    unanswered); so does minisgl, whether the call is last, before a user message, or one of two
    parallel calls of which one was answered."""
    user = {"role": "user", "content": ASK}
    second = {**CALL, "call_id": "call_2"}
    for items, missing in [
        ([user, CALL], "call_1"),
        ([user, CALL, {"role": "user", "content": "Thanks"}], "call_1"),
        ([user, CALL, second, ANSWER], "call_2"),
    ]:
        error = refusal(client, model_name, input=items)
        assert error["param"] == "input", error
        assert error["message"].startswith(f"No tool output found for function call '{missing}'"), error
    # answered, the same calls are served
    answered = [user, CALL, second, ANSWER, {**ANSWER, "call_id": "call_2"}]
    assert client.responses.create(model=model_name, input=answered, max_output_tokens=2).output


def test_a_call_id_two_calls_or_two_outputs_share_is_a_400_naming_the_second(client, model_name):
    """Two function_call items of one call_id (which does an output answer?) and two outputs of
    one call were accepted, rendered as two calls, or two results, of the same id."""
    user = {"role": "user", "content": ASK}
    answered = client.responses.create(model=model_name, input=[user, CALL, ANSWER], max_output_tokens=2)
    for extra, index, words in [
        ({"input": [user, CALL, CALL, ANSWER]}, 2, "Duplicate function call with call_id 'call_1'"),
        ({"input": [user, CALL, ANSWER, ANSWER]}, 3, "Duplicate function call output for call_id 'call_1'"),
        # the previous response's conversation has the call and its output already
        ({"input": [ANSWER], "previous_response_id": answered.id}, 0, "Duplicate function call output"),
        ({"input": [CALL, ANSWER], "previous_response_id": answered.id}, 0, "Duplicate function call with"),
    ]:
        error = refusal(client, model_name, **extra)
        assert error["param"] == f"input.{index}.call_id", error
        assert error["message"].startswith(words), error


def test_a_reasoning_item_chains_as_the_assistants_reasoning(thinking):
    """A previous output that is reasoning (cut off while thinking) continues as it would sent
    back by hand."""
    thinking_url, _ = thinking
    turn = {"max_output_tokens": 6, "temperature": 0}
    first = create(thinking_url, {**turn, "input": "Hi"})
    assert [i["type"] for i in first["output"]] == ["reasoning"]
    chained = create(thinking_url, {**turn, "input": "Go on", "previous_response_id": first["id"]})
    conversation = [
        {"role": "user", "content": "Hi"},
        *output_items(first),
        {"role": "user", "content": "Go on"},
    ]
    written = create(thinking_url, {**turn, "input": conversation})
    for response in (chained, written):
        del response["usage"]["input_tokens_details"]  # (the second read the prompt from the cache)
    same_answer(chained, written)


def test_a_stateless_client_asking_for_encrypted_reasoning_gets_it_as_text(thinking):
    """``store: false`` with ``include: ["reasoning.encrypted_content"]`` (what Codex-style agents
    send to carry reasoning between turns) is taken: the answer is the one without the include, its
    reasoning item carries no encrypted content, and that item sent back with the next message is
    the assistant's reasoning (the same answer as the conversation written out)."""
    thinking_url, _ = thinking
    turn = {"max_output_tokens": 6, "temperature": 0, "store": False}
    asked = create(thinking_url, {**turn, "input": "Hi", "include": ["reasoning.encrypted_content"]})
    plain = create(thinking_url, {**turn, "input": "Hi"})
    same_answer(asked, plain)
    assert [i["type"] for i in asked["output"]] == ["reasoning"]
    assert asked["output"][0].get("encrypted_content") is None and asked["output"][0]["content"]
    conversation = [
        {"role": "user", "content": "Hi"},
        *output_items(asked),
        {"role": "user", "content": "Go on"},
    ]
    sent_back = create(
        thinking_url, {**turn, "input": conversation, "include": ["reasoning.encrypted_content"]}
    )
    same_answer(sent_back, create(thinking_url, {**turn, "input": conversation}))
    # (its text is what the prompt holds: emptied, the prompt is shorter)
    emptied = {**conversation[1], "content": [{"type": "reasoning_text", "text": ""}]}
    without_text = create(thinking_url, {**turn, "input": [conversation[0], emptied, conversation[2]]})
    assert sent_back["usage"]["input_tokens"] > without_text["usage"]["input_tokens"]


def test_get_returns_the_answer_as_created_streamed_or_not_and_delete_forgets_it(client, server, model_name):
    body = {"model": model_name, "input": ASK, "max_output_tokens": 4, "temperature": 0}
    whole = create(server.url, body)
    assert get(server.url, f"/v1/responses/{whole['id']}").json() == whole
    streamed = stream_events(server.url, body)[-1]["response"]
    fetched = get(server.url, f"/v1/responses/{streamed['id']}")
    assert fetched.status_code == 200 and fetched.json() == streamed
    Response.model_validate(fetched.json())
    assert client.responses.retrieve(whole["id"]).output_text == whole["output"][0]["content"][0]["text"]
    # DELETE: OpenAI's answer, then the id is unknown to GET, DELETE and previous_response_id
    deleted = httpx.delete(
        f"{server.url}/v1/responses/{whole['id']}", headers={"Authorization": f"Bearer {API_KEY}"}
    )
    assert deleted.status_code == 200
    assert deleted.json() == {"id": whole["id"], "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.retrieve(whole["id"])
    assert whole["id"] in missing.value.body["message"] and missing.value.body["param"] == "response_id"
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(whole["id"])
    with pytest.raises(openai.BadRequestError) as unknown:
        client.responses.create(**body, previous_response_id=whole["id"])
    assert unknown.value.body["code"] == "previous_response_not_found"
    assert client.responses.retrieve(streamed["id"]).id == streamed["id"]  # (the other one stays)


def test_a_stored_response_is_not_streamed_again(client, model_name):
    """GET with stream (the SDK's ``responses.stream(response_id=...)``, ``retrieve(stream=True)``)
    is a 400 naming stream: minisgl keeps no events to replay, and its JSON answer, read as a
    stream, was no event at all and no error."""
    kept = client.responses.create(model=model_name, input=ASK, max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as refused:
        with client.responses.stream(response_id=kept.id, starting_after=1) as stream:
            list(stream)
    assert (refused.value.body["param"], refused.value.body["code"]) == ("stream", "unsupported_field")
    with pytest.raises(openai.BadRequestError):
        list(client.responses.retrieve(kept.id, stream=True))
    assert client.responses.retrieve(kept.id, stream=False).id == kept.id


def test_store_false_keeps_nothing(client, model_name):
    kept = client.responses.create(model=model_name, input=ASK, max_output_tokens=2)
    assert client.responses.retrieve(kept.id).id == kept.id
    unkept = client.responses.create(model=model_name, input=ASK, max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model=model_name, input="Hi", max_output_tokens=2, previous_response_id=unkept.id
        )
    assert refused.value.body["param"] == "previous_response_id"


def test_an_unknown_previous_response_id_is_openais_400_naming_it(client, model_name):
    """OpenAI answers an id it does not hold with a 400 of code previous_response_not_found
    (what agent clients look for to resend the whole conversation)."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model=model_name, input=ASK, max_output_tokens=2, previous_response_id="resp_nope"
        )
    error = refused.value.body
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == ("previous_response_id", "previous_response_not_found")
    assert "'resp_nope' not found" in error["message"] and "--responses-store-size" in error["message"]
    # an empty id is no stored one either (it ran as no id at all), and a long one is not echoed whole
    for rid in ("", "r" * 100_000):
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(
                model=model_name, input=ASK, max_output_tokens=2, previous_response_id=rid
            )
        assert refused.value.body["code"] == "previous_response_not_found"
        assert len(refused.value.body["message"]) < 300
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.retrieve("r" * 5000)
    assert len(missing.value.body["message"]) < 300


def test_an_item_id_given_twice_is_a_400_naming_the_second(client, model_name):
    """A conversation's items have distinct ids, as OpenAI's (whose 400 says "Duplicate item
    found"): GET .../input_items pages by them (a client paging items sharing an id was sent the
    second one again and again), and a previous response's output sent back in input beside its
    previous_response_id ran that turn twice in the prompt."""
    twice = [
        {"role": "user", "content": "Hi", "id": "msg_1"},
        {"role": "user", "content": "Yo", "id": "msg_1"},
    ]
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=model_name, input=twice, max_output_tokens=2)
    error = refused.value.body
    assert error["param"] == "input.1.id" and "Duplicate item found with id 'msg_1'" in error["message"]
    first = client.responses.create(model=model_name, input=ASK, max_output_tokens=2)
    again = [
        *(item.model_dump(exclude_none=True) for item in first.output),
        {"role": "user", "content": "Hi"},
    ]
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model=model_name, input=again, max_output_tokens=2, previous_response_id=first.id
        )
    assert refused.value.body["param"] == "input.0.id" and first.output[0].id in refused.value.body["message"]
    # the same items as the whole conversation, with no previous_response_id, are one of each
    written = [{"role": "user", "content": ASK}, *again]
    assert client.responses.create(model=model_name, input=written, max_output_tokens=2).status


def test_the_stored_routes_need_the_api_key(server, client, model_name):
    kept = client.responses.create(model=model_name, input=ASK, max_output_tokens=2)
    where = f"{server.url}/v1/responses/{kept.id}"
    for method in ("GET", "DELETE"):
        refused = httpx.request(method, where)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{where}/input_items").status_code == 401
    assert client.responses.retrieve(kept.id).id == kept.id  # (DELETE without the key deleted nothing)


def test_input_items_list_the_conversation_a_response_ran_on(client, server, model_name):
    first = create(server.url, {"model": model_name, "input": ASK, "max_output_tokens": 2})
    second = client.responses.create(
        model=model_name, input="And tomorrow?", max_output_tokens=2, previous_response_id=first["id"]
    )
    listed = client.responses.input_items.list(second.id, order="asc")
    kinds = [(item.type, getattr(item, "role", None)) for item in listed.data]
    assert kinds == [("message", "user"), ("message", "assistant"), ("message", "user")]
    assert listed.data[1].id == first["output"][0]["id"] and listed.data[2].id.startswith("msg_")
    # a text sent as a string is listed as its one part, as OpenAI lists it
    assert [(p.type, p.text) for p in listed.data[2].content] == [("input_text", "And tomorrow?")]
    assert listed.data[1].content[0].type == "output_text"
    page = get(server.url, f"/v1/responses/{second.id}/input_items", limit=2).json()  # (desc: latest first)
    assert page["object"] == "list" and page["has_more"] is True
    assert [i["id"] for i in page["data"]] == [i.id for i in listed.data[::-1][:2]]
    assert (page["first_id"], page["last_id"]) == (page["data"][0]["id"], page["data"][1]["id"])
    rest = get(server.url, f"/v1/responses/{second.id}/input_items", limit=2, after=page["last_id"]).json()
    assert [i["id"] for i in rest["data"]] == [listed.data[0].id] and rest["has_more"] is False


def test_input_items_listed_are_the_clients_items(server, model_name):
    """Each listed item is one of the client's ``ResponseItem`` types, validated: an item sent with
    no status is listed ``completed``, as OpenAI lists input items (the assistant message, the
    call and its output lacked the status those types require), an assistant's text parts are
    ``output_text`` with their annotations, and those of the other roles ``input_text``."""
    sent = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "It is sunny."}]},
        {"role": "assistant", "content": "Sunny.", "status": "incomplete"},
        {"role": "user", "content": [{"type": "output_text", "text": "Thanks", "annotations": []}]},
    ]
    kept = create(server.url, {"model": model_name, "input": sent, "max_output_tokens": 2})
    listed = get(server.url, f"/v1/responses/{kept['id']}/input_items", order="asc").json()["data"]
    assert [item["type"] for item in listed] == [item.get("type", "message") for item in sent]
    for item in listed:
        RESPONSE_ITEM.validate_python(item)
    assert [item["status"] for item in listed] == [*["completed"] * 5, "incomplete", "completed"]
    assert listed[1]["content"] == [{"type": "output_text", "text": "Let me look.", "annotations": []}]
    assert listed[-1]["content"] == [{"type": "input_text", "text": "Thanks"}]


def test_a_failed_stream_is_stored_failed_and_a_left_one_not(server, auth, model_name, read_metrics):
    from .test_load import wait_idle

    body = {"model": model_name, "input": "Once", "max_output_tokens": 1500, "temperature": 0, "timeout": 0.3}
    failed = stream_events(server.url, body)[-1]["response"]
    assert failed["status"] == "failed"
    assert get(server.url, f"/v1/responses/{failed['id']}").json() == failed
    # The engine is paused while the client leaves, so the response cannot end before the server
    # sees it gone: unpaused, a loaded machine could make all 1900 tokens before the server saw the
    # disconnect, and the response, complete, was rightly stored (GET answered 200).
    abort, before = 'minisgl_requests_total{finish_reason="abort"}', wait_idle(read_metrics)
    body = {"input": "Tell me a very long story", "max_output_tokens": 1900, "temperature": 0, "stream": True}
    paused = httpx.post(f"{server.url}/pause_generation", json={"mode": "in_place"}, headers=auth)
    assert paused.status_code == 200, paused.text
    try:
        with httpx.stream("POST", f"{server.url}/v1/responses", json=body, headers=auth, timeout=60) as resp:
            lines = resp.iter_lines()
            created = json.loads(next(line for line in lines if line.startswith("data: "))[len("data: ") :])
        deadline = time.monotonic() + 30
        while get(server.url, "/get_server_info").json()["queued_or_running"]:
            assert time.monotonic() < deadline, "the server never saw the client leave"
            time.sleep(0.02)
    finally:
        assert httpx.post(f"{server.url}/continue_generation", headers=auth).status_code == 200
    assert wait_idle(read_metrics, timeout=5)[abort] == before[abort] + 1  # (the request aborted)
    assert get(server.url, f"/v1/responses/{created['response']['id']}").status_code == 404


def test_cancel_is_openais_400_for_a_response_not_run_in_the_background(client, model_name):
    """``client.responses.cancel`` (POST .../cancel, for background responses, which minisgl does
    not run) was a bare 404 "Not Found", as for a path the server does not have: a stored response
    is OpenAI's 400 "Cannot cancel a synchronous response", saying what ends one still running; an
    id not stored the GET's 404."""
    kept = client.responses.create(model=model_name, input=ASK, max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.cancel(kept.id)
    error = refused.value.body
    assert error["param"] == "response_id" and error["type"] == "invalid_request_error", error
    assert error["message"].startswith("Cannot cancel a synchronous response"), error
    assert f'POST /abort_request {{"rid": "{kept.id}"}}' in error["message"], error
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.cancel("resp_nope")
    assert missing.value.body["message"].startswith("Response with id 'resp_nope' not found"), (
        missing.value.body
    )


def test_a_client_that_leaves_a_response_not_streamed_aborts_it(server, auth, read_metrics):
    """background is refused and cancel is for background responses: a response answered whole
    is stopped by its client leaving, as a stream is. The server sees the connection close while
    it waits for the answer and aborts the request, long before its 1,900 tokens."""
    from .test_load import wait_idle

    before = wait_idle(read_metrics)
    body = {"input": "Tell me a very long story", "max_output_tokens": 1900, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/responses", json=body, headers=auth, timeout=0.5)
    idle = wait_idle(read_metrics, timeout=5)
    abort = 'minisgl_requests_total{finish_reason="abort"}'
    assert idle[abort] == before[abort] + 1
    assert idle["minisgl_generation_tokens_total"] < before["minisgl_generation_tokens_total"] + 1900


def test_compact_is_a_400_saying_it_is_not_supported(client, model_name):
    """``client.responses.compact`` (OpenAI's conversation shrunk to an encrypted item only its
    models read) was a 405 "Method Not Allowed": the path is GET /v1/responses/{id}'s."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.compact(model=model_name, input=ASK)
    error = refused.value.body
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["message"].startswith("POST /v1/responses/compact is not supported"), error
    assert "previous_response_id" in error["message"], error


# ------------------------------------------------------------------ counting input tokens


def count_tokens(client: openai.OpenAI, **body: Any) -> int:
    """``client.responses.input_tokens.count``'s answer, checked strictly as the SDK's type."""
    raw = client.responses.input_tokens.with_raw_response.count(**body)
    answer = raw.http_response.json()
    assert answer == {"object": "response.input_tokens", "input_tokens": answer["input_tokens"]}
    InputTokenCountResponse.model_validate(answer, strict=True)
    counted = raw.parse()
    assert isinstance(counted, InputTokenCountResponse)
    return counted.input_tokens


def test_input_tokens_count_is_the_usage_of_the_same_request(tools_client, tools_server, model_name):
    """``client.responses.input_tokens.count`` (POST /v1/responses/input_tokens) was a 405: it
    counts what the same request, created, reports as ``usage.input_tokens``: its instructions,
    input, tools and reasoning effort (this template renders the last two), and with
    previous_response_id the stored conversation before the new input, or alone without one."""
    asked = {"model": model_name, "instructions": "You are terse.", "input": ASK, "tools": [WEATHER],
             "reasoning": {"effort": "low"}}  # fmt: skip
    counted = count_tokens(tools_client, **asked)
    created = tools_client.responses.create(**asked, max_output_tokens=3, temperature=0)
    assert counted == created.usage.input_tokens
    for left_out in ("instructions", "tools", "reasoning"):  # (each counts)
        fewer = count_tokens(tools_client, **{k: v for k, v in asked.items() if k != left_out})
        assert fewer < counted, left_out
    assert [item.type for item in created.output] == ["message"]
    follow = {
        "model": model_name,
        "input": "And tomorrow?",
        "previous_response_id": created.id,
        "tools": [WEATHER],
    }
    chained = tools_client.responses.create(**follow, max_output_tokens=3, temperature=0)
    assert count_tokens(tools_client, **follow) == chained.usage.input_tokens
    # the stored conversation alone: the turn and its answer, written out (no instructions: not carried)
    alone = count_tokens(tools_client, model=model_name, previous_response_id=created.id, tools=[WEATHER])
    written = create(
        tools_server.url,
        {"input": [{"role": "user", "content": ASK}, *created.model_dump(mode="json")["output"]],
         "tools": [WEATHER], "max_output_tokens": 1},
    )  # fmt: skip
    assert alone == written["usage"]["input_tokens"]


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        (
            {"previous_response_id": "resp_nope"},
            "previous_response_id",
            "Previous response with id 'resp_nope'",
        ),
        ({"input": None}, "input", "give the input to count"),
        ({"conversation": "conv_1"}, "conversation", "send the whole conversation in input"),
        ({"truncation": "auto"}, "truncation", 'leave truncation "disabled"'),
        ({"reasoning": {"summary": "concise"}}, "reasoning.summary", "reasoning summaries are not supported"),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type", "'web_search' is not supported"),
        # (the same request created: this server has no tool parser to read calls)
        ({"tools": [WEATHER]}, "tool_choice", "--tool-call-parser"),
        ({"input": [{"role": "wizard", "content": "Hi"}]}, "input.0.role", "'user'"),
        ({"personality": "friendly"}, "personality", "unsupported field"),
        # (a generation setting: a count has none, as OpenAI's)
        ({"extra_body": {"max_output_tokens": 5}}, "max_output_tokens", "unsupported field"),
    ],
)
def test_input_tokens_count_refuses_what_a_request_would(client, model_name, extra, param, words):
    body = {"model": model_name, "input": ASK, **extra}
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.input_tokens.count(**body)
    error = refused.value.body
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param and words in error["message"], error


def test_input_tokens_count_of_an_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError):
        client.responses.input_tokens.count(model="no-such-model", input=ASK)
