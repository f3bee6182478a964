"""tools / tool_choice planning and a chat choice's output (reasoning, tool calls), without a server.

The parsed messages and stream chunks are read back with the official ``openai`` client's types
and its own stream accumulator, and forced calls are checked against the grammar's JSON schema
with ``jsonschema``: the references a client and the grammar backend use.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from minisgl_plugin_hermes.parser import HermesToolParser
from minisgl_plugin_mistral.parser import MistralToolParser
from minisgl_plugin_qwen3_reasoning.parser import DeepSeekR1ReasoningParser, Qwen3ReasoningParser
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from minisgl_core.server import responses as r
from minisgl_core.server.chat_output import ChoiceOutput, SpecialTextFilter
from minisgl_core.server.errors import APIError
from minisgl_core.server.schemas import ChatCompletionRequest
from minisgl_core.server.tools import ForcedToolCallParser, ToolPlan, plan_tools
from minisgl_core.testing.parser_suite import ToolParserSuite

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
QWEN3_ANSWER = (
    "<think>\nThe user wants the weather; call the tool.\n</think>\n\n"
    "I'll look it up.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
)


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=MESSAGES, **fields)


def as_completion(message: dict, finish_reason: str) -> ChatCompletion:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
    }
    return ChatCompletion.model_validate(body)


def streamed(output: ChoiceOutput, text: str, cuts: list[int], tools: list[dict]) -> ChatCompletion:
    """Stream ``text`` through ``output`` as chunks and let the openai client accumulate them."""
    state = ChatCompletionStreamState(input_tools=tools)
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    first = r.chat_chunk("chatcmpl-1", "m", 0, 0, {"role": "assistant", "content": ""})
    state.handle_chunk(ChatCompletionChunk.model_validate(first))
    for i, piece in enumerate(pieces):
        final = i == len(pieces) - 1
        delta = output.delta(piece, final)
        reason = output.finish_reason("stop") if final else None
        if delta or reason:
            chunk = r.chat_chunk("chatcmpl-1", "m", 0, 0, delta, finish_reason=reason)
            state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    return state.get_final_completion()


# ---------------------------------------------------------------- planning


def test_tool_choice_without_tools_is_a_400():
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        with pytest.raises(APIError) as err:
            plan_tools(request(tool_choice=choice), HermesToolParser)
        assert err.value.status == 400 and err.value.param == "tool_choice"
    assert plan_tools(request(tool_choice="none"), None) == ToolPlan()
    assert plan_tools(request(tool_choice="auto"), None) == ToolPlan()


@pytest.mark.parametrize("choice", ["none", "auto", "required", "named"])
def test_two_functions_of_one_name_are_a_400(choice):
    """Anthropic and Gemini refuse them; they were taken, and a call naming the function could
    follow either's parameters (a forced named call took the first silently)."""
    other = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    tool_choice = {"type": "function", "function": {"name": "get_weather"}} if choice == "named" else choice
    with pytest.raises(APIError) as err:
        plan_tools(request(tools=[WEATHER, other], tool_choice=tool_choice), HermesToolParser)
    assert err.value.status == 400 and err.value.param == "tools.1.function.name"
    assert "tools.1 and tools.0 are both named 'get_weather'" in err.value.message


def test_auto_needs_a_parser_and_named_function_must_exist():
    with pytest.raises(APIError, match="--tool-call-parser"):
        plan_tools(request(tools=[WEATHER]), None)
    with pytest.raises(APIError, match="not among the tools"):
        plan_tools(
            request(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), None
        )
    plan = plan_tools(request(tools=[WEATHER]), HermesToolParser)
    assert plan.parser is HermesToolParser and plan.grammar is None and plan.tools == [WEATHER]


