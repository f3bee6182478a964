"""Tools, reasoning and the rest of the OpenAI surface through the official ``openai`` client, on a
server started with ``--tool-call-parser hermes --reasoning-parser qwen3 --chat-template FILE
--allowed-origins``. The tiny model's weights are random, so its answers are not tool calls: these
tests check what reaches the chat template, the request shapes a tool round trip sends, and the
sampling fields against the offline engine; the parsing of real tool-call text is covered by
``test_tool_output.py`` and the parser plugins' tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from minisgl_core.sampling import SamplingParams
from minisgl_core.testing.cli_runner import run_cli
from minisgl_core.tokenizer.detokenize import raw_token_bytes
from minisgl_core.tokenizer.load import load_tokenizer

TEMPLATE = Path(__file__).parent / "data" / "tools_template.jinja"
ORIGIN = "https://app.example"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
PROMPT = "The quick brown fox jumps over"


@pytest.fixture(scope="module")
def tools_server(start_server, model_dir, engine_args):
    return start_server(
        [
            "--model", str(model_dir), *engine_args,
            "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3",
            "--chat-template", str(TEMPLATE), "--allowed-origins", ORIGIN,
        ]
    )  # fmt: skip


@pytest.fixture(scope="module")
def tools_client(tools_server):
    return openai.OpenAI(base_url=f"{tools_server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def templated(model_dir):
    """The reference: transformers' tokenizer with the same template file."""
    return load_tokenizer(model_dir, chat_template=TEMPLATE.read_text())


def reference_ids(tokenizer, messages, **kwargs) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, **kwargs)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_tools_and_template_kwargs_reach_the_template(tools_client, templated, model_name):
    for extra, kwargs in [
        ({}, {}),
        ({"tools": [WEATHER]}, {"tools": [WEATHER]}),
        (
            {"tools": [WEATHER], "extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
            {"tools": [WEATHER], "enable_thinking": False},
        ),
    ]:
        resp = tools_client.chat.completions.create(model=model_name, messages=ASK, max_tokens=2, **extra)
        assert resp.usage.prompt_tokens == len(reference_ids(templated, ASK, **kwargs)), extra
    no_tools = len(reference_ids(templated, ASK))
    assert len(reference_ids(templated, ASK, tools=[WEATHER])) > no_tools  # the template does render them


DOCS = [{"title": "Paris", "text": "Sunny all week."}, {"title": "Lyon", "text": "Rain."}]


def test_reasoning_effort_and_documents_reach_the_template(tools_client, templated, model_name):
    """OpenAI's reasoning_effort and vLLM's documents are the template's variables (each was a 400
    unsupported field); chat_template_kwargs' own win; the Responses API's reasoning.effort is
    chat's reasoning_effort (it was accepted and dropped)."""
    plain = len(reference_ids(templated, ASK))
    low = len(reference_ids(templated, ASK, reasoning_effort="low"))
    for extra, kwargs in [
        ({"reasoning_effort": "low"}, {"reasoning_effort": "low"}),
        ({"extra_body": {"documents": DOCS}}, {"documents": DOCS}),
        (
            {
                "reasoning_effort": "low",
                "extra_body": {"chat_template_kwargs": {"reasoning_effort": "as you like"}},
            },
            {"reasoning_effort": "as you like"},
        ),
    ]:
        resp = tools_client.chat.completions.create(model=model_name, messages=ASK, max_tokens=2, **extra)
        expected = len(reference_ids(templated, ASK, **kwargs))
        assert resp.usage.prompt_tokens == expected != plain, extra
    assert len(reference_ids(templated, ASK, reasoning_effort="as you like")) != low
    answer = tools_client.responses.create(
        model=model_name, input=ASK[0]["content"], reasoning={"effort": "low"}, max_output_tokens=2
    )
    assert answer.usage.input_tokens == low
    with pytest.raises(openai.BadRequestError) as refused:
        tools_client.chat.completions.create(
            model=model_name, messages=ASK, max_tokens=2, extra_body={"reasoning_effort": "extreme"}
        )
    assert refused.value.body["param"] == "reasoning_effort"


def test_integers_past_64_bits_in_a_tool_reach_the_template(tools_client, templated, model_name):
    """JSON has integers of any size: a tool's schema with ``"const": -9223372036854775809`` was a
    500 (the message to the tokenizer process could not carry it); it reaches the template exactly,
    and a grammar library that cannot take it is a 400."""
    big = {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"n": {"const": -(2**63) - 1}, "m": {"type": "integer", "maximum": 10**30}},
    }}}  # fmt: skip
    resp = tools_client.chat.completions.create(model=model_name, messages=ASK, max_tokens=2, tools=[big])
    assert resp.usage.prompt_tokens == len(reference_ids(templated, ASK, tools=[big]))
    try:
        forced = tools_client.chat.completions.create(
            model=model_name, messages=ASK, max_tokens=4, tools=[big], tool_choice="required"
        )
        assert forced.choices[0].finish_reason in ("stop", "length", "tool_calls")
    except openai.BadRequestError as exc:  # the grammar library's limit, named
        assert "tool" in str(exc).lower() or "integer" in str(exc).lower(), exc


