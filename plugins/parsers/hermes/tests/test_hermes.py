"""The Hermes tool parser on Qwen3-style outputs: whole, streamed split at every character, and
malformed calls left as content."""

from __future__ import annotations

import json

import pytest
from minisgl_plugin_hermes.parser import HermesToolParser

from minisgl_core.api import ToolCall
from minisgl_core.testing.packaging_suite import PluginPackagingSuite
from minisgl_core.testing.parser_suite import ToolParserSuite

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
ONE_CALL = (
    "Let me check the weather.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
)
TWO_CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"arguments": {"city": "Rome, \\"Italy\\" {}"}, "name": "get_weather"}\n</tool_call>'
)
PLAIN = "The weather in Paris is mild.\n\nEnjoy!\n"
#: malformed before the arguments begin: a stream can still give it back as content
MALFORMED_EARLY = [
    "<tool_call>\nnot json at all\n</tool_call>",
    '<tool_call>\n{"name": get_weather, "arguments": {}}\n</tool_call>',
    'Sure. <tool_call>{"arguments" {"a": 1}}</tool_call> done',
]


def stream(text: str, cuts: list[int]) -> tuple[str, list[ToolCall], int]:
    """Feed ``text`` in pieces ending at ``cuts``: (content, calls, number of argument deltas)."""
    content, calls, deltas = TestHermesConformance().stream(text, cuts)
    return content, calls, sum(1 for d in deltas if d.arguments)


def test_one_call_with_content():
    result = HermesToolParser(TOOLS).parse(ONE_CALL)
    assert result.content == "Let me check the weather."
    [call] = result.tool_calls
    assert call.name == "get_weather" and call.id.startswith("call_") and len(call.id) == 29
    assert json.loads(call.arguments) == {"city": "Paris", "unit": "celsius"}


def test_two_calls_keys_in_any_order():
    result = HermesToolParser(TOOLS).parse(TWO_CALLS)
    assert result.content is None
    assert [json.loads(c.arguments) for c in result.tool_calls] == [
        {"city": "Paris"},
        {"city": 'Rome, "Italy" {}'},
    ]
    assert len({c.id for c in result.tool_calls}) == 2


def test_arguments_written_as_parameters_are_kept_whole_or_streamed():
    """A call with Llama's "parameters" key was kept with its arguments dropped ("{}")."""
    text = '<tool_call>\n{"name": "get_weather", "parameters": {"city": "Paris"}}\n</tool_call>'
    [call] = HermesToolParser(TOOLS).parse(text).tool_calls
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    content, calls, _ = stream(text, list(range(1, len(text))))
    assert content == "" and [json.loads(c.arguments) for c in calls] == [{"city": "Paris"}]


def test_plain_text_is_untouched():
    result = HermesToolParser(TOOLS).parse(PLAIN)
    assert result == type(result)(PLAIN, [])


@pytest.mark.parametrize(
    "text", [*MALFORMED_EARLY, '<tool_call>{"name": "f", "arguments": {"a": }}</tool_call>']
)
def test_malformed_call_is_content(text):
    result = HermesToolParser(TOOLS).parse(text)
    assert result.content == text and result.tool_calls == []


@pytest.mark.parametrize("value", ["NaN", "[Infinity]", '{"low": -Infinity}'])
def test_arguments_with_python_constants_are_not_json_so_not_a_call(value):
    """NaN and Infinity are Python's json extension, not JSON (a client's JSON.parse refuses
    them): the call was sent with them in its arguments (finish_reason "tool_calls"), where the
    same constant in another key ("id": NaN) made the object malformed. Content, whole and streamed."""
    text = f'<tool_call>{{"name": "get_weather", "arguments": {{"days": {value}}}}}</tool_call>'
    result = HermesToolParser(TOOLS).parse(text)
    assert result.content == text and result.tool_calls == []
    assert stream(text, list(range(1, len(text))))[:2] == (text, [])