@pytest.mark.parametrize("parallel", [True, False])
def test_required_forces_calls_that_validate_against_the_functions(parallel):
    plan = plan_tools(
        request(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=parallel), None
    )
    assert plan.parser is ForcedToolCallParser and plan.grammar["kind"] == "json_schema"
    schema = json.loads(plan.grammar["value"])
    jsonschema.Draft202012Validator.check_schema(schema)
    good = [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]
    jsonschema.validate(good[:1], schema)
    bad = [
        [],
        [{"name": "get_weather", "arguments": {"unit": "celsius"}}],  # city is required
        [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "kelvin"}}],
        [{"name": "delete_everything", "arguments": {}}],
    ]
    for output in bad + ([] if parallel else [good]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(output, schema)
    if parallel:
        jsonschema.validate(good, schema)


def test_named_function_forces_exactly_that_call():
    choice = {"type": "function", "function": {"name": "get_time"}}
    plan = plan_tools(request(tools=[WEATHER, TIME], tool_choice=choice), None)
    schema = json.loads(plan.grammar["value"])
    jsonschema.validate([{"name": "get_time", "arguments": {}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "get_weather", "arguments": {"city": "Paris"}}], schema)
    assert plan.single_call


def test_a_function_without_parameters_is_called_with_no_arguments():
    """OpenAI: omitting ``parameters`` defines a function with an empty parameter list. The forced
    call's schema said any object, which llguidance filled with made-up arguments (xgrammar's
    strict mode wrote ``{}``): both backends now get a schema whose only value is ``{}``."""
    no_args = {"type": "function", "function": {"name": "ping"}}
    for choice in ("required", {"type": "function", "function": {"name": "ping"}}):
        schema = json.loads(plan_tools(request(tools=[no_args], tool_choice=choice), None).grammar["value"])
        jsonschema.validate([{"name": "ping", "arguments": {}}], schema)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate([{"name": "ping", "arguments": {"time": "14:59"}}], schema)


def function(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


#: pydantic's shape: the parameters' own definitions, referred to from the parameters' root; two
#: functions use the same definition name for different things
INT_ITEM = {
    "type": "object",
    "properties": {"item": {"$ref": "#/$defs/Item"}},
    "required": ["item"],
    "$defs": {"Item": {"type": "integer"}},
}
STR_ITEM = {
    "type": "object",
    "properties": {"item": {"$ref": "#/$defs/Item"}},
    "required": ["item"],
    "$defs": {"Item": {"type": "string"}},
}
OLD_DEFINITIONS = {
    "type": "object",
    "properties": {"unit": {"$ref": "#/definitions/Unit"}},
    "required": ["unit"],
    "definitions": {"Unit": {"enum": ["celsius", "fahrenheit"]}},
}
TREE = {
    "type": "object",
    "properties": {"value": {"type": "integer"}, "child": {"$ref": "#"}},
    "required": ["value"],
    "additionalProperties": False,
}
REF_TOOLS = [function("count", INT_ITEM), function("name", STR_ITEM), function("unit", OLD_DEFINITIONS),
             function("tree", TREE)]  # fmt: skip


@pytest.mark.parametrize("named", [None, "count", "name", "unit", "tree"])
def test_forced_calls_resolve_refs_within_their_own_parameters(named):
    """A ``$ref`` in a function's parameters means what it means in the parameters alone: it was
    resolved against the forced array's schema (a 400 for ``#/$defs/...``; ``#`` forced the whole
    array of calls where the function's arguments belonged)."""
    choice = {"type": "function", "function": {"name": named}} if named else "required"
    plan = plan_tools(request(tools=REF_TOOLS, tool_choice=choice), None)
    schema = json.loads(plan.grammar["value"])
    jsonschema.Draft202012Validator.check_schema(schema)
    good = {
        "count": [{"item": 3}],
        "name": [{"item": "three"}],
        "unit": [{"unit": "celsius"}],
        "tree": [{"value": 1}, {"value": 1, "child": {"value": 2, "child": {"value": 3}}}],
    }
    bad = {
        "count": [{"item": "three"}, {}],
        "name": [{"item": 3}],
        "unit": [{"unit": "kelvin"}],
        "tree": [
            {"value": 1, "child": [{"name": "tree", "arguments": {"value": 2}}]},
            {"value": 1, "child": {}},
        ],
    }
    for name in [named] if named else good:
        for arguments in good[name]:
            jsonschema.validate([{"name": name, "arguments": arguments}], schema)
        for arguments in bad[name]:
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate([{"name": name, "arguments": arguments}], schema)
    kept = [t["function"] for t in REF_TOOLS if named in (None, t["function"]["name"])]  # a named one alone
    assert [t["function"] for t in plan.tools] == kept  # as sent: the template sees them unscoped


def test_only_the_ref_keywords_of_schemas_are_scoped():
    """Values that look like references but are data (a property named ``$ref``, ``const``,
    ``enum``, ``default``, ``examples``), another document's reference and an anchor stay as they
    are; a ``$ref`` under a keyword of no standard is a schema's (a reference may point there)."""
    parameters = {
        "type": "object",
        "properties": {
            "$ref": {"type": "string", "default": "#/x", "examples": [{"$ref": "#"}]},
            "fixed": {"const": {"$ref": "#/$defs/A"}},
            "pick": {"enum": [{"$ref": "#"}, "#"]},
            "remote": {"$ref": "https://example.com/schema.json#/$defs/A"},
            "anchored": {"$ref": "#node"},
            "local": {"$ref": "#/components/schemas/A"},
        },
        "components": {"schemas": {"A": {"anyOf": [{"$ref": "#/components/schemas/A"}, {"type": "null"}]}}},
    }
    plan = plan_tools(request(tools=[function("f", parameters)], tool_choice="required"), None)
    scoped = json.loads(plan.grammar["value"])["$defs"]["tools.0.parameters"]
    own = "#/$defs/tools.0.parameters"
    expected = json.loads(json.dumps(parameters))
    expected["properties"]["local"]["$ref"] = f"{own}/components/schemas/A"
    expected["components"]["schemas"]["A"]["anyOf"][0]["$ref"] = f"{own}/components/schemas/A"
    assert scoped == expected
    assert plan.tools[0]["function"]["parameters"] == parameters  # the request's own copy is untouched


# ---------------------------------------------------------------- forced output read back

FORCED = '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]'


def test_forced_array_is_read_back_whole_and_streamed():
    whole = ForcedToolCallParser([]).parse(FORCED)
    assert whole.content is None
    assert [(c.name, json.loads(c.arguments)) for c in whole.tool_calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {}),
    ]
    plan = ToolPlan(ForcedToolCallParser, [WEATHER, TIME])
    for cut in range(len(FORCED) + 1):
        completion = streamed(ChoiceOutput(plan, None), FORCED, [cut], [WEATHER, TIME])
        calls = completion.choices[0].message.tool_calls
        assert [(c.function.name, c.function.arguments) for c in calls] == [
            (c.name, c.arguments) for c in whole.tool_calls
        ], cut


@pytest.mark.parametrize("parser, text", [(ForcedToolCallParser, FORCED), (HermesToolParser, QWEN3_ANSWER)])
def test_an_output_cut_off_part_way_ends_alike_streamed_or_not(parser, text):
    """An output cut at any point (a stop string, max_tokens): the stream's finish_reason is the
    whole message's. A call cut inside its arguments is a partial one, not one to run, and the
    stream said "tool_calls" for it (its partial arguments had gone out)."""
    plan = ToolPlan(parser, [WEATHER, TIME])
    for cut in range(len(text) + 1):
        whole = ChoiceOutput(plan, None)
        whole.message(text[:cut])
        stream = ChoiceOutput(plan, None)
        for i in range(0, cut, 5):
            stream.delta(text[i : min(i + 5, cut)], final=False)
        stream.delta("", final=True)
        assert stream.finish_reason("stop") == whole.finish_reason("stop"), (cut, text[:cut])


def test_a_forced_array_cut_off_part_way_is_calls_so_far_streamed_or_not():
    """max_tokens or a stop string cutting the forced array: the whole answer put the array's text
    in content ('[{"name": "get_weather", "arguments": {"ci' with no tool_calls, or a cut-off later
    call next to the whole first one), while the stream sent the cut-off call. Now both answer no
    content and each call whose name is complete with its arguments so far, and finish_reason
    "tool_calls" only when every call is whole (a partial call is not one to run)."""
    plan = ToolPlan(ForcedToolCallParser, [WEATHER, TIME])
    # where each call's name string ends and its arguments value starts and ends, read off FORCED
    spans = []
    for name, arguments in [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]:
        name_end = FORCED.index(f'"{name}"') + len(name) + 2
        start = FORCED.index(arguments, name_end)
        spans.append((name, name_end, start, start + len(arguments)))
    for cut in range(len(FORCED) + 1):
        text = FORCED[:cut]
        named = [span for span in spans if cut >= span[1]]
        expected = [(name, text[start:end]) for name, _, start, end in named]
        finish = "tool_calls" if named and all(cut >= end for *_, end in named) else "stop"
        whole = ChoiceOutput(plan, None)
        completion = as_completion(whole.message(text), whole.finish_reason("stop"))
        for answer in (completion, streamed(ChoiceOutput(plan, None), text, [cut // 2], [WEATHER, TIME])):
            choice = answer.choices[0]
            calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
            got = (choice.message.content or None, calls, choice.finish_reason)  # (a stream's content is "")
            assert got == (None, expected, finish), (cut, text)


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
def test_a_call_to_the_one_function_cut_before_its_name_is_still_that_call(choice):
    """A named tool_choice (or "required" with one function) cut by max_tokens or a stop string
    before the call's name was complete ('[{"na'): the answer had no call at all, so a client
    that forced a call got none. The call is certain: it is that function's, arguments "" so far
    (vLLM's named-function answer), finish_reason not "tool_calls", whole and streamed alike; with
    two functions to choose from such a cut is still no call."""
    tools = [WEATHER, TIME] if choice != "required" else [WEATHER]
    plan = plan_tools(request(tools=tools, tool_choice=choice), None)
    text = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    name_end = text.index('"get_weather"') + len('"get_weather"')
    for cut in range(name_end):
        whole = ChoiceOutput(plan, None)
        completion = as_completion(whole.message(text[:cut]), whole.finish_reason("stop"))
        for answer in (completion, streamed(ChoiceOutput(plan, None), text[:cut], [cut // 2], tools)):
            choice_out = answer.choices[0]
            calls = [(c.function.name, c.function.arguments) for c in choice_out.message.tool_calls or []]
            got = (choice_out.message.content or None, calls, choice_out.finish_reason)
            assert got == (None, [("get_weather", "")], "stop"), (cut, text[:cut])  # a stop string's cut
    two = ToolPlan(ForcedToolCallParser, [WEATHER, TIME])
    whole = ChoiceOutput(two, None)
    assert as_completion(whole.message(text[:9]), "length").choices[0].message.tool_calls is None


@pytest.mark.parametrize("parser", [Qwen3ReasoningParser, DeepSeekR1ReasoningParser])
@pytest.mark.parametrize("text", ["<think>Let me see", "<think>Let me see</think>", "<think>Hm.</think>\n\n"])
def test_a_named_call_after_a_reasoning_with_no_answer_is_that_call_streamed_or_not(parser, text):
    """A named tool_choice whose output is reasoning only (max_tokens inside it, or nothing after
    ``</think>``): the whole message had no call (its content None went to no tool parser) while
    the stream, which feeds the tool parser an empty answer, sent the named function's call with
    arguments "". The call is certain, as for an answer cut before its name: both send it."""
    tools = [WEATHER]
    plan = plan_tools(
        request(tools=tools, tool_choice={"type": "function", "function": {"name": "get_weather"}}), None
    )
    whole = ChoiceOutput(plan, parser)
    completion = as_completion(whole.message(text), whole.finish_reason("stop"))
    for answer in (completion, streamed(ChoiceOutput(plan, parser), text, [len(text) // 2], tools)):
        message = answer.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
        got = (message.content or None, calls, answer.choices[0].finish_reason)
        assert got == (None, [("get_weather", "")], "stop"), answer


def test_a_hermes_call_cut_off_part_way_is_the_call_so_far_streamed_or_not():
    """max_tokens or a stop string cutting a hermes call (the tester's ``{"a": "hello `` cut): the
    whole answer put the raw text in content with no tool_calls, while the stream sent the call.
    Now both answer the text before it as content and the call with its arguments so far once its
    name is complete (the raw text before that), finish_reason "tool_calls" only for a whole call."""
    text = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    name_end = text.index('"get_weather"') + len('"get_weather"')
    start = text.index('{"city"')
    end = start + len('{"city": "Paris"}')
    plan = ToolPlan(HermesToolParser, [WEATHER])
    for cut in range(len(text) + 1):
        head = text[:cut]
        if cut < name_end:
            expected = (head or None, [], "stop")
        else:
            finish = "tool_calls" if cut >= end else "stop"
            expected = ("Checking.", [("get_weather", head[start:end])], finish)
        whole = ChoiceOutput(plan, None)
        completion = as_completion(whole.message(head), whole.finish_reason("stop"))
        for answer in (completion, streamed(ChoiceOutput(plan, None), head, [cut // 2], [WEATHER])):
            choice = answer.choices[0]
            calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
            got = (choice.message.content or None, calls, choice.finish_reason)  # (a stream's content is "")
            assert got == expected, (cut, head)


class TestForcedToolCallConformance(ToolParserSuite):
    """The forced array's parser passes the suite the plugins' parsers pass."""

    parser_cls = ForcedToolCallParser
    tools = [WEATHER, TIME]
    samples = [
        (FORCED, None, [("get_weather", {"city": "Paris"}), ("get_time", {})]),
        ('[{"name": "get_time", "arguments": {}}]', None, [("get_time", {})]),
    ]


def test_a_close_marker_inside_an_unfinished_call_is_not_streamed_as_arguments():
    """Hermes: a model that closes its call tag inside the arguments' string. Streamed, its
    arguments went out up to the end, marker included (``Par</tool_call>``); then parsed whole it
    was a call with arguments ``{"city": "Par`` that are no JSON. A call whose text reaches its
    close marker unfinished is malformed (not cut off by the end of the output): content, whole
    and streamed, and neither says "tool_calls"."""
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par</tool_call>'
    plan = ToolPlan(HermesToolParser, [WEATHER])
    whole = ChoiceOutput(plan, None)
    message = whole.message(text)
    assert (message["content"], "tool_calls" in message) == (text, False)
    assert whole.finish_reason("stop") == "stop"
    for cut in range(1, len(text) + 1):
        stream = ChoiceOutput(plan, None)
        deltas = [stream.delta(text[:cut], final=False), stream.delta(text[cut:], final=True)]
        assert not any(d.get("tool_calls") for d in deltas), cut
        assert "".join(d.get("content") or "" for d in deltas) == text, cut
        assert stream.finish_reason("stop") == "stop", cut
    # the marker's text inside a finished call's string is its arguments, streamed as parsed whole
    fine = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "a</tool_call>b"}}\n</tool_call>'
    [call] = ChoiceOutput(plan, None).message(fine)["tool_calls"]
    for cut in range(1, len(fine) + 1):
        stream = ChoiceOutput(plan, None)
        deltas = [stream.delta(fine[:cut], final=False), stream.delta(fine[cut:], final=True)]
        arguments = "".join(c["function"]["arguments"] for d in deltas for c in d.get("tool_calls", []))
        assert arguments == call["function"]["arguments"], cut


def test_forced_output_that_is_not_calls_stays_content():
    assert ForcedToolCallParser([]).parse("Hello there").content == "Hello there"


# ---------------------------------------------------------------- a choice's message


def test_reasoning_then_tool_call_message():
    output = ChoiceOutput(ToolPlan(HermesToolParser, [WEATHER]), Qwen3ReasoningParser)
    message = output.message(QWEN3_ANSWER)
    completion = as_completion(message, output.finish_reason("stop"))
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "I'll look it up."
    assert message["reasoning_content"] == "\nThe user wants the weather; call the tool.\n"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}


def test_no_parsers_keeps_the_text_as_is():
    output = ChoiceOutput(ToolPlan(), None)
    assert output.message(QWEN3_ANSWER) == {"role": "assistant", "content": QWEN3_ANSWER}
    assert output.finish_reason("stop") == "stop"


def test_single_call_keeps_the_first():
    two = QWEN3_ANSWER + '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    output = ChoiceOutput(ToolPlan(HermesToolParser, [WEATHER, TIME], single_call=True), None)
    assert [c["function"]["name"] for c in output.message(two)["tool_calls"]] == ["get_weather"]


def test_stream_at_every_split_accumulates_to_the_message():
    plan = ToolPlan(HermesToolParser, [WEATHER])
    whole = ChoiceOutput(plan, Qwen3ReasoningParser).message(QWEN3_ANSWER)
    for cut in range(0, len(QWEN3_ANSWER) + 1, 3):
        completion = streamed(ChoiceOutput(plan, Qwen3ReasoningParser), QWEN3_ANSWER, [cut], [WEATHER])
        message = completion.choices[0].message
        assert completion.choices[0].finish_reason == "tool_calls"
        assert message.content == whole["content"]
        assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == [
            (c["function"]["name"], c["function"]["arguments"]) for c in whole["tool_calls"]
        ]


def test_stream_reasoning_deltas():
    output = ChoiceOutput(ToolPlan(), Qwen3ReasoningParser)
    deltas = [output.delta(piece, False) for piece in ("<think>Hmm", ", sure.</think>", "\n\nHi", "!")]
    deltas.append(output.delta("", True))
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Hmm, sure."
    assert "".join(d.get("content", "") for d in deltas) == "Hi!"
    for delta in deltas:
        ChatCompletionChunk.model_validate(r.chat_chunk("c", "m", 0, 0, delta))


@pytest.mark.parametrize(
    "text, opened, content",
    [
        ("<think>So: a number.</think> 42", False, " 42"),  # a regex answer opening with a space
        ("\n<think>x</think>\n\n yes", False, "\n\n yes"),  # the grammar's whitespace, all of it
        ("So: a number.</think> 42", True, " 42"),  # the prompt opened the reasoning
        ("x</think>\t7", True, "\t7"),  # a short reasoning: the tag split within its first pieces
        (" 42", False, " 42"),  # no reasoning: all content, as without a grammar
        ("<think>still thinking", False, None),  # cut off inside the reasoning
        ("<think>x</think>", False, None),  # nothing after it
    ],
)
def test_an_answer_constrained_after_the_reasoning_keeps_its_whitespace(text, opened, content):
    """With a grammar after the reasoning (``Admission.grammar_answer``) the text after
    ``</think>`` is the grammar's: the parser's dropping of the whitespace after the tag (a model's
    "</think>\n\n") would change the answer (a choice of " yes" / " no" came back as "yes"), so it
    is kept, whole and streamed at every split; without a grammar the whitespace goes, as before."""
    whole = ChoiceOutput(ToolPlan(), Qwen3ReasoningParser, None, opened, True).message(text)
    assert whole["content"] == content
    for cut in range(len(text) + 1):
        completion = streamed(
            ChoiceOutput(ToolPlan(), Qwen3ReasoningParser, None, opened, True), text, [cut], []
        )
        assert (completion.choices[0].message.content or None) == content, cut  # (the first chunk sends "")
        assert getattr(completion.choices[0].message, "reasoning_content", None) == whole.get(
            "reasoning_content"
        )
    plain = ChoiceOutput(ToolPlan(), Qwen3ReasoningParser, None, opened).message(text)
    assert plain["content"] == (content.lstrip() or None if content and "</think>" in text else content)
    assert plain.get("reasoning_content") == whole.get("reasoning_content")


@pytest.mark.parametrize(
    "text, opened, gated, reasoning, content",
    [
        ("Let me think.</think>The answer is 4.", False, False, "Let me think.", "The answer is 4."),
        ("Let me think.</think>The answer is 4.", True, False, "Let me think.", "The answer is 4."),
        ("<think>Hm.</think>\n\n4", True, False, "<think>Hm.", "4"),  # (as qwen3: one tag per opening)
        ("<think>Hm.</think>\n\n4", False, False, "Hm.", "4"),
        ("Still thinking", False, False, "Still thinking", None),
        # a grammar after the reasoning that the prompt opened waits for </think>
        ("Hm.</think> 4", True, True, "Hm.", " 4"),
        # neither the prompt nor the output opened it: the grammar applied from the first token
        (' {"n": 4}', False, True, None, ' {"n": 4}'),
    ],
)
def test_deepseek_r1_output_is_split_alike_streamed_or_not(text, opened, gated, reasoning, content):
    """deepseek_r1 reads the output as inside the reasoning (its template opens <think> in the
    prompt), whether the prompt ended with <think> (the server feeds the tag first, once) or not;
    with a grammar gated after the reasoning, an output the grammar had from its first token is
    the answer whole (not reasoning)."""
    whole = ChoiceOutput(ToolPlan(), DeepSeekR1ReasoningParser, None, opened, gated).message(text)
    assert (whole.get("reasoning_content"), whole["content"]) == (reasoning, content)
    for cut in range(len(text) + 1):
        output = ChoiceOutput(ToolPlan(), DeepSeekR1ReasoningParser, None, opened, gated)
        message = streamed(output, text, [cut], []).choices[0].message
        assert getattr(message, "reasoning_content", None) == reasoning, cut
        assert (message.content or None) == content, cut


#: pieces of outputs mixing reasoning and calls (whole, cut off, malformed, markers in prose)
CHOICE_PIECES = [
    "<think>",
    "</think>",
    "<thi",
    "Hm, {x}.",
    " ",
    "\n\n",
    "<tool_call>",
    "</tool_call>",
    '{"name": "get_weather", "arguments": {"city": "Par\\"is 🌤️"}}',
    '{"name": "get_weather", "arguments": {"city": NaN}}',
    '[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    '[{"na',
    "[TOOL_CALLS]",
    "get_weather[ARGS]",
    '{"city": "Rome"}',
]
CHOICE_PLANS = [
    ToolPlan(),
    ToolPlan(HermesToolParser, [WEATHER, TIME]),
    ToolPlan(MistralToolParser, [WEATHER], single_call=True),
    plan_tools(
        request(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}), None
    ),
]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    st.sampled_from(CHOICE_PLANS),
    st.sampled_from([None, Qwen3ReasoningParser, DeepSeekR1ReasoningParser]),
    st.booleans(),
    st.booleans(),
    st.lists(st.sampled_from(CHOICE_PIECES), max_size=6).map("".join),
    st.data(),
)
def test_a_choice_streamed_in_any_pieces_reads_as_its_whole_message(
    plan, reasoning, opened, gated, text, data
):
    """Whatever the parsers (reasoning, then tool calls), the prompt's opened reasoning and a
    grammar after it: the stream's deltas add up to the whole message, its reasoning, content,
    calls (name and arguments) and finish_reason."""
    hidden = ("[TOOL_CALLS]", "[ARGS]") if plan.parser is MistralToolParser else ()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=5)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    whole = ChoiceOutput(plan, reasoning, None, opened and reasoning is not None, gated, hidden)
    message = whole.message(text)
    stream = ChoiceOutput(plan, reasoning, None, opened and reasoning is not None, gated, hidden)
    deltas = [stream.delta(piece, i == len(pieces) - 1) for i, piece in enumerate(pieces)]
    calls: dict[int, list[str]] = {}
    for tool_call in (c for d in deltas for c in d.get("tool_calls", [])):
        entry = calls.setdefault(tool_call["index"], [tool_call["function"].get("name"), ""])
        entry[1] += tool_call["function"]["arguments"]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == (message.get("reasoning_content") or "")
    assert "".join(d.get("content", "") for d in deltas) == (message["content"] or "")
    assert [calls[i] for i in sorted(calls)] == [
        [c["function"]["name"], c["function"]["arguments"]] for c in message.get("tool_calls", [])
    ]
    assert stream.finish_reason("stop") == whole.finish_reason("stop")


def test_tool_messages_reach_the_template():
    body = ChatCompletionRequest(
        messages=[
            *MESSAGES,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
        ],
        tools=[WEATHER],
        chat_template_kwargs={"enable_thinking": False},
    )
    rendered = body.template_messages()
    assert rendered[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    }
    assert rendered[2] == {"role": "tool", "content": "18 C, sunny", "tool_call_id": "call_1"}
    assert body.template_args() == {"enable_thinking": False, "tools": [WEATHER]}


@pytest.mark.parametrize(
    "message",
    [
        {"role": "tool", "content": "x"},  # no tool_call_id
        {"role": "user", "content": None, "tool_calls": []},
        {
            "role": "user",
            "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
            "content": "x",
        },
        {"role": "assistant"},
    ],
)
def test_bad_tool_messages_are_rejected(message):
    with pytest.raises(ValueError):
        ChatCompletionRequest(messages=[message])


def test_an_empty_answer_is_empty_content_with_parsers_too():
    """Without parsers an empty output (a regex grammar of "", ``choice: [""]``) was ``content: ""``;
    through the reasoning or tool parser it was ``null`` (their "no part"). Both give "" now, and
    null stays for a message of tool calls or of reasoning alone."""
    auto = plan_tools(request(tools=[WEATHER]), HermesToolParser)
    for plan, reasoning in (
        (ToolPlan(), None),
        (ToolPlan(), Qwen3ReasoningParser),
        (auto, None),
        (auto, Qwen3ReasoningParser),
    ):
        assert ChoiceOutput(plan, reasoning).message("")["content"] == "", (plan, reasoning)
    assert ChoiceOutput(ToolPlan(), Qwen3ReasoningParser).message("<think>hm")["content"] is None
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert ChoiceOutput(auto, None).message(call)["content"] is None


@pytest.mark.parametrize(
    "parameters",
    [
        {"type": ["object", "null"], "properties": {"x": {"type": "integer"}}},
        {"properties": {"x": {"type": "integer"}}},  # no type: alone, any value passes
        {"required": ["x"]},
        {},
    ],
)
@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_arguments_are_objects_whatever_else_the_parameters_allow(parameters, choice):
    """The forced schema took ``parameters`` as they were: with type ["object", "null"] or no
    type at all it let ``null`` or ``5`` through as the arguments, which no parser takes for a
    call (found by an API probe: the forced array came back as content)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    tool_choice = {"type": "function", "function": {"name": "f"}} if choice == "named" else choice
    plan = plan_tools(request(tools=[tool], tool_choice=tool_choice), None)
    validator = jsonschema.Draft202012Validator(json.loads(plan.grammar["value"]))
    assert validator.is_valid([{"name": "f", "arguments": {"x": 1} if parameters else {}}])
    for arguments in (None, 5, "x", [1]):
        assert not validator.is_valid([{"name": "f", "arguments": arguments}]), arguments


@pytest.mark.parametrize(
    ("parameters", "says"),
    [
        (
            {"anyOf": [{"type": "object"}, {"type": "string"}]},
            'got \'anyOf\' with no type; add "type": "object"',
        ),
        ({"const": 5}, "got 'const' with no type"),
        ({"$ref": "#/$defs/A", "$defs": {"A": {"type": "string"}}}, "got '$ref' with no type"),
        ({"type": ["string", "null"]}, 'got type ["string", "null"]; put the value in a property'),
    ],
)
@pytest.mark.parametrize("choice", ["auto", "required"])
def test_parameters_that_admit_other_values_than_objects_are_a_400(parameters, says, choice):
    """``anyOf`` an object or a string (or a ``const``) at the top passed the type check, which
    looked at ``type`` alone: a forced call's array then leaked into content, or called with a
    string for arguments."""
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    with pytest.raises(APIError) as err:
        plan_tools(request(tools=[WEATHER, tool], tool_choice=choice), HermesToolParser)
    assert err.value.status == 400 and err.value.param == "tools.1.function.parameters"
    assert "must be a JSON Schema of type 'object'" in err.value.message and says in err.value.message


SPECIAL = ("</s>", "[TOOL_CALLS]", "[ARGS]", "[INST]", "[/INST]", "ab", "bc", "abcd")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hi[TOOL_CALLS] sorry</s>", "Hi sorry"),
        ("[INST][/INST]x[/INS", "x[/INS"),
        ("abc", "c"),  # leftmost first
        ("abcd abce", " ce"),  # longest at a place
        ("<no special>", "<no special>"),
    ],
)
def test_special_text_filter_takes_special_tokens_out_whole_and_streamed(text, expected):
    """As skip_special_tokens would: each special token's text leaves the answer, read left to right,
    the longest first, whatever the stream's pieces."""
    assert SpecialTextFilter(SPECIAL).whole(text) == expected
    for cut in range(len(text) + 1):
        stream = SpecialTextFilter(SPECIAL)
        assert stream.feed(text[:cut]) + stream.feed(text[cut:]) + stream.finish() == expected, cut
    stream = SpecialTextFilter(SPECIAL)
    assert "".join(stream.feed(c) for c in text) + stream.finish() == expected


def test_special_tokens_no_parser_consumed_leave_content_and_reasoning():
    """A mistral answer detokenized with special tokens kept for its parser: the calls are read, and
    the special tokens left (an EOS kept as stop text, a marker that starts no call) are not content."""
    from minisgl_plugin_mistral.parser import MistralToolParser

    plan = ToolPlan(MistralToolParser, [WEATHER])
    text = 'Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}</s>'
    message = ChoiceOutput(plan, None, hidden_special=SPECIAL).message(text)
    assert message["content"] == "Let me check."
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [
        ("get_weather", '{"city": "Paris"}')
    ]
    text = "<think>Hmm[INST]</think>Hi[TOOL_CALLS] sorry</s>"
    message = ChoiceOutput(plan, Qwen3ReasoningParser, hidden_special=SPECIAL).message(text)
    assert (message["reasoning_content"], message["content"]) == ("Hmm", "Hi sorry")
    for cut in range(len(text) + 1):
        output = ChoiceOutput(plan, Qwen3ReasoningParser, hidden_special=SPECIAL)
        deltas = [output.delta(text[:cut], False), output.delta(text[cut:], True)]
        assert "".join(d.get("content", "") for d in deltas) == "Hi sorry", cut
        assert "".join(d.get("reasoning_content", "") for d in deltas) == "Hmm", cut
    # without hidden_special (the request set skip_special_tokens false) they stay
    assert ChoiceOutput(plan, None).message("Hi[TOOL_CALLS] sorry")["content"] == "Hi[TOOL_CALLS] sorry"