def test_a_lone_surrogate_in_free_form_json_is_a_400(tools_server, model_name):
    """Tool schemas and template variables are JSON of any shape, but their strings must be text:
    a lone surrogate there was a 500 (the message to the tokenizer process cannot carry it)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"enum": ["ok", "\ud800"]}}}
    for extra, param in [
        ({"tools": [tool]}, "tools.0.function.parameters"),
        ({"chat_template_kwargs": {"x": [{"\udc00": 1}]}}, "chat_template_kwargs"),
        # (plain string fields of the tool too: the description was a 500)
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "description": "\ud800"}}],
                "tool_choice": "none",
            },
            "tools.0.function.description",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "\ud800", "schema": {}}}},
            "response_format.json_schema.name",
        ),
    ]:
        body = json.dumps({"model": model_name, "messages": ASK, "max_tokens": 1, **extra})  # escapes it
        resp = httpx.post(f"{tools_server.url}/v1/chat/completions", content=body, timeout=60,
                          headers={"Content-Type": "application/json"})  # fmt: skip
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["param"] == param and "surrogate" in error["message"], error


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/tokenize"])
def test_tool_call_arguments_the_template_cannot_take_are_a_400(tools_server, model_name, route):
    """An assistant message's tool call carries its arguments as JSON text, decoded for the
    template: an escaped lone surrogate inside, or nesting past the decoder's depth, was a 500 (and
    the connection closed)."""
    for arguments, says in [
        ('{"a": "\\ud800"}', "surrogate"),
        ("[" * 1000 + "]" * 1000, "nested too deeply"),
    ]:
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": arguments},
        }
        messages = [*ASK, {"role": "assistant", "tool_calls": [call]}]
        resp = httpx.post(
            f"{tools_server.url}{route}", json={"model": model_name, "messages": messages}, timeout=60
        )
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["param"] == "messages.1.tool_calls.0.function.arguments" and says in error["message"], (
            error
        )
    assert httpx.get(f"{tools_server.url}/health", timeout=10).status_code == 200


def test_tool_parameters_too_deep_for_the_template_name_the_tools(tools_server, model_name):
    """Parameters nested a few hundred levels deep pass the body's parser but not the template's
    rendering: that was a 400 blaming the messages with "maximum recursion depth exceeded"."""
    schema: dict = {"type": "string"}
    for _ in range(400):
        schema = {"type": "object", "properties": {"a": schema}}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    body = {"model": model_name, "messages": ASK, "max_tokens": 1, "tools": [tool]}
    resp = httpx.post(f"{tools_server.url}/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "tools" and "nested too deeply" in error["message"], error
    ok = httpx.post(f"{tools_server.url}/v1/chat/completions", json={**body, "tools": [WEATHER]}, timeout=60)
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("stream", [False, True])
def test_tool_round_trip_messages(tools_client, templated, model_name, stream):
    """tools -> (the assistant's tool call) -> tool message -> final answer, as a client sends it."""
    first = tools_client.chat.completions.create(
        model=model_name, messages=ASK, tools=[WEATHER], tool_choice="auto", max_tokens=8, temperature=0
    )
    assert first.choices[0].finish_reason in ("stop", "length", "tool_calls")
    call = {
        "id": "call_abc",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "18 C and sunny"},
    ]
    expected = reference_ids(
        templated,
        [
            *ASK,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{**call, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
            },
            history[2],
        ],
        tools=[WEATHER],
    )
    rendered = templated.decode(expected)
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in rendered
    assert '<tool_response id="call_abc">18 C and sunny</tool_response>' in rendered
    kwargs = dict(model=model_name, messages=history, tools=[WEATHER], max_tokens=8, temperature=0)
    if not stream:
        final = tools_client.chat.completions.create(**kwargs)
        assert final.usage.prompt_tokens == len(expected)
        assert final.choices[0].message.role == "assistant"
        return
    chunks = list(
        tools_client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[-1].usage.prompt_tokens == len(expected)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] != []


