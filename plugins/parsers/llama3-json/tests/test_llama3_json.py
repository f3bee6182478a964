"""The Llama 3.1 JSON tool parser: calls opening the answer, whole and streamed at every split."""

from __future__ import annotations

import json

import pytest
from minisgl_plugin_llama3_json.parser import Llama3JsonToolParser

from minisgl_core.testing.packaging_suite import PluginPackagingSuite
from minisgl_core.testing.parser_suite import ToolParserSuite

ONE = '{"name": "get_weather", "parameters": {"city": "Paris", "days": [1, 2]}}'
WITH_TAG = '<|python_tag|>{"name": "search", "arguments": {"q": "a;b"}}'
TWO = '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}'
PLAIN = "It is sunny in Paris {today}."
MALFORMED = ['{"name": "get_weather", "parameters": 5}', '{"city": "Paris"}', "{not json}"]


def test_one_call():
    result = Llama3JsonToolParser([]).parse(ONE)
    assert result.content is None
    [call] = result.tool_calls
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris", "days": [1, 2]}


def test_python_tag_and_arguments_key():
    [call] = Llama3JsonToolParser([]).parse(WITH_TAG).tool_calls
    assert call.name == "search" and json.loads(call.arguments) == {"q": "a;b"}


def test_several_calls_joined_by_semicolons():
    calls = Llama3JsonToolParser([]).parse(TWO).tool_calls
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {}),
    ]


@pytest.mark.parametrize("text", [PLAIN, *MALFORMED])
def test_not_a_call_is_content(text):
    result = Llama3JsonToolParser([]).parse(text)
    assert result.content == text and result.tool_calls == []


class TestLlama3JsonPackaging(PluginPackagingSuite):
    plugin = "llama3-json"
    provides = {"tool_parsers": ["llama3_json"]}


class TestLlama3JsonConformance(ToolParserSuite):
    """The conformance kit's tool-parser suite, as a third party's parser would run it."""

    parser_cls = "llama3_json"
    tools = [
        {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
        for name in ("get_weather", "get_time", "search")
    ]
    samples = [
        (ONE, None, [("get_weather", {"city": "Paris", "days": [1, 2]})]),
        (WITH_TAG, None, [("search", {"q": "a;b"})]),
        (TWO, None, [("get_weather", {"city": "Paris"}), ("get_time", {})]),
        (PLAIN, PLAIN, []),
    ]
    more_outputs = MALFORMED
