"""vLLM's ``echo`` on /v1/chat/completions, through the official ``openai`` client on the session's
server: each choice's content starts with the last message's text where that message has the
reply's role ("assistant", or without add_generation_prompt the last message's own). The echoed
text is the client's own: the model's part of the answer (its text, parsed tool calls, logprobs,
token counts) is what echo false gives."""

from __future__ import annotations

import pytest

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

ASK = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Tell me about the sea."},
]
PREFIX = "The sea is"
#: the typical use: the reply continues a final assistant message, which echo gives back whole
CONTINUE = {"add_generation_prompt": False, "continue_final_message": True}
CONTINUED = [*ASK, {"role": "assistant", "content": PREFIX}]


def create(client, model_name, messages, echo: bool, extra: dict | None = None, **kwargs):
    kwargs = {"max_tokens": 6, "temperature": 0, **kwargs}
    body = {**(extra or {}), "echo": echo}
    return client.chat.completions.create(model=model_name, messages=messages, extra_body=body, **kwargs)


def streamed(client, model_name, messages, echo: bool, extra: dict | None = None, **kwargs):
    """The chunks, and each choice's content joined."""
    chunks = list(create(client, model_name, messages, echo, extra, stream=True, **kwargs))
    contents: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            contents[choice.index] = contents.get(choice.index, "") + (choice.delta.content or "")
    return chunks, [contents[i] for i in sorted(contents)]


def test_continue_final_message_comes_back_whole(client, model_name):
    """The typical use: continue_final_message with echo gives the whole assistant message, the
    client's start and the model's continuation, whole and streamed alike."""
    plain = create(client, model_name, CONTINUED, False, CONTINUE).choices[0].message.content
    assert plain and not plain.startswith(PREFIX)
    whole = create(client, model_name, CONTINUED, True, CONTINUE).choices[0]
    assert whole.message.content == PREFIX + plain
    assert whole.message.role == "assistant"
    chunks, [content] = streamed(client, model_name, CONTINUED, True, CONTINUE)
    assert content == PREFIX + plain
    # the role's chunk, then the echo's own, then the model's text
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert (deltas[0].role, deltas[0].content) == ("assistant", "")
    assert deltas[1].content == PREFIX and chunks[1].choices[0].logprobs is None
    assert chunks[1].choices[0].finish_reason is None


def test_roles_differ_echo_changes_nothing(client, model_name):
    """The reply is an assistant message and the last message a user's: nothing to echo, whole
    or streamed (no chunk of its own either)."""
    plain = create(client, model_name, ASK, False).choices[0].message.content
    assert create(client, model_name, ASK, True).choices[0].message.content == plain
    chunks, [content] = streamed(client, model_name, ASK, True)
    assert content == plain
    assert all(ASK[-1]["content"] not in (c.choices[0].delta.content or "") for c in chunks if c.choices)


@pytest.mark.parametrize(
    "messages, extra",
    [
        # a new assistant turn after an assistant message: the same role, echoed
        (CONTINUED, {}),
        # no generation prompt: the reply's role is the last message's own, a user's here
        (ASK, {"add_generation_prompt": False}),
    ],
    ids=["assistant-after-assistant", "no-generation-prompt"],
)
def test_the_reply_role_decides(client, model_name, messages, extra):
    echoed = messages[-1]["content"]
    plain = create(client, model_name, messages, False, extra).choices[0].message.content
    assert create(client, model_name, messages, True, extra).choices[0].message.content == echoed + plain
    assert streamed(client, model_name, messages, True, extra)[1] == [echoed + plain]


def test_each_of_n_choices_is_echoed(client, model_name):
    """n = 2, seeded: each choice is echo false's same choice after the text, and each streamed
    choice gets its own echo chunk."""
    kwargs = dict(n=2, temperature=1.0, seed=11, max_tokens=5)
    plain = [
        c.message.content for c in create(client, model_name, CONTINUED, False, CONTINUE, **kwargs).choices
    ]
    whole = create(client, model_name, CONTINUED, True, CONTINUE, **kwargs)
    assert [c.message.content for c in sorted(whole.choices, key=lambda c: c.index)] == [
        PREFIX + p for p in plain
    ]
    chunks, contents = streamed(client, model_name, CONTINUED, True, CONTINUE, **kwargs)
    assert contents == [PREFIX + p for p in plain]
    echo_chunks = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.content == PREFIX]
    assert sorted(echo_chunks) == [0, 1]


def test_content_parts_are_joined_a_line_each(client, model_name):
    """A last message of text parts: their texts joined by newlines, as the template reads them
    (vLLM joins them so)."""
    parts = [{"type": "text", "text": "The sea"}, {"type": "text", "text": "is"}]
    messages = [*ASK, {"role": "assistant", "content": parts}]
    plain = create(client, model_name, messages, False, CONTINUE).choices[0].message.content
    assert (
        create(client, model_name, messages, True, CONTINUE).choices[0].message.content
        == "The sea\nis" + plain
    )
    assert streamed(client, model_name, messages, True, CONTINUE)[1] == ["The sea\nis" + plain]


def test_usage_counts_the_generated_tokens_only(client, model_name):
    plain = create(client, model_name, CONTINUED, False, CONTINUE).usage
    assert create(client, model_name, CONTINUED, True, CONTINUE).usage == plain
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks, _ = streamed(client, model_name, CONTINUED, True, CONTINUE, stream_options=options)
    final = chunks[-1]
    assert not final.choices and final.usage.completion_tokens == plain.completion_tokens
    assert final.usage.prompt_tokens == plain.prompt_tokens
    # the echo's chunk: no completion token yet
    assert chunks[1].choices[0].delta.content == PREFIX and chunks[1].usage.completion_tokens == 0