def test_plain_answers_pass_through_the_parsers(tools_client, llm, templated, model_name):
    """Random-model text has no <think> or <tool_call>: all of it is content, streamed or not."""
    ids = reference_ids(templated, ASK, tools=[WEATHER])
    ref = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=12))[0]
    kwargs = dict(model=model_name, messages=ASK, tools=[WEATHER], max_tokens=12, temperature=0)
    resp = tools_client.chat.completions.create(**kwargs)
    assert resp.choices[0].message.content == ref.text and not resp.choices[0].message.tool_calls
    assert resp.choices[0].finish_reason == "length"
    chunks = list(tools_client.chat.completions.create(**kwargs, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref.text


BOUNDED = {
    "type": "function",
    "function": {
        "name": "plan_trip",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Rome"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_call_round_trip(grammar_backend, tools_client, model_name, stream):
    """tools -> tool_calls -> tool message -> answer with a random model: the named tool_choice's
    grammar makes it call the function with valid arguments. Needs a grammar backend plugin."""
    import jsonschema

    kwargs = dict(
        model=model_name,
        messages=ASK,
        tools=[WEATHER, BOUNDED],
        tool_choice={"type": "function", "function": {"name": "plan_trip"}},
        max_tokens=64,
        temperature=1.0,
        seed=7,
    )
    if stream:
        chunks = list(tools_client.chat.completions.create(**kwargs, stream=True))
        parts: dict[int, list[str]] = {}
        for chunk in chunks:
            for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                entry = parts.setdefault(d.index, [d.id, d.function.name, ""])
                entry[2] += d.function.arguments or ""
        calls = [tuple(parts[i]) for i in sorted(parts)]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        choice = tools_client.chat.completions.create(**kwargs).choices[0]
        calls = [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        finish = [choice.finish_reason]
    assert finish == ["tool_calls"] and [c[1] for c in calls] == ["plan_trip"], (finish, calls)
    jsonschema.validate(json.loads(calls[0][2]), BOUNDED["function"]["parameters"])
    call_id, name, arguments = calls[0]
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "booked"},
    ]
    final = tools_client.chat.completions.create(
        model=model_name, messages=history, tools=[WEATHER, BOUNDED], max_tokens=8, temperature=0
    )
    assert final.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("max_tokens", [1, 3])
def test_a_named_call_cut_before_its_name_is_still_the_call(
    grammar_backend, tools_client, model_name, max_tokens
):
    """A named tool_choice whose answer max_tokens cuts before the call's name is complete (the
    forced array begins '[{"name": "'): the answer had no call, so a client that named the function
    got none. It is that function's call with the arguments so far ("" here), finish_reason
    "length", whole and streamed alike (vLLM answers a named function cut short this way)."""
    kwargs = dict(
        model=model_name, messages=ASK, tools=[WEATHER, BOUNDED], max_tokens=max_tokens, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    choice = tools_client.chat.completions.create(**kwargs).choices[0]
    whole = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    parts: dict[int, list[str]] = {}
    finish = None
    for chunk in tools_client.chat.completions.create(**kwargs, stream=True):
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = parts.setdefault(delta.index, ["", ""])
            entry[0] += delta.function.name or ""
            entry[1] += delta.function.arguments or ""
        if chunk.choices:
            finish = chunk.choices[0].finish_reason or finish
    assert (whole, choice.finish_reason) == ([("get_weather", "")], "length"), (whole, choice)
    assert ([tuple(parts[i]) for i in sorted(parts)], finish) == (whole, "length")


def _regex(text: str) -> str:
    """A regex matching exactly ``text`` (a tool call's JSON: braces are the regex's own)."""
    return text.replace("{", "\\{").replace("}", "\\}")


@pytest.mark.parametrize("cut", [{"stop": "Par"}, {"max_tokens": 30}])
def test_a_hermes_call_cut_off_is_the_call_so_far_streamed_or_not(
    grammar_backend, tools_client, model_name, cut
):
    """A regex makes the model write a hermes call; a stop string or max_tokens cuts it. The
    whole answer was the raw text as content with no tool_calls, the stream the call with its
    arguments so far: now both are the call (the README's promise), finish_reason stop/length."""
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    kwargs = dict(
        model=model_name, messages=ASK, tools=[WEATHER], temperature=1.0, seed=5, max_tokens=64,
        extra_body={"structured_outputs": {"regex": _regex(call)}},
    )  # fmt: skip
    kwargs.update(cut)
    choice = tools_client.chat.completions.create(**kwargs).choices[0]
    whole = (
        choice.message.content or "",
        [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []],
        choice.finish_reason,
    )
    content, parts, finish = "", {}, None
    for chunk in tools_client.chat.completions.create(**kwargs, stream=True):
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = parts.setdefault(delta.index, ["", ""])
            entry[0] += delta.function.name or ""
            entry[1] += delta.function.arguments or ""
        if chunk.choices:
            content += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    streamed = (content, [tuple(parts[i]) for i in sorted(parts)], finish)
    assert whole == streamed, (whole, streamed)
    if "stop" in cut:
        assert whole == ("", [("get_weather", '{"city": "')], "stop")
    else:  # max_tokens cuts it wherever the tokens end: a call once its name is complete
        assert whole[2] == "length" and whole[1] and whole[1][0][0] == "get_weather", whole
        assert '{"city": "Paris"}'.startswith(whole[1][0][1]), whole


def test_the_servers_own_message_with_reasoning_goes_back(
    grammar_backend, tools_client, templated, model_name
):
    """The usual multi-turn pattern, ``messages.append(resp.choices[0].message)``: with
    ``--reasoning-parser`` the message has reasoning_content, which was a 400 ("unsupported field
    'messages.1.reasoning_content'"), as vLLM's ``reasoning`` was. An assistant message may carry
    either; the template gets it under both names; any other role is still refused, naming it."""
    first = tools_client.chat.completions.create(
        model=model_name, messages=ASK, max_tokens=40, temperature=1.0, seed=1,
        extra_body={"structured_outputs": {"regex": "<think>ab</think>xyz"}},
    )  # fmt: skip
    message = first.choices[0].message
    assert (message.content, message.reasoning_content) == ("xyz", "ab")
    again = {"role": "user", "content": "Again?"}
    expected = reference_ids(
        templated,
        [*ASK, {"role": "assistant", "content": "xyz", "reasoning_content": "ab", "reasoning": "ab"}, again],
    )
    assert "<think>ab|ab</think>xyz" in templated.decode(expected)
    for sent in (
        message,  # as the openai client sends its own object
        message.model_dump(exclude_none=True),
        {"role": "assistant", "content": "xyz", "reasoning": "ab"},  # vLLM's key
        {"role": "assistant", "content": "xyz", "reasoning": "ab", "reasoning_content": "ab"},
    ):
        resp = tools_client.chat.completions.create(
            model=model_name, messages=[*ASK, sent, again], max_tokens=2
        )
        assert resp.usage.prompt_tokens == len(expected), sent
    for key in ("reasoning_content", "reasoning"):
        with pytest.raises(openai.BadRequestError) as refused:
            tools_client.chat.completions.create(
                model=model_name, messages=[{**ASK[0], key: "ab"}], max_tokens=2
            )
        assert refused.value.body["param"] == f"messages.0.{key}", refused.value.body
        assert "only assistant messages" in refused.value.body["message"], refused.value.body


#: parameters as pydantic writes them: references into their own ``$defs`` (two functions with the
#: same definition name for different things), draft-07's ``definitions``, and ``#`` itself
_ITEM = {"type": "object", "properties": {"item": {"$ref": "#/$defs/Item"}}, "required": ["item"],
         "additionalProperties": False}  # fmt: skip
REF_TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": parameters}}
    for name, parameters in [
        ("count", {**_ITEM, "$defs": {"Item": {"type": "integer", "minimum": 0, "maximum": 9}}}),
        ("label", {**_ITEM, "$defs": {"Item": {"enum": ["red", "green"]}}}),
        (
            "convert",
            {"type": "object", "properties": {"unit": {"$ref": "#/definitions/Unit"}}, "required": ["unit"],
             "additionalProperties": False, "definitions": {"Unit": {"enum": ["celsius", "kelvin"]}}},
        ),
        (
            "nest",
            {"type": "object", "properties": {"depth": {"enum": [1, 2]}, "inner": {"$ref": "#"}},
             "required": ["depth"], "additionalProperties": False},
        ),
    ]
]  # fmt: skip


@pytest.mark.parametrize("choice", ["required", "count", "label", "convert", "nest"])
def test_forced_calls_follow_parameters_with_references(grammar_backend, tools_client, model_name, choice):
    """``$ref`` s in a function's parameters resolve within them: ``#/$defs/Item`` was a 400
    ("Cannot find field $defs"), and ``#`` forced the whole array of calls into an argument."""
    import jsonschema

    tool_choice = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    resp = tools_client.chat.completions.create(
        model=model_name, messages=ASK, tools=REF_TOOLS, tool_choice=tool_choice, max_tokens=96,
        temperature=1.0, seed=5, n=4, parallel_tool_calls=False,  # (one call: a random model goes on)
    )  # fmt: skip
    parameters = {t["function"]["name"]: t["function"]["parameters"] for t in REF_TOOLS}
    calls = [call.function for c in resp.choices for call in c.message.tool_calls or []]
    assert [c.finish_reason for c in resp.choices] == ["tool_calls"] * 4 and len(calls) == 4, resp.choices
    for call in calls:
        assert choice == "required" or call.name == choice
        jsonschema.validate(json.loads(call.arguments), parameters[call.name])
    if choice == "nest":  # (this seed's answers do nest: ``#`` is the function's own parameters)
        assert any("inner" in json.loads(call.arguments) for call in calls), calls


@pytest.mark.parametrize("tool", REF_TOOLS, ids=lambda t: t["function"]["name"])
def test_the_same_parameters_as_response_format(grammar_backend, tools_client, model_name, tool):
    import jsonschema

    parameters = tool["function"]["parameters"]
    resp = tools_client.chat.completions.create(
        model=model_name, messages=ASK, max_tokens=96, temperature=1.0, seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": parameters}},
    )  # fmt: skip
    assert resp.choices[0].finish_reason == "stop", resp.choices[0]
    jsonschema.validate(json.loads(resp.choices[0].message.content), parameters)


def test_tool_choice_errors(tools_client, model_name):
    with pytest.raises(openai.BadRequestError, match="needs tools"):
        tools_client.chat.completions.create(model=model_name, messages=ASK, tool_choice="required")
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        tools_client.chat.completions.create(
            model=model_name,
            messages=ASK,
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "launch_rocket"}},
        )
    # OpenAI's other kinds of choice were "tool_choice.function: Field required" (a probe)
    for choice in (
        {"type": "custom", "custom": {"name": "f"}},
        {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}},
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            tools_client.chat.completions.create(
                model=model_name, messages=ASK, tools=[WEATHER], tool_choice=choice
            )
        body = refused.value.body
        assert body["param"] == "tool_choice" and body["code"] == "unsupported_field", body
        assert f"type '{choice['type']}' is not supported" in body["message"], body


def test_a_tool_of_another_type_than_function_is_refused_by_name(tools_client, server, auth, model_name):
    """OpenAI's custom tools (free-form input, which the openai client sends) were "tools.0.function:
    Field required"; now refused by name as tool_choice's other kinds are, on /tokenize too."""
    custom = {"type": "custom", "custom": {"name": "f", "description": "free-form"}}
    with pytest.raises(openai.BadRequestError) as refused:
        tools_client.chat.completions.create(model=model_name, messages=ASK, tools=[WEATHER, custom])
    body = refused.value.body
    assert body["param"] == "tools.1" and body["code"] == "unsupported_field", body
    assert body["message"] == (
        "tools.1: type 'custom' is not supported: minisgl calls functions; send tools of type \"function\""
    ), body
    resp = httpx.post(f"{server.url}/tokenize", json={"messages": ASK, "tools": [custom]}, headers=auth)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "tools.0", resp.text


@pytest.mark.parametrize("kind", [1, None, ["function"]])
def test_a_tool_type_that_is_no_string_is_named(tools_client, model_name, kind):
    """{"type": 1} with no "function" was "tools.0.function: Field required", naming the wrong field."""
    with pytest.raises(openai.BadRequestError) as refused:
        tools_client.chat.completions.create(model=model_name, messages=ASK, tools=[{"type": kind}])
    body = refused.value.body
    assert body["param"] == "tools.0", body
    assert body["message"] == f'tools.0: type must be the string "function", not {kind!r}', body


@pytest.mark.parametrize("kind", [123, None, ["function"], True, {"name": "f"}])
def test_a_tool_choice_type_that_is_no_string_is_named(client, model_name, kind):
    """A type that is no string was "tool_choice.type: Input should be 'function'" (123, a list),
    or "Field required" for null though it was given (found by a probe): now what it must be, and
    the choices taken."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=model_name,
            messages=ASK,
            tools=[WEATHER],
            tool_choice={"type": kind, "function": {"name": "get_weather"}},
        )
    body = refused.value.body
    assert body["param"] == "tool_choice.type" and body["code"] == "invalid_type", body
    assert body["message"].startswith('tool_choice.type: must be the string "function", not '), body
    assert body["message"].endswith(
        '; send {"type": "function", "function": {"name": ...}}, or "none", "auto" or "required"'
    ), body


@pytest.mark.parametrize("kind", ["string", "array", ["string", "null"]])
@pytest.mark.parametrize("choice", ["auto", "required", "named"])
def test_parameters_of_a_type_other_than_object_are_a_400(tools_server, model_name, kind, choice):
    """A call's arguments are a JSON object: with ``parameters`` of type string a forced call came
    back as plain content with finish_reason "stop" (the grammar forced a string, the parser
    takes objects only). OpenAI refuses such a schema; so do we, naming the field."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": kind}}}
    tool_choice = {"type": "function", "function": {"name": "f"}} if choice == "named" else choice
    resp = httpx.post(
        f"{tools_server.url}/v1/chat/completions",
        json={"model": model_name, "messages": ASK, "tools": [WEATHER, tool], "tool_choice": tool_choice,
              "max_tokens": 4},
        timeout=60,
    )  # fmt: skip
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "tools.1.function.parameters" and "type 'object'" in error["message"], error
    for fine in (
        {"type": ["object", "null"], "properties": {}},
        {},
        {"properties": {"a": {"type": "string"}}},
    ):
        tool["function"]["parameters"] = fine
        ok = httpx.post(
            f"{tools_server.url}/v1/chat/completions",
            json={"model": model_name, "messages": ASK, "tools": [tool], "tool_choice": "required", "max_tokens": 4},
            timeout=120,
        )  # fmt: skip
        assert ok.status_code == 200, ok.text


