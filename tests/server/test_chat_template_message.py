"""The server and the offline ``LLM`` agree on what a chat template gets: one function
(``tokenizer.chat_input.template_message``) makes a message ready for the template on both paths,
one (``template_args``) builds the template's arguments and checks its settings with one text, and
one number (``SamplingParams.MAX_N``) bounds n on both. No server, no model."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from minisgl_core.sampling import SamplingParams
from minisgl_core.server.schemas import BodyError, ChatCompletionRequest, ChatMessage
from minisgl_core.server.tokenize_routes import TokenizeBody
from minisgl_core.tokenizer.chat_input import (
    check_continued_message,
    checked_template_args,
    conversations,
    template_message,
)
from minisgl_core.tokenizer.load import load_tokenizer, render_chat_template

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}

MESSAGES = [
    {"role": "user", "content": "hi"},
    {"role": "developer", "content": [{"type": "text", "text": "Be"}, {"type": "text", "text": "brief."}]},
    {
        "role": "assistant",
        "content": [{"type": "refusal", "refusal": "No."}, {"type": "text", "text": "Sorry."}],
    },
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "[1, 2]"}}]},
    {
        "role": "assistant",
        "content": "x",
        "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{no"}}],
    },
    {"role": "tool", "content": "18 C, sunny", "tool_call_id": "call_1", "name": "get_weather"},
    {"role": "user", "content": [], "name": "bob"},
    {"content": "first", "role": "system"},
]


@pytest.mark.parametrize("message", MESSAGES)
def test_the_server_hands_the_template_what_the_offline_chat_does(message):
    served = ChatMessage.model_validate(message).to_template()
    assert served == template_message(message) == conversations([message])[0][0]
    assert list(served)[:2] == list(template_message(message))[:2] == ["role", "content"]


def test_what_the_template_gets_of_a_message():
    assert template_message(MESSAGES[1]) == {"role": "system", "content": "Be\nbrief."}
    assert template_message(MESSAGES[2]) == {"role": "assistant", "content": "No.\nSorry."}
    # JSON arguments of an object decoded (Llama's template applies tojson to them again)
    assert template_message(MESSAGES[3]) == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{**CALL, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    }
    assert template_message(MESSAGES[4])["tool_calls"][0]["function"]["arguments"] == "[1, 2]"


def test_the_server_leaves_out_what_its_request_left_unset():
    # a null field is not set, and an empty tool_calls is none (Llama 3.1's template takes any
    # message with the key for a tool call)
    message = {"role": "assistant", "content": "x", "name": None, "tool_calls": []}
    assert ChatMessage.model_validate(message).to_template() == {"role": "assistant", "content": "x"}


#: Llama 3.1's chat template's way with an assistant message, cut down: the tool-call branch is
#: taken when the key is there, and wants one call
LLAMA31_STYLE = """{%- for message in messages %}<|{{ message.role }}|>
{%- if 'tool_calls' in message %}
{%- if not message.tool_calls|length == 1 %}{{ raise_exception("This model only supports single tool-calls at once!") }}{% endif %}
{{- message.tool_calls[0].function | tojson }}
{%- else %}{{ message.content }}{% endif %}<|end|>
{% endfor %}"""


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    return load_tokenizer(default_model_dir)


@pytest.mark.parametrize(
    "extra", [{"tool_calls": []}, {"tool_calls": None}, {"name": None}, {"name": None, "tool_calls": ()}]
)
def test_offline_chat_leaves_out_empty_tool_calls_and_null_keys_as_the_server(tokenizer, extra):
    plain = {"role": "assistant", "content": "hi"}
    message = {**plain, **extra}
    # LLM.chat's way to the template: its messages, then its arguments (the model is not needed)
    args = checked_template_args(LLAMA31_STYLE, True, False, None, None)
    [conversation] = conversations([message])
    rendered = render_chat_template(tokenizer, conversation, **args)
    assert rendered == render_chat_template(tokenizer, [plain], **args) == "<|assistant|>hi<|end|>\n"
    assert template_message(message) == ChatMessage.model_validate(message).to_template() == plain


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"add_generation_prompt": True, "continue_final_message": True}, "add_generation_prompt"),
        ({"add_generation_prompt": False, "continue_final_message": True}, "messages"),
    ],
)
def test_the_template_settings_are_refused_with_one_text_everywhere(settings, field):
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError) as offline:  # LLM.chat's checks, in its order
        checked_template_args(None, settings["add_generation_prompt"], True, None, None)
        check_continued_message(messages[-1]["role"])
    for schema in (ChatCompletionRequest, TokenizeBody):  # the chat route's and /tokenize's
        with pytest.raises(ValidationError) as served:
            schema.model_validate({"messages": messages, **settings})
        [error] = served.value.errors()
        cause = error["ctx"]["error"]
        assert isinstance(cause, BodyError) and cause.field == field
        assert str(cause) == str(offline.value)


def test_the_template_arguments_are_built_alike():
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    messages = [{"role": "assistant", "content": "The sea is"}]
    settings = {"add_generation_prompt": False, "continue_final_message": True}
    variables = {"enable_thinking": False}
    offline = checked_template_args(None, False, True, variables, [tool])
    assert offline == {**variables, "tools": [tool], **settings}
    request = {"messages": messages, "tools": [tool], "chat_template_kwargs": variables, **settings}
    assert ChatCompletionRequest.model_validate(request).template_args() == offline


def test_n_has_one_bound_on_the_server_and_offline():
    messages = [{"role": "user", "content": "hi"}]
    ChatCompletionRequest(messages=messages, n=SamplingParams.MAX_N)
    SamplingParams(n=SamplingParams.MAX_N)
    with pytest.raises(
        ValidationError, match=rf"n\n  Input should be less than or equal to {SamplingParams.MAX_N}"
    ):
        ChatCompletionRequest(messages=messages, n=SamplingParams.MAX_N + 1)
    with pytest.raises(ValueError, match=rf"n must be an integer in \[1, {SamplingParams.MAX_N}\]"):
        SamplingParams(n=SamplingParams.MAX_N + 1)


#: messages the chat route refuses (a 400), each with the field LLM.chat's error names: the offline
#: path refuses them too, with the server's reason where the rule is shared (they reached the
#: template offline: a "bogus" turn, a tool answer to no call)
REFUSED = [
    ({"role": "bogus", "content": "hi"}, "role", "unknown role 'bogus'; use one of system, developer"),
    ({"role": "tool", "content": "x"}, "tool_call_id", "a tool message needs the tool_call_id"),
    ({"role": "tool", "content": "x", "tool_call_id": 7}, "tool_call_id", "must be a string"),
    ({"role": "user", "content": "hi", "name": 5}, "name", "must be a string"),
    (
        {"role": "user", "content": "hi", "tool_calls": [CALL]},
        "tool_calls",
        "only assistant messages may have",
    ),
    ({"role": "user"}, "content", "a user message needs content"),
    ({"role": "assistant", "tool_calls": []}, "content", "an assistant message needs content"),
    (
        {"role": "user", "content": [{"type": "refusal", "refusal": "no"}]},
        "content[0]",
        "content parts of type 'refusal' belong to assistant messages",
    ),
    (
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
        "content[0]",
        "content parts of type 'image_url' are not supported",
    ),
    ({"role": "user", "content": [{"text": "hi"}]}, "content[0].type", "missing"),
    (
        {"role": "user", "content": [{"type": "text", "text": "hi", "x": 1}]},
        "content[0]",
        "unknown field 'x'",
    ),
    ({"role": "assistant", "tool_calls": "f()"}, "tool_calls", "must be a list of tool calls"),
    ({"role": "assistant", "tool_calls": [{**CALL, "id": None}]}, "tool_calls[0].id", "must be a string"),
    ({"role": "assistant", "tool_calls": [{**CALL, "type": "tool"}]}, "tool_calls[0].type", "'function'"),
    ({"role": "assistant", "tool_calls": [{**CALL, "extra": 1}]}, "tool_calls[0]", "unknown field 'extra'"),
    (
        {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {"a": 1}}}]},
        "tool_calls[0].function.arguments",
        "must be a string",
    ),
]


@pytest.mark.parametrize(("message", "field", "reason"), REFUSED)
def test_offline_chat_refuses_what_the_chat_route_refuses(message, field, reason):
    with pytest.raises(ValidationError) as served:
        ChatMessage.model_validate(message)
    with pytest.raises((ValueError, TypeError)) as offline:
        conversations([message])
    assert str(offline.value).startswith(f"messages[0].{field}"), str(offline.value)
    assert reason in str(offline.value)
    # the rules both apply say the same on both paths
    shared = [
        e["msg"].removeprefix("Value error, ") for e in served.value.errors() if e["type"] == "value_error"
    ]
    if shared:
        assert shared == [str(offline.value).split(": ", 1)[1]]
