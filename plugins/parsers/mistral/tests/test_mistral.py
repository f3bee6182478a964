"""The Mistral tool parser on outputs in mistral-common's formats: tokenizer v3's
``[TOOL_CALLS] [{...}, ...]`` (Mistral-7B-Instruct-v0.3, Mixtral-8x22B-Instruct), opening the answer
with its marker or without it (skipped as a special token), or after some content; tokenizer v11's
``[TOOL_CALLS]name[ARGS]{...}`` (Mistral-Small-3.x, Magistral, Devstral), with an optional
``[CALL_ID]``; whole, streamed at every split, malformed calls left as content."""

from __future__ import annotations

import json

import pytest
from minisgl_plugin_mistral.parser import MistralToolParser

from minisgl_core.testing.packaging_suite import PluginPackagingSuite
from minisgl_core.testing.parser_suite import ToolParserSuite

TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("get_current_weather", "get_time")
]
# v3, as Mistral-7B-Instruct-v0.3 answers (the "id" that v3's template writes in the history is ignored)
V3_ONE = (
    '[TOOL_CALLS] [{"name": "get_current_weather", '
    '"arguments": {"location": "Paris, France", "format": "celsius"}}]'
)
V3_TWO = (
    '[TOOL_CALLS] [{"name": "get_current_weather", "arguments": {"location": "Paris, France", '
    '"format": "celsius"}, "id": "a5Bc9dE1f"}, {"name": "get_time", "arguments": {"tz": "Europe/Paris"}}]'
)
#: the same with [TOOL_CALLS] skipped (a special token: the request's default skips it)
V3_SKIPPED = V3_TWO.removeprefix("[TOOL_CALLS]")
#: v11 and later, as Mistral-Small-3.2 and Magistral answer (one marker per call)
V11_TWO = (
    '[TOOL_CALLS]get_current_weather[ARGS]{"location": "Paris, France", "format": "celsius"}'
    '[TOOL_CALLS]get_time[ARGS]{"tz": "Europe/Paris"}'
)
#: v11 with call ids (Devstral, Mistral-Small-3.1's tokenizer v11 with [CALL_ID])
V11_IDS = (
    '[TOOL_CALLS]get_current_weather[CALL_ID]a5Bc9dE1f[ARGS]{"location": "Paris, France", '
    '"format": "celsius"}[TOOL_CALLS]get_time[CALL_ID]Zy8xW7v6u[ARGS]{"tz": "Europe/Paris"}'
)
#: calls after some content, each form
V3_AFTER_TEXT = 'Let me check.[TOOL_CALLS] [{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}]'
V11_AFTER_TEXT = 'Let me check. [TOOL_CALLS]get_time[ARGS]{"tz": "Europe/Paris"}'
MALFORMED = [
    '[TOOL_CALLS] [{"name": "get_time", "arguments": {"tz": }}]',
    '[TOOL_CALLS] [{"arguments": {"tz": "UTC"}}]',
    "[TOOL_CALLS] sorry, no tool fits",
    "[1] A citation, not a call.",
    '[TOOL_CALLS]get_time[ARGS]{"tz": }',
    '[TOOL_CALLS]get_time[ARGS]"UTC"',
    # NaN and Infinity are Python's json extension, not JSON: they were sent as arguments
    '[TOOL_CALLS]get_time[ARGS]{"offset": NaN}',
    '[TOOL_CALLS] [{"name": "get_time", "arguments": {"offset": [-Infinity]}}]',
    '[TOOL_CALLS]get time[ARGS]{"tz": "UTC"}',
    '[TOOL_CALLS][ARGS]{"tz": "UTC"}',
    "[TOOL_CALLS]get_time",
    "Nothing to call.[TOOL_CALLS]",
    # without its marker (skipped), an array after text cannot be told from text
    'Let me look that up.\n\n [{"name": "get_time", "arguments": {}}]',
]
#: (text, content, calls) of the forms that mix content and calls
MIXED = [
    (V3_AFTER_TEXT, "Let me check.", [("get_time", {"tz": "Europe/Paris"})]),
    (V11_AFTER_TEXT, "Let me check.", [("get_time", {"tz": "Europe/Paris"})]),
    # a malformed call, then a good one: the first is content
    (
        '[TOOL_CALLS]get time[ARGS]{}\n[TOOL_CALLS]get_time[ARGS]{"tz": "UTC"}',
        "[TOOL_CALLS]get time[ARGS]{}",
        [("get_time", {"tz": "UTC"})],
    ),
    # text after the calls stays content
    ('[TOOL_CALLS]get_time[ARGS]{"tz": "UTC"} Done.', "Done.", [("get_time", {"tz": "UTC"})]),
]