#: parameters no arguments can follow: at least three items in a list of at most one
UNSATISFIABLE = {
    "type": "object",
    "properties": {"xs": {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 1}},
    "required": ["xs"],
}


@pytest.mark.parametrize("choice", ["required", "named"])
def test_a_tool_schema_a_forced_call_cannot_follow_is_a_400_naming_its_parameters(
    grammar_backend, tools_client, model_name, choice
):
    """A forced call's grammar holds every offered function's parameters; one that no arguments
    can satisfy failed its compile as the whole grammar's, a 400 whose param was ``tool_choice``
    (the message named the tool, with llguidance, only as a path inside the grammar's ``$defs``).
    The client's mistake is in that tool's ``parameters``: the param names them, and the message
    the function and what the grammar backend found wrong."""
    tool = {"type": "function", "function": {"name": "pick", "parameters": UNSATISFIABLE}}
    tool_choice = {"type": "function", "function": {"name": "pick"}} if choice == "named" else choice
    with pytest.raises(openai.BadRequestError) as refused:
        tools_client.chat.completions.create(
            model=model_name, messages=ASK, max_tokens=4, tools=[WEATHER, tool], tool_choice=tool_choice
        )
    error = refused.value.body
    assert error["param"] == "tools.1.function.parameters", error
    message = error["message"]
    assert message.startswith("tools.1.function.parameters: ") and "'pick'" in message, error
    assert "minItems" in message or "nsatisfiable" in message, error  # (xgrammar's words, llguidance's)
    # the other tool alone is fine, and so is the unsatisfiable one where nothing forces a call
    resp = tools_client.chat.completions.create(
        model=model_name, messages=ASK, max_tokens=4, tools=[WEATHER, tool],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    assert resp.choices[0].finish_reason in ("stop", "length", "tool_calls")
    resp = tools_client.chat.completions.create(
        model=model_name, messages=ASK, max_tokens=4, tools=[WEATHER, tool], tool_choice="auto"
    )
    assert resp.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_auto_tools_without_a_parser_is_a_400(client, model_name):
    with pytest.raises(openai.BadRequestError, match="--tool-call-parser"):
        client.chat.completions.create(model=model_name, messages=ASK, tools=[WEATHER])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_template_that_ignores_tools_is_a_400(client, model_name, choice):
    """The demo tokenizer's template has no tools section: a request that may call them must not
    silently lose them."""
    with pytest.raises(openai.BadRequestError, match="does not render tools") as err:
        client.chat.completions.create(model=model_name, messages=ASK, tools=[WEATHER], tool_choice=choice)
    assert err.value.body["param"] == "tools"


def test_tokenize_refuses_tools_the_template_drops_as_chat_does(server, auth):
    """/tokenize counted such a prompt without its tools, with a 200, where the chat route says
    the template drops them (found by a probe of the API); with a template that renders them it
    counts them (test_tokenize_and_detokenize)."""
    resp = httpx.post(f"{server.url}/tokenize", json={"messages": ASK, "tools": [WEATHER]}, headers=auth)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "tools" and error["type"] == "invalid_request_error"
    # (the demo's template is ChatML, whose tools the bundled template renders: named as the fix)
    assert error["message"] == (
        "this model's chat template does not render tools; start the server with --chat-template FILE "
        "whose template does; for this ChatML model the bundled chatml-tools template does: "
        "--chat-template chatml-tools --tool-call-parser hermes"
    )
    plain = httpx.post(f"{server.url}/tokenize", json={"messages": ASK}, headers=auth)
    assert plain.status_code == 200 and plain.json()["count"] > 0


def test_tool_choice_none_needs_no_template_for_tools(client, tools_client, templated, model_name):
    """With tool_choice "none" the tools are context only: a template without a tools section
    answers plain content, as OpenAI and vLLM do (it was a 400); one with it still renders them."""
    kwargs = dict(model=model_name, messages=ASK, max_tokens=4, temperature=0)
    plain = client.chat.completions.create(**kwargs)
    resp = client.chat.completions.create(**kwargs, tools=[WEATHER], tool_choice="none")
    assert resp.choices[0].message.content == plain.choices[0].message.content
    assert not resp.choices[0].message.tool_calls and resp.choices[0].finish_reason == "length"
    assert resp.usage.prompt_tokens == plain.usage.prompt_tokens
    chunks = list(client.chat.completions.create(**kwargs, tools=[WEATHER], tool_choice="none", stream=True))
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == plain.choices[0].message.content
    )
    rendered = tools_client.chat.completions.create(**kwargs, tools=[WEATHER], tool_choice="none")
    assert rendered.usage.prompt_tokens == len(reference_ids(templated, ASK, tools=[WEATHER]))


