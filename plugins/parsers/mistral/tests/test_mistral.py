"""The Mistral tool parser on outputs in mistral-common's tokenizer v3 format,
``[TOOL_CALLS] [{...}, ...]`` (Mistral-7B-Instruct-v0.3, Mixtral-8x22B-Instruct), with its marker or
with the marker skipped as a special token; whole, streamed at every split, malformed calls and
answers that do not open with the calls left as content."""

from __future__ import annotations

import json

import pytest
from minisgl_plugin_mistral.parser import MistralToolParser

from minisgl_core.api import merge_tool_deltas
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
MALFORMED = [
    '[TOOL_CALLS] [{"name": "get_time", "arguments": {"tz": }}]',
    '[TOOL_CALLS] [{"arguments": {"tz": "UTC"}}]',
    "[TOOL_CALLS] sorry, no tool fits",
    "[1] A citation, not a call.",
    # calls only open the answer: with special tokens skipped (the default) a marker after text is
    # gone and what follows could not be told from text; Mistral's v11 form
    # (``[TOOL_CALLS]name[ARGS]{...}``) is not read either (README)
    'Let me look that up.\n\n[TOOL_CALLS] [{"name": "get_time", "arguments": {}}]',
    '[TOOL_CALLS]get_time[ARGS]{"tz": "UTC"}',
]


def parsed(text: str, tools=TOOLS):
    result = MistralToolParser(tools).parse(text)
    return result.content, [(c.name, json.loads(c.arguments)) for c in result.tool_calls]


def stream(text: str, cuts: list[int]) -> tuple[str, list[tuple[str, str]]]:
    parser = MistralToolParser(TOOLS)
    content, deltas, start = "", [], 0
    for end in [*cuts, len(text)]:
        out = parser.feed(text[start:end])
        content, deltas, start = content + out.content, deltas + out.tool_calls, end
    last = parser.finish()
    calls = merge_tool_deltas(deltas + last.tool_calls)
    return content + last.content, [(c.name, c.arguments) for c in calls]


WEATHER_ARGS = {"location": "Paris, France", "format": "celsius"}


def test_v3_array_of_calls():
    assert parsed(V3_ONE) == (None, [("get_current_weather", WEATHER_ARGS)])
    assert parsed(V3_TWO) == (
        None,
        [("get_current_weather", WEATHER_ARGS), ("get_time", {"tz": "Europe/Paris"})],
    )


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


def test_a_call_cut_off_is_a_call_with_its_arguments_so_far_once_named():
    for text, expected in [
        (
            V3_ONE[: V3_ONE.index("celsius")],
            [("get_current_weather", '{"location": "Paris, France", "format": "')],
        ),
    ]:
        content = "" if expected else text
        for cuts in ([], [len(text) // 2], list(range(1, len(text)))):
            assert stream(text, cuts) == (content, expected), (text, cuts)


@pytest.mark.parametrize("text", [V3_ONE, V3_TWO, V3_SKIPPED, *MALFORMED])
def test_stream_split_anywhere_matches_parse(text):
    whole = MistralToolParser(TOOLS).parse(text)
    expected = (whole.content or "", [(c.name, c.arguments) for c in whole.tool_calls])
    for cut in range(len(text) + 1):
        assert stream(text, [cut]) == expected, cut
    assert stream(text, list(range(1, len(text)))) == expected
    assert stream(text, list(range(3, len(text), 3))) == expected


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
        (MALFORMED[0], MALFORMED[0], []),
    ]