def test_logprobs_are_the_generated_tokens_only(client, model_name):
    """The echoed text has no logprobs: each choice's are echo false's, one per completion token,
    and the echo's chunk carries none. (vLLM also turns on prompt_logprobs for echo; minisgl
    leaves them to the prompt_logprobs field.)"""
    kwargs = dict(logprobs=True, top_logprobs=2)
    plain = create(client, model_name, CONTINUED, False, CONTINUE, **kwargs)
    whole = create(client, model_name, CONTINUED, True, CONTINUE, **kwargs)
    tokens = [e.token for e in whole.choices[0].logprobs.content]
    assert whole.choices[0].logprobs.content == plain.choices[0].logprobs.content
    assert len(tokens) == whole.usage.completion_tokens
    assert "".join(tokens) == plain.choices[0].message.content
    assert whole.model_extra.get("prompt_logprobs") is None
    chunks, _ = streamed(client, model_name, CONTINUED, True, CONTINUE, **kwargs)
    assert chunks[1].choices[0].delta.content == PREFIX and chunks[1].choices[0].logprobs is None
    streamed_tokens = [
        e.token for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content
    ]
    assert streamed_tokens == tokens


def test_a_stop_string_in_the_echo_does_not_stop_it(client, model_name):
    """Stop strings apply to the generated text: one inside the echoed text neither cuts it nor
    ends the choice."""
    plain = create(client, model_name, CONTINUED, False, CONTINUE, stop=["sea"]).choices[0]
    whole = create(client, model_name, CONTINUED, True, CONTINUE, stop=["sea"]).choices[0]
    assert whole.message.content == PREFIX + plain.message.content
    assert whole.finish_reason == plain.finish_reason


@pytest.fixture(scope="module")
def parser_client(start_server, model_dir, engine_args):
    """A server with a tool parser (hermes, and the bundled template that renders tools) and a
    reasoning parser (qwen3)."""
    import openai

    server = start_server(
        [
            "--model", str(model_dir), *engine_args, "--chat-template", "chatml-tools",
            "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3",
        ]
    )  # fmt: skip
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_a_named_call_is_parsed_from_the_generated_text_only(grammar_backend, parser_client, model_name):
    """A named tool_choice's call is read from the generated text alone (with the echoed text in
    front it would be no call): the same call as echo false, the echo as the message's content;
    streamed, the echo's chunk and the same call."""
    kwargs = dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    kwargs |= dict(max_tokens=24)
    plain = create(parser_client, model_name, CONTINUED, False, CONTINUE, **kwargs).choices[0]
    whole = create(parser_client, model_name, CONTINUED, True, CONTINUE, **kwargs).choices[0]
    calls = [(c.function.name, c.function.arguments) for c in plain.message.tool_calls]
    assert calls and calls[0][0] == "get_weather"
    assert [(c.function.name, c.function.arguments) for c in whole.message.tool_calls] == calls
    assert whole.message.content == PREFIX + (plain.message.content or "")
    assert whole.finish_reason == plain.finish_reason
    chunks, [content] = streamed(parser_client, model_name, CONTINUED, True, CONTINUE, **kwargs)
    assert content == PREFIX + (plain.message.content or "")
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert [d.function.name for d in deltas if d.function.name] == ["get_weather"]
    assert "".join(d.function.arguments or "" for d in deltas) == calls[0][1]


#: an assistant's start that the parsers would read as a call and as reasoning, were it theirs
MARKED = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call> I think</think> so'
)


@pytest.mark.parametrize("stream", [False, True])
def test_the_parsers_do_not_read_the_echo(parser_client, model_name, stream):
    """The echoed text is the client's: the tool parser (tool_choice auto) and the reasoning
    parser read the generated text only, so a call's markup or a reasoning end tag in it stays
    content, and the calls and reasoning are echo false's."""
    messages = [*ASK, {"role": "assistant", "content": MARKED}]
    kwargs = dict(tools=[WEATHER], max_tokens=8)
    plain = create(parser_client, model_name, messages, False, CONTINUE, **kwargs).choices[0]
    if not stream:
        whole = create(parser_client, model_name, messages, True, CONTINUE, **kwargs).choices[0]
        got = (
            whole.message.content,
            whole.message.tool_calls,
            whole.message.model_extra["reasoning_content"],
        )
        finish = whole.finish_reason
    else:
        chunks, [content] = streamed(parser_client, model_name, messages, True, CONTINUE, **kwargs)
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        reasoning = "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) or None
        got = (content, [d for d in deltas if d.tool_calls] or None, reasoning)
        finish = next(c.choices[0].finish_reason for c in reversed(chunks) if c.choices)
    want = (MARKED + (plain.message.content or ""), None, plain.message.model_extra["reasoning_content"])
    assert got == want
    assert finish == plain.finish_reason != "tool_calls"


def test_a_grammar_constrains_the_generated_text_only(grammar_backend, client, model_name):
    """response_format: the echoed text is not the grammar's, the rest is echo false's answer."""
    fmt = {"type": "json_object"}
    plain = create(client, model_name, CONTINUED, False, CONTINUE, response_format=fmt, max_tokens=12)
    whole = create(client, model_name, CONTINUED, True, CONTINUE, response_format=fmt, max_tokens=12)
    assert plain.choices[0].message.content.lstrip().startswith("{")
    assert whole.choices[0].message.content == PREFIX + plain.choices[0].message.content