# ---------------------------------------------------------------- sampling fields


def test_logit_bias_forces_a_token(tools_client, llm, model_name):
    token = llm.tokenizer.encode(" sea", add_special_tokens=False)[0]
    resp = tools_client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=5, temperature=1.0, seed=3, logit_bias={str(token): 100}
    )
    assert resp.choices[0].text == llm.tokenizer.decode([token] * 5)


def test_repetition_penalty_matches_offline(tools_client, llm, model_name):
    ref = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=16, repetition_penalty=1.8))[0]
    plain = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=16))[0]
    resp = tools_client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=16, temperature=0, extra_body={"repetition_penalty": 1.8}
    )
    assert resp.choices[0].text == ref.text
    assert ref.token_ids != plain.token_ids  # the penalty did change the greedy answer


@pytest.mark.parametrize("prompt_as_ids", [False, True])
def test_echo(tools_client, llm, model_name, prompt_as_ids):
    ids = llm.tokenizer.encode(PROMPT, add_special_tokens=False)
    prompt = ids if prompt_as_ids else PROMPT
    ref = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=6))[0]
    echoed = llm.tokenizer.decode(ids) if prompt_as_ids else PROMPT
    kwargs = dict(model=model_name, prompt=prompt, max_tokens=6, temperature=0, echo=True)
    assert tools_client.completions.create(**kwargs).choices[0].text == echoed + ref.text
    chunks = list(tools_client.completions.create(**kwargs, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == echoed + ref.text


def _completion_token(tokenizer, token_id: int) -> str:
    """How the completions format names a token: its text, or ``bytes:\\x..`` for a part of a
    character (its text alone U+FFFD)."""
    text = tokenizer.decode([token_id])
    raw = raw_token_bytes(tokenizer, token_id) if "\ufffd" in text else None
    return text if raw is None else "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


@pytest.mark.parametrize("prompt_as_ids", [False, True])
def test_echo_with_logprobs_scores_the_prompt(tools_client, llm, model_name, prompt_as_ids):
    """echo + logprobs (what lm-evaluation-harness sends for loglikelihoods): the prompt's tokens
    come first in the logprobs, the first with none, each other with its logprob given the tokens
    before it, as the offline engine's prompt_logprobs; then the generated token's. Streamed alike."""
    ids = llm.tokenizer.encode(PROMPT, add_special_tokens=False)
    ref = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=1, logprobs=2, prompt_logprobs=2))[0]
    kwargs = dict(model=model_name, prompt=ids if prompt_as_ids else PROMPT, max_tokens=1, temperature=0,
                  echo=True, logprobs=2)  # fmt: skip
    got = tools_client.completions.create(**kwargs).choices[0].logprobs
    n = len(ids)
    assert got.tokens == [_completion_token(llm.tokenizer, t) for t in ids + ref.token_ids]
    assert got.token_logprobs[0] is None and got.top_logprobs[0] is None
    expected = [lp.logprob for lp in ref.prompt_logprobs[1:]] + [ref.logprobs[0].logprob]
    assert len(got.token_logprobs) == n + 1
    for a, b in zip(got.token_logprobs[1:], expected, strict=True):
        assert abs(a - b) < 1e-4, (a, b)
    # each position's 2 most likely tokens, then the token itself where it is not one of them
    # (OpenAI's legacy format and vLLM's: the dict holds the sampled, here the prompt's, token too)
    for top, token, lp in zip(
        got.top_logprobs[1:],
        ids[1:] + ref.token_ids,
        [*ref.prompt_logprobs[1:], ref.logprobs[0]],
        strict=True,
    ):
        likely = [t for t, _ in lp.top]
        want = likely if token in likely else [*likely, token]
        assert list(top) == [_completion_token(llm.tokenizer, t) for t in want]
    assert got.text_offset[0] == 0 and got.text_offset == sorted(got.text_offset)
    chunks = list(tools_client.completions.create(**kwargs, stream=True))
    streamed = [
        lp
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for lp in c.choices[0].logprobs.token_logprobs
    ]
    assert streamed[0] is None and len(streamed) == n + 1
    for a, b in zip(streamed[1:], expected, strict=True):
        assert abs(a - b) < 1e-4, (a, b)