def parsed(text: str, tools=TOOLS):
    result = MistralToolParser(tools).parse(text)
    return result.content, [(c.name, json.loads(c.arguments)) for c in result.tool_calls]


def stream(text: str, cuts: list[int]) -> tuple[str, list[tuple[str, str]]]:
    content, calls, _ = TestMistralConformance().stream(text, cuts)
    return content, [(c.name, c.arguments) for c in calls]


WEATHER_ARGS = {"location": "Paris, France", "format": "celsius"}


def test_v3_array_of_calls():
    assert parsed(V3_ONE) == (None, [("get_current_weather", WEATHER_ARGS)])
    assert parsed(V3_TWO) == (
        None,
        [("get_current_weather", WEATHER_ARGS), ("get_time", {"tz": "Europe/Paris"})],
    )


def test_v11_one_marker_per_call_with_or_without_call_ids():
    two = [("get_current_weather", WEATHER_ARGS), ("get_time", {"tz": "Europe/Paris"})]
    assert parsed(V11_TWO) == (None, two)
    assert parsed(V11_IDS) == (None, two)
    ids = [c.id for c in MistralToolParser(TOOLS).parse(V11_IDS).tool_calls]
    assert all(i.startswith("call_") for i in ids) and len(set(ids)) == 2  # the server's, not the model's


@pytest.mark.parametrize(("text", "content", "calls"), MIXED)
def test_calls_after_content(text, content, calls):
    assert parsed(text) == (content, calls)


def test_the_parser_asks_for_special_tokens():
    assert MistralToolParser.reads_special_tokens


def test_v3_array_with_its_special_token_skipped():
    """skip_special_tokens (the default) takes [TOOL_CALLS] out of the text: the array opening the
    answer is still the calls."""
    assert parsed(V3_SKIPPED) == parsed(V3_TWO)


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_is_content(text):
    assert parsed(text) == (text, [])


def test_a_call_to_a_function_not_offered_is_content():
    v3 = '[TOOL_CALLS] [{"name": "delete_everything", "arguments": {}}]'
    assert parsed(v3) == (v3, [])
    assert parsed(v3, tools=()) == (None, [("delete_everything", {})])  # no tools: any name is taken
    v11 = "[TOOL_CALLS]delete_everything[ARGS]{}"
    assert parsed(v11) == (v11, [])
    assert parsed(v11, tools=()) == (None, [("delete_everything", {})])


def test_a_call_cut_off_is_a_call_with_its_arguments_so_far_once_named():
    for text, expected in [
        (
            V3_ONE[: V3_ONE.index("celsius")],
            [("get_current_weather", '{"location": "Paris, France", "format": "')],
        ),
        (
            V11_TWO[: V11_TWO.index("Europe")],
            [("get_current_weather", json.dumps(WEATHER_ARGS)), ("get_time", '{"tz": "')],
        ),
        ("[TOOL_CALLS]get_time[ARGS]", [("get_time", "")]),
        ("[TOOL_CALLS]get_time[CALL_ID]a5B", [("get_time", "")]),
        ("[TOOL_CALLS]get_ti", []),
        ('[TOOL_CALLS] [{"name": "get_ti', []),
    ]:
        content = "" if expected else text
        for cuts in ([], [len(text) // 2], list(range(1, len(text)))):
            assert stream(text, cuts) == (content, expected), (text, cuts)


class TestMistralPackaging(PluginPackagingSuite):
    plugin = "mistral"
    provides = {"tool_parsers": ["mistral"]}


class TestMistralConformance(ToolParserSuite):
    """The conformance kit's tool-parser suite, as a third party's parser would run it."""

    parser_cls = "mistral"
    tools = TOOLS
    samples = [
        (V3_TWO, None, [("get_current_weather", WEATHER_ARGS), ("get_time", {"tz": "Europe/Paris"})]),
        (V3_SKIPPED, None, [("get_current_weather", WEATHER_ARGS), ("get_time", {"tz": "Europe/Paris"})]),
        (V11_TWO, None, [("get_current_weather", WEATHER_ARGS), ("get_time", {"tz": "Europe/Paris"})]),
        (V11_IDS, None, [("get_current_weather", WEATHER_ARGS), ("get_time", {"tz": "Europe/Paris"})]),
        (V3_AFTER_TEXT, "Let me check.", [("get_time", {"tz": "Europe/Paris"})]),
        (V11_AFTER_TEXT, "Let me check.", [("get_time", {"tz": "Europe/Paris"})]),
        (MALFORMED[0], MALFORMED[0], []),
        (MALFORMED[4], MALFORMED[4], []),
    ]
    more_outputs = [V3_ONE, *MALFORMED, *(m[0] for m in MIXED)]