def test_a_call_cut_off_is_a_call_with_its_arguments_so_far_once_named():
    """max_tokens or a stop string ending the output inside a call: parsed whole it was content
    (the raw text) while the stream sent the call; the README promises the call, streamed or not."""
    cut_in_arguments = ONE_CALL[: ONE_CALL.index("celsius")]
    cut_after_name = ONE_CALL[: ONE_CALL.index(', "arguments"')]
    cut_in_name = ONE_CALL[: ONE_CALL.index('weather"')]
    for text, expected in [
        (cut_in_arguments, [("get_weather", '{"city": "Paris", "unit": "')]),
        (cut_after_name, [("get_weather", "")]),
        (cut_in_name, []),
    ]:
        content = "Let me check the weather." if expected else text
        whole = HermesToolParser(TOOLS).parse(text)
        assert (whole.content, [(c.name, c.arguments) for c in whole.tool_calls]) == (content, expected)
        for cuts in ([], [len(text) // 2], list(range(1, len(text)))):
            streamed, calls, _ = stream(text, cuts)
            assert (streamed, [(c.name, c.arguments) for c in calls]) == (content, expected), cuts


def test_missing_close_tag_at_the_end_is_still_a_call():
    result = HermesToolParser(TOOLS).parse(ONE_CALL.removesuffix("\n</tool_call>"))
    assert [c.name for c in result.tool_calls] == ["get_weather"]


def test_stream_char_by_char_sends_a_call_whole_once_it_is_valid():
    """A call's arguments went out as they grew, so a call that turned malformed could not be
    taken back; now it is held until its object is complete: one delta with id, name, arguments."""
    content, calls, argument_deltas = stream(ONE_CALL, list(range(1, len(ONE_CALL))))
    whole = HermesToolParser(TOOLS).parse(ONE_CALL)
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole.tool_calls]
    assert argument_deltas == 1


@pytest.mark.parametrize("text", MALFORMED_EARLY)
def test_stream_malformed_is_content(text):
    for cut in range(len(text) + 1):
        assert stream(text, [cut])[:2] == (text, []), cut
    assert stream(text, list(range(1, len(text))))[:2] == (text, [])


#: (the broken call, text after): the call's JSON turns malformed after its arguments began
BROKEN_LATE = [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>', ""),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"} junk\n</tool_call>', ""),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>', "Done."),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"</tool_call>', "Done."),
    # a whole object, then other text before the close marker: the block is content (it was a
    # call, then '} junk</tool_call>' as content); two objects in one block likewise
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}} junk\n</tool_call>', "Done."),
    (
        '<tool_call>\n{"name": "get_weather", "arguments": {}}\n{"name": "get_weather", "arguments": {}}\n</tool_call>',
        "",
    ),
]


@pytest.mark.parametrize(("broken", "after"), BROKEN_LATE)
def test_stream_a_call_broken_after_its_arguments_began_is_content(broken, after):
    """Streamed, a call whose JSON turned malformed after its arguments began kept what had been
    sent as a call (with broken arguments) and dropped the rest of its block, where the whole answer
    made it content. Now the stream holds the call until it is whole, so it is content too."""
    text = f"{broken}\n{after}" if after else broken
    for cuts in [list(range(1, len(text))), *([cut] for cut in range(len(text) + 1))]:
        assert stream(text, cuts)[:2] == (text, []), cuts
    # a good call after the broken one is still a call
    text = f"{broken}\n{TWO_CALLS}"
    content, calls, _ = stream(text, list(range(1, len(text))))
    assert content == broken and [c.name for c in calls] == ["get_weather"] * 2


def test_a_call_to_a_function_not_offered_is_content():
    """The model named a function the request did not offer: it was answered as a tool call
    (OpenAI calls offered functions only); it is content, whole and streamed, and a call to an
    offered function after it is still a call."""
    bad = '<tool_call>\n{"name": "delete_everything", "arguments": {"now": true}}\n</tool_call>'
    text = f"{bad}\n{ONE_CALL.split(chr(10), 1)[1]}"
    result = HermesToolParser(TOOLS).parse(text)
    assert result.content == bad and [c.name for c in result.tool_calls] == ["get_weather"]
    for cuts in ([cut] for cut in range(len(text) + 1)):
        content, calls, _ = stream(text, cuts)
        assert (content, [c.name for c in calls]) == (bad, ["get_weather"]), cuts
    content, calls, _ = stream(text, list(range(1, len(text))))
    assert (content, [c.name for c in calls]) == (bad, ["get_weather"])
    # without tools (a parser made for no request's offer) any name is taken
    assert [c.name for c in HermesToolParser().parse(bad).tool_calls] == ["delete_everything"]


class TestHermesPackaging(PluginPackagingSuite):
    plugin = "hermes"
    provides = {"tool_parsers": ["hermes"]}


class TestHermesConformance(ToolParserSuite):
    """The conformance kit's tool-parser suite, as a third party's parser would run it."""

    parser_cls = "hermes"
    tools = TOOLS
    samples = [
        (ONE_CALL, "Let me check the weather.", [("get_weather", {"city": "Paris", "unit": "celsius"})]),
        (
            TWO_CALLS,
            None,
            [("get_weather", {"city": "Paris"}), ("get_weather", {"city": 'Rome, "Italy" {}'})],
        ),
        (MALFORMED_EARLY[2], MALFORMED_EARLY[2], []),
    ]
    more_outputs = [PLAIN, *MALFORMED_EARLY, *(f"{broken}\n{after}" for broken, after in BROKEN_LATE)]