def test_echo_with_max_tokens_0_scores_the_prompt_only(tools_client, llm, model_name):
    """OpenAI's legacy way to score a text: echo with max_tokens 0 returns the prompt alone (text,
    logprobs as the offline engine's prompt_logprobs), no completion tokens; streamed alike.
    Without echo, max_tokens 0 stays a 400."""
    ids = llm.tokenizer.encode(PROMPT, add_special_tokens=False)
    ref = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1))[0]
    expected = [lp.logprob for lp in ref.prompt_logprobs[1:]]
    kwargs = dict(model=model_name, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    resp = tools_client.completions.create(**kwargs)
    choice = resp.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert resp.usage.completion_tokens == 0 and resp.usage.prompt_tokens == len(ids)
    assert choice.logprobs.tokens == [_completion_token(llm.tokenizer, t) for t in ids]
    assert choice.logprobs.token_logprobs[0] is None
    for a, b in zip(choice.logprobs.token_logprobs[1:], expected, strict=True):
        assert abs(a - b) < 1e-4, (a, b)
    chunks = list(tools_client.completions.create(**kwargs, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == PROMPT
    streamed = [
        lp
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for lp in c.choices[0].logprobs.token_logprobs
    ]
    assert len(streamed) == len(ids) and streamed[0] is None
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    plain = tools_client.completions.create(model=model_name, prompt=PROMPT, max_tokens=0, echo=True)
    assert plain.choices[0].text == PROMPT and plain.usage.completion_tokens == 0
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        tools_client.completions.create(model=model_name, prompt=PROMPT, max_tokens=0)
    with pytest.raises(openai.BadRequestError, match="generates nothing"):
        tools_client.completions.create(**kwargs, extra_body={"min_tokens": 1})


def _check_vllm_prompt_logprobs(got, ids, ref, k, tokenizer) -> None:
    """vLLM's prompt_logprobs: None for the first token, then {id: {logprob, rank, decoded_token}}
    for the prompt token first and the k most likely after it, as the offline engine's."""
    assert len(got) == len(ids) and got[0] is None
    for position, entries, want in zip(range(1, len(ids)), got[1:], ref.prompt_logprobs[1:], strict=True):
        token = str(ids[position])
        assert next(iter(entries)) == token  # the prompt's own token comes first
        assert abs(entries[token]["logprob"] - want.logprob) < 1e-4, (position, entries, want)
        assert entries[token]["rank"] == want.rank and want.rank >= 1
        assert entries[token]["decoded_token"] == tokenizer.decode([ids[position]])
        expected = {token: want.rank}
        for place, (t, _) in enumerate(want.top, start=1):
            expected.setdefault(str(t), place)
        assert [(t, e["rank"]) for t, e in entries.items()] == list(expected.items()), position


@pytest.mark.parametrize("k", [0, 3])
def test_vllm_prompt_logprobs_completions(tools_client, llm, model_name, k):
    """vLLM's prompt_logprobs field on /v1/completions: each choice gets its prompt's tokens with
    their logprobs and vocabulary ranks and the k most likely tokens, as the offline engine's."""
    ids = llm.tokenizer.encode(PROMPT, add_special_tokens=False)
    ref = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=k))[0]
    resp = tools_client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=2, temperature=0, n=2, extra_body={"prompt_logprobs": k}
    )
    assert resp.choices[0].text == ref.text
    for choice in resp.choices:
        _check_vllm_prompt_logprobs(choice.model_extra["prompt_logprobs"], ids, ref, k, llm.tokenizer)
    # with echo + logprobs as well: each keeps its own k
    resp = tools_client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=1, temperature=0, echo=True, logprobs=1,
        extra_body={"prompt_logprobs": k},
    )  # fmt: skip
    choice = resp.choices[0]
    _check_vllm_prompt_logprobs(choice.model_extra["prompt_logprobs"], ids, ref, k, llm.tokenizer)
    # logprobs 1: the most likely token, and the prompt's own where it is another (rank past 1)
    lp = choice.logprobs
    ranks = [want.rank for want in ref.prompt_logprobs[1:]] + [1]  # (then the greedy token)
    assert [len(top) for top in lp.top_logprobs[1:]] == [1 if rank == 1 else 2 for rank in ranks]
    assert all(token in top for top, token in zip(lp.top_logprobs[1:], lp.tokens[1:], strict=True))
    # not asked: no such field
    plain = tools_client.completions.create(model=model_name, prompt=PROMPT, max_tokens=1)
    assert "prompt_logprobs" not in plain.choices[0].model_extra


