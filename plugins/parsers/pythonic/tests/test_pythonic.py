"""The pythonic tool parser on outputs in Meta's formats: Llama 3.2's ``[func(a=1), func2(b="x")]``
answer and Llama 4's, wrapped in ``<|python_start|>``/``<|python_end|>``; literals become JSON,
anything that is not a whole list of calls stays content, whole and streamed at every split."""

from __future__ import annotations

import json

import pytest
from minisgl_plugin_pythonic.parser import PythonicToolParser

from minisgl_core.testing.packaging_suite import PluginPackagingSuite
from minisgl_core.testing.parser_suite import ToolParserSuite

TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("get_weather", "get_user_info", "get_time")
]
# Llama 3.2 (1B/3B Instruct), as its prompt format asks: the list of calls is the whole answer
ONE = "[get_user_info(user_id=7890, special='black')]"
TWO = '[get_weather(city="San Francisco", metric="celsius"), get_time()]'
# Llama 4, between its python markers
LLAMA4 = '<|python_start|>[get_weather(city="Paris", days=3, hourly=True)]<|python_end|>'
LITERALS = (
    "[get_weather(city='Zürich', days=-2, ratio=0.5, alerts=None, units=('C', 'F'), "
    "coords=[47.4, 8.5], opts={'wind': True, 'nested': {'a': [1, 2]}}, note=\"it's \\\"cold\\\"\")]"
)
NOT_CALLS = [
    '[get_weather(city="Paris")] Let me know if you need more.',  # text after the list
    'Sure: [get_weather(city="Paris")]',  # text before it
    '[get_weather("Paris")]',  # a positional argument
    "[get_weather(city=paris)]",  # a name, not a literal
    "[get_weather(city=__import__('os').system('true'))]",  # an expression: never evaluated
    '[get_weather(city="Paris", city="Rome")]',  # a keyword twice
    "[get_weather(city={'Paris', 'Rome'})]",  # a set: no JSON form
    "[get_weather(days=1e999)]",  # infinity: no JSON form
    "[get_weather(opts={1: 'a'})]",  # a key that is not a string
    "[get_weather(**{'city': 'Paris'})]",
    "[os.system(command='true')]",  # an attribute call
    "[get_weather]",
    "[]",
    "[1] A citation.",
    '[get_weather(city="Paris"',  # cut off (max_tokens, a stop string)
    '[get_weather(city="Paris")',
]


def parsed(text: str, tools=TOOLS):
    result = PythonicToolParser(tools).parse(text)
    return result.content, [(c.name, json.loads(c.arguments)) for c in result.tool_calls]


def test_llama_3_2_calls():
    assert parsed(ONE) == (None, [("get_user_info", {"user_id": 7890, "special": "black"})])
    assert parsed(TWO) == (
        None,
        [("get_weather", {"city": "San Francisco", "metric": "celsius"}), ("get_time", {})],
    )


def test_llama_4_python_markers_and_whitespace_around():
    assert parsed(LLAMA4) == (None, [("get_weather", {"city": "Paris", "days": 3, "hourly": True})])
    assert parsed(f"\n  {TWO}\n") == parsed(TWO)
    # the markers are special tokens: skipped, or only one of them left, it is the same answer
    assert parsed(LLAMA4.removeprefix("<|python_start|>")) == parsed(LLAMA4)


def test_python_literals_become_json():
    [call] = PythonicToolParser(TOOLS).parse(LITERALS).tool_calls
    assert json.loads(call.arguments) == {
        "city": "Zürich",
        "days": -2,
        "ratio": 0.5,
        "alerts": None,
        "units": ["C", "F"],
        "coords": [47.4, 8.5],
        "opts": {"wind": True, "nested": {"a": [1, 2]}},
        "note": 'it\'s "cold"',
    }
    assert "Zürich" in call.arguments  # JSON text as a client reads it, not \u escapes


@pytest.mark.parametrize("text", NOT_CALLS)
def test_anything_but_a_whole_list_of_calls_is_content(text):
    assert parsed(text) == (text, [])


def test_a_call_to_a_function_not_offered_makes_the_list_content():
    text = "[get_time(), delete_everything(now=True)]"
    assert parsed(text) == (text, [])
    assert parsed(text, tools=()) == (None, [("get_time", {}), ("delete_everything", {"now": True})])


def test_plain_text_streams_at_once():
    """Only an output that opens like a list of calls is held back."""
    parser = PythonicToolParser(TOOLS)
    assert parser.feed("[1] A").content == "[1] A"
    parser = PythonicToolParser(TOOLS)
    assert parser.feed("[get_weather(").content == ""
    assert parser.finish().content == "[get_weather("


class TestPythonicPackaging(PluginPackagingSuite):
    plugin = "pythonic"
    provides = {"tool_parsers": ["pythonic"]}


class TestPythonicConformance(ToolParserSuite):
    """The conformance kit's tool-parser suite, as a third party's parser would run it."""

    parser_cls = "pythonic"
    tools = TOOLS
    samples = [
        (TWO, None, [("get_weather", {"city": "San Francisco", "metric": "celsius"}), ("get_time", {})]),
        (LLAMA4, None, [("get_weather", {"city": "Paris", "days": 3, "hourly": True})]),
        (ONE, None, [("get_user_info", {"user_id": 7890, "special": "black"})]),
        (NOT_CALLS[0], NOT_CALLS[0], []),
    ]
    more_outputs = [LITERALS, *NOT_CALLS]