def test_vllm_prompt_logprobs_chat(tools_client, llm, templated, model_name):
    """On /v1/chat/completions the response (not each choice) carries them, for the templated prompt."""
    ids = reference_ids(templated, ASK)
    ref = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=2))[0]
    resp = tools_client.chat.completions.create(
        model=model_name, messages=ASK, max_tokens=2, temperature=0, extra_body={"prompt_logprobs": 2}
    )
    _check_vllm_prompt_logprobs(resp.model_extra["prompt_logprobs"], ids, ref, 2, llm.tokenizer)


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"prompt_logprobs": True}, "prompt_logprobs"),
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs: not available when stream is true"),
    ],
)
def test_vllm_prompt_logprobs_bad_values(tools_client, model_name, extra, message):
    for create, prompt in (
        (tools_client.completions.create, {"prompt": PROMPT}),
        (tools_client.chat.completions.create, {"messages": ASK}),
    ):
        with pytest.raises(openai.BadRequestError, match=message) as err:
            create(model=model_name, max_tokens=1, extra_body=extra, **prompt)
        assert err.value.body["param"] == "prompt_logprobs", err.value.body


def test_return_token_ids_completions(tools_client, llm, model_name):
    """vLLM's return_token_ids: each choice's prompt ids (text or token prompts) and generated ids,
    as the offline engine's; streamed, the generated ids spread over the chunks and the prompt's on
    each choice's first chunk only."""
    ids = llm.tokenizer.encode(PROMPT, add_special_tokens=False)
    other = ids[:3]
    refs = llm.generate([ids, other], SamplingParams(temperature=0.0, max_tokens=5))
    kwargs = dict(model=model_name, prompt=[ids, other], max_tokens=5, temperature=0, n=2,
                  extra_body={"return_token_ids": True})  # fmt: skip
    text = tools_client.completions.create(**{**kwargs, "prompt": PROMPT, "n": 1}).choices[0]
    assert text.model_extra["prompt_token_ids"] == ids  # the server's tokenization
    assert text.model_extra["token_ids"] == refs[0].token_ids
    resp = tools_client.completions.create(**kwargs)
    assert len(resp.choices) == 4
    for choice in resp.choices:
        prompt, ref = (ids, refs[0]) if choice.index < 2 else (other, refs[1])
        assert choice.model_extra["prompt_token_ids"] == prompt
        assert choice.model_extra["token_ids"] == ref.token_ids
    streamed: dict[int, list[int]] = {i: [] for i in range(4)}
    announced: dict[int, list[list[int]]] = {i: [] for i in range(4)}
    for chunk in tools_client.completions.create(**kwargs, stream=True):
        for c in chunk.choices:
            if "prompt_token_ids" in c.model_extra:
                assert not streamed[c.index]  # on the choice's first chunk
                announced[c.index].append(c.model_extra["prompt_token_ids"])
            streamed[c.index] += c.model_extra["token_ids"]
    assert streamed == {i: refs[i // 2].token_ids for i in range(4)}
    assert announced == {i: [ids if i < 2 else other] for i in range(4)}
    # not asked: no such fields
    plain = tools_client.completions.create(model=model_name, prompt=PROMPT, max_tokens=1)
    assert "token_ids" not in plain.choices[0].model_extra


def test_return_token_ids_chat(tools_client, llm, templated, model_name):
    """On chat the response carries the templated prompt's ids once; each choice its own ids."""
    ids = reference_ids(templated, ASK)
    ref = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=5))[0]
    kwargs = dict(model=model_name, messages=ASK, max_tokens=5, temperature=0,
                  extra_body={"return_token_ids": True})  # fmt: skip
    resp = tools_client.chat.completions.create(**kwargs)
    assert resp.model_extra["prompt_token_ids"] == ids
    assert resp.choices[0].model_extra["token_ids"] == ref.token_ids
    chunks = list(tools_client.chat.completions.create(**kwargs, stream=True))
    assert [c.model_extra.get("prompt_token_ids") for c in chunks if c.choices][0] == ids
    assert sum(1 for c in chunks if c.model_extra.get("prompt_token_ids") is not None) == 1
    assert [
        t for c in chunks if c.choices for t in c.choices[0].model_extra.get("token_ids", [])
    ] == ref.token_ids


def test_return_tokens_as_token_ids(tools_client, llm, model_name):
    """vLLM's return_tokens_as_token_ids: logprobs name tokens (and top tokens) "token_id:{id}"."""
    ids = llm.tokenizer.encode(PROMPT, add_special_tokens=False)
    ref = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=3, logprobs=2))[0]
    named = [f"token_id:{t}" for t in ref.token_ids]
    top_named = [[f"token_id:{t}" for t, _ in lp.top] for lp in ref.logprobs]
    extra = {"return_tokens_as_token_ids": True}
    got = (
        tools_client.completions.create(
            model=model_name, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=2, extra_body=extra
        )
        .choices[0]
        .logprobs
    )
    assert got.tokens == named
    assert [list(top) for top in got.top_logprobs] == top_named
    chat = tools_client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": PROMPT}], max_tokens=3, temperature=0,
        logprobs=True, top_logprobs=2, extra_body=extra,
    ).choices[0].logprobs.content  # fmt: skip
    assert all(e.token.startswith("token_id:") and e.bytes == list(e.token.encode()) for e in chat)
    assert all(t.token.startswith("token_id:") for e in chat for t in e.top_logprobs)
    assert [e.token for e in chat] == [f"token_id:{int(e.token.split(':')[1])}" for e in chat]


def test_completions_stream_usage(tools_client, llm, model_name):
    chunks = list(
        tools_client.completions.create(
            model=model_name,
            prompt=PROMPT,
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert chunks[-1].usage.prompt_tokens == len(llm.tokenizer.encode(PROMPT, add_special_tokens=False))
    assert all(c.usage is None for c in chunks[:-1])


# ---------------------------------------------------------------- other endpoints


def test_tokenize_and_detokenize(tools_server, templated, model_name):
    url = tools_server.url
    ids = templated.encode(PROMPT, add_special_tokens=False)
    got = httpx.post(f"{url}/tokenize", json={"model": model_name, "prompt": PROMPT}).json()
    assert got["tokens"] == ids and got["count"] == len(ids) and got["max_model_len"] == 2048
    chat = httpx.post(f"{url}/tokenize", json={"messages": ASK, "tools": [WEATHER]}).json()
    assert chat["tokens"] == reference_ids(templated, ASK, tools=[WEATHER])
    back = httpx.post(f"{url}/detokenize", json={"tokens": ids}).json()
    assert back["prompt"] == back["text"] == templated.decode(ids)
    bad = httpx.post(f"{url}/detokenize", json={"tokens": [10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    both = httpx.post(f"{url}/tokenize", json={"prompt": "a", "messages": ASK})
    assert both.status_code == 400


def test_version_and_model_by_id(tools_server, tools_client, model_name):
    import minisgl_core

    assert httpx.get(f"{tools_server.url}/version").json() == {"version": minisgl_core.__version__}
    assert tools_client.models.retrieve(model_name).id == model_name
    with pytest.raises(openai.NotFoundError) as err:
        tools_client.models.retrieve("gpt-4")
    assert err.value.body["code"] == "model_not_found"


def test_cors_only_for_allowed_origins(tools_server, server, auth):
    # the headers the official OpenAI JS SDK sends from a browser (a probe found its preflight
    # refused, "Disallowed CORS headers", while only authorization and content-type were allowed)
    sdk_headers = "authorization,content-type,x-stainless-os,x-stainless-lang,openai-organization"
    preflight = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": sdk_headers,
    }
    resp = httpx.options(f"{tools_server.url}/v1/chat/completions", headers=preflight)
    assert resp.status_code == 200 and resp.headers["access-control-allow-origin"] == ORIGIN, resp.text
    allowed = {h.strip().lower() for h in resp.headers["access-control-allow-headers"].split(",")}
    assert set(sdk_headers.split(",")) <= allowed, allowed
    other = httpx.options(
        f"{tools_server.url}/v1/chat/completions", headers={**preflight, "Origin": "https://evil.example"}
    )
    assert "access-control-allow-origin" not in other.headers
    # off by default: the session server has no --allowed-origins
    plain = httpx.get(f"{server.url}/v1/models", headers={**auth, "Origin": ORIGIN})
    assert "access-control-allow-origin" not in plain.headers


def test_unknown_parser_fails_at_start(model_dir, engine_args):
    """Refused by the command line before any process starts (a forked CLI run, not a server)."""
    bad = run_cli(
        ["serve", "--port", "0", "--model", str(model_dir), *engine_args, "--tool-call-parser", "nope"]
    )
    assert bad.returncode == 2, bad.stderr
    assert "unknown --tool-call-parser 'nope'" in bad.stderr and "hermes" in bad.stderr
    missing = run_cli(
        ["serve", "--port", "0", "--model", str(model_dir), *engine_args, "--chat-template", "/no/such.jinja"]
    )
    assert missing.returncode == 2, missing.stderr
    assert "--chat-template: cannot read /no/such.jinja" in missing.stderr
