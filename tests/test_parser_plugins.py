"""The parser plugin kinds: minisgl_register_tool_parsers and minisgl_register_reasoning_parsers
fill their registries, a new format is a few class attributes, and bad names say what to install;
a JSON tool-call parser's stream gives what it parses whole, however the output is split."""

from __future__ import annotations

import json
from importlib import metadata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from minisgl_plugin_hermes.parser import HermesToolParser
from minisgl_plugin_llama3_json.parser import Llama3JsonToolParser

from minisgl_core.api import (
    ReasoningParser,
    ReasoningResult,
    ScanMemo,
    ToolParser,
    merge_tool_deltas,
    scan_tool_call,
)
from minisgl_core.plugins import PluginError, Plugins

PARSERS = """
from minisgl_core.api import JsonToolCallParser, TagReasoningParser, hookimpl

MINISGL_API = "2.0"


class BracketCalls(JsonToolCallParser):
    call_open = "[CALL]"
    call_close = "[/CALL]"


class Thought(TagReasoningParser):
    start_tag = "<thought>"
    end_tag = "</thought>"


@hookimpl
def minisgl_register_tool_parsers(register):
    register("bracket", "fake_parsers:BracketCalls")


@hookimpl
def minisgl_register_reasoning_parsers(register):
    register("thought", "fake_parsers:Thought")
"""


def test_parser_hooks_fill_their_registries(tmp_path, monkeypatch):
    (tmp_path / "fake_parsers.py").write_text(PARSERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins = Plugins.load(
        entry_points=[metadata.EntryPoint("fake-parsers", "fake_parsers", "minisgl.plugins")]
    )
    [info] = plugins.infos
    assert info.status == "ok", info.reason
    assert info.provides["tool_parsers"] == ["bracket"] and info.provides["reasoning_parsers"] == ["thought"]
    tools = plugins.resolve("tool_parsers", "bracket")
    thought = plugins.resolve("reasoning_parsers", "thought")
    assert issubclass(tools, ToolParser) and issubclass(thought, ReasoningParser)
    [call] = tools([]).parse('Sure. [CALL]{"name": "f", "arguments": {"x": [1]}}[/CALL]').tool_calls
    assert call.name == "f" and json.loads(call.arguments) == {"x": [1]}
    assert thought().parse("<thought>hmm</thought> ok") == ReasoningResult("hmm", "ok")


def test_installed_parsers_resolve_and_unknown_names_say_what_to_install():
    plugins = Plugins.load()
    assert issubclass(plugins.resolve("tool_parsers", "hermes"), ToolParser)
    assert issubclass(plugins.resolve("tool_parsers", "llama3_json"), ToolParser)
    assert issubclass(plugins.resolve("reasoning_parsers", "qwen3"), ReasoningParser)
    # vLLM's name: the same tags, the output beginning inside the reasoning
    r1, qwen3 = (plugins.resolve("reasoning_parsers", name) for name in ("deepseek_r1", "qwen3"))
    assert issubclass(r1, qwen3) and r1 is not qwen3
    assert r1().parse("a</think>b") == ReasoningResult("a", "b")
    assert issubclass(plugins.resolve("tool_parsers", "mistral"), ToolParser)
    assert issubclass(plugins.resolve("tool_parsers", "pythonic"), ToolParser)
    with pytest.raises(
        PluginError,
        match=r"unknown --tool-call-parser 'granite'; installed: hermes, llama3_json, mistral, pythonic",
    ):
        plugins.resolve("tool_parsers", "granite")
    # (no index has a minisgl-plugin-granite-reasoning, which it said to pip install)
    with pytest.raises(
        PluginError,
        match=r"unknown --reasoning-parser 'granite'; installed: deepseek_r1, qwen3; install a plugin that registers it$",
    ):
        plugins.resolve("reasoning_parsers", "granite")


@pytest.mark.parametrize(
    ("text", "status", "name", "arguments"),
    [
        ('{"name": "f", "arguments": {"a": "}{"}}', "complete", "f", '{"a": "}{"}'),
        (
            '  {"arguments": {"a": [1, {"b": 2}]}, "name": "g", "extra": 3}',
            "complete",
            "g",
            '{"a": [1, {"b": 2}]}',
        ),
        ('{"name": "f"}', "complete", "f", "{}"),
        ('{"name": "f", "arguments": {"a": tru', "partial", "f", '{"a": tru'),
        ('{"name": "f', "partial", None, ""),
        ("", "partial", None, ""),
        ('{"name": "f", "arguments": [1]}', "invalid", "f", ""),
        ('{"name": "f", "arguments": {"a": 1]}', "invalid", "f", ""),
        ('{"arguments": {}}', "invalid", None, "{}"),
        ("[1]", "invalid", None, ""),
        # another key's value is JSON too: its brackets alone were read (found by a longer fuzz)
        ('{"name": "f", "arguments": {}, "id": nul}', "invalid", "f", "{}"),
        ('{"name": "f", "x": [1 2], "arguments": {}}', "invalid", "f", ""),
        ('{"name": "f", "x": "\\q"}', "invalid", "f", ""),
    ],
)
def test_scan_tool_call(text, status, name, arguments):
    scan = scan_tool_call(text)
    assert (scan.status, scan.name, scan.arguments) == (status, name, arguments)
    if status == "complete":
        assert scan.end == len(text)


@pytest.mark.parametrize("where", ["arguments", "other key"])
def test_a_call_nested_past_the_decoders_depth_is_invalid_not_an_error(where):
    """A model's output of 100,000 open brackets inside a call raised RecursionError from the
    JSON decoder out of the scanner, which every JSON tool parser calls on the model's text."""
    deep = "[" * 100_000 + "]" * 100_000
    value = f'{{"a": {deep}}}, "x": 1' if where == "arguments" else f'{{}}, "x": {deep}'
    assert scan_tool_call(f'{{"name": "f", "arguments": {value}}}').status == "invalid"


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab"\\{}[]\n é\x01'),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(st.text(max_size=3), _JSON, max_size=3),
    st.text(alphabet='}]"\\ x', max_size=3),
    st.data(),
)
def test_a_call_scanned_as_it_grows_with_a_memo_reads_as_scanned_fresh(arguments, tail, data):
    """A stream scans a call again at every piece, the arguments resumed from a ``ScanMemo``
    (reading them from their start each time made a long call quadratic): every prefix, however
    the pieces fall, scans as it does fresh; the whole call's arguments are the JSON sent."""
    text = json.dumps({"name": "f", "arguments": arguments}, ensure_ascii=data.draw(st.booleans()))
    memo, end = ScanMemo(), 0
    for piece in data.draw(st.lists(st.integers(1, 6), max_size=len(text))) + [len(text) + 9]:
        end = min(end + piece, len(text) + len(tail))
        grown = (text + tail)[:end]
        assert scan_tool_call(grown, memo=memo) == scan_tool_call(grown), grown
    whole = scan_tool_call(text, memo=ScanMemo())
    assert whole.status == "complete" and json.loads(whole.arguments) == arguments


def test_a_memo_of_another_text_is_ignored():
    memo = ScanMemo()
    scan_tool_call('{"name": "f", "arguments": {"a": "xyz', memo=memo)
    other = '{"name": "f", "arguments": {"b": 1}}'
    assert scan_tool_call(other, memo=memo) == scan_tool_call(other)


def test_the_command_lines_help_names_installed_parsers_third_parties_included(tmp_path, monkeypatch):
    """--tool-call-parser's help gave fixed examples ("e.g. hermes, llama3_json") and --policy's
    none: a third party's plugin, installed, was named only by the error for an unknown name
    (found by a probe writing plugins)."""
    from minisgl_core.cli import build_parser

    (tmp_path / "fake_parsers.py").write_text(PARSERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins = Plugins.load(
        entry_points=[metadata.EntryPoint("fake-parsers", "fake_parsers", "minisgl.plugins")]
    )
    serve = build_parser(plugins)._subparsers._group_actions[0].choices["serve"]
    helps = {a.dest: a.help for a in serve._actions}
    assert helps["tool_call_parser"].endswith("(installed: bracket)"), helps["tool_call_parser"]
    assert helps["reasoning_parser"].endswith("(installed: thought)"), helps["reasoning_parser"]
    assert helps["policy"].endswith("(none installed)"), helps["policy"]
    installed = build_parser()._subparsers._group_actions[0].choices["serve"]
    helps = {a.dest: a.help for a in installed._actions}
    assert "hermes" in helps["tool_call_parser"] and "lpm" in helps["policy"], helps


BROKEN_PARSERS = """
from minisgl_core.api import StreamingToolParser, TagReasoningParser, hookimpl

MINISGL_API = "2.5"
OPTIONS = {}


class Thought(TagReasoningParser):
    def __init__(self):
        super().__init__()
        # (the docs' way to configure a parser: read what minisgl_process_start stored)
        if "role" not in OPTIONS:
            raise RuntimeError("built before minisgl_process_start")
        raise RuntimeError("reasoning parser bug")


class Calls(StreamingToolParser):
    def __init__(self, tools):
        super().__init__(tools)
        OPTIONS["tools"] = tools
        raise KeyError("no_such_option")

    def advance(self, final):
        pass


@hookimpl
def minisgl_register_tool_parsers(register):
    register("t44-calls", "minisgl_t44parsers:Calls")


@hookimpl
def minisgl_register_reasoning_parsers(register):
    register("t44-thought", "minisgl_t44parsers:Thought")


@hookimpl
def minisgl_process_start(ctx):
    OPTIONS["role"] = ctx.role
"""


@pytest.mark.parametrize(
    ("flag", "name", "what"),
    [
        ("--reasoning-parser", "t44-thought", "reasoning parser 't44-thought'"),
        ("--tool-call-parser", "t44-calls", "tool call parser 't44-calls'"),
    ],
)
def test_a_parser_whose_constructor_raises_stops_the_start(tmp_path, install_plugin_module, flag, name, what):
    """The server builds a parser per choice: one whose constructor raised started a server that
    looked healthy and failed every chat request with a 500 (a probe writing a plugin). It is built
    once at start-up now, after the API process's ``minisgl_process_start`` (a parser reading its
    options finds them), and the start stops before any worker, naming the plugin."""
    import os

    from minisgl_core.testing.cli_runner import run_cli

    install_plugin_module("minisgl_t44parsers", "minisgl-t44parsers", BROKEN_PARSERS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = run_cli(["serve", "--model", "demo", "--port", "0", flag, name], env=env, timeout=60)
    bug = "RuntimeError: reasoning parser bug" if "reasoning" in flag else "KeyError: 'no_such_option'"
    cls = "Thought" if "reasoning" in flag else "Calls"
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        f"minisgl: error: {what} (plugin 't44parsers', minisgl-t44parsers 0.1.0) failed in "
        f"{cls}.__init__: {bug} (its traceback: --log-level debug)"
    ), proc.stderr
    assert "scheduler" not in proc.stderr  # (no worker started)


# ---------------------------------------------------------------- streamed as parsed whole

OFFERED = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("get_weather", "get_time")
]
HERMES_GOOD = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
#: (parser, output): valid calls, malformed JSON inside the markers, outputs cut off inside a call
#: or a marker, text around and between calls
STREAM_CASES = [
    (HermesToolParser, f"Let me check.\n{HERMES_GOOD}"),
    (HermesToolParser, f"{HERMES_GOOD}\n{HERMES_GOOD.replace('Paris', 'Rome')}\nDone."),
    (HermesToolParser, '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"</tool_call>'),
    (HermesToolParser, '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"</tool_call> after'),
    (HermesToolParser, '<tool_call>{"name": "get_weather", "arguments": {bad}}</tool_call>'),
    (
        HermesToolParser,
        'Hm. <tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call> ok',
    ),
    (
        HermesToolParser,
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>\nDone.',
    ),
    (HermesToolParser, '<tool_call>{"name": "get_weather", "arguments": {"a": 1} junk</tool_call>'),
    (HermesToolParser, '<tool_call>{"name": "get_weather", "arguments": {"a": [1}}</tool_call>'),
    (HermesToolParser, '<tool_call>{"name": "get_weather", "arguments": {"a": 1}}} junk</tool_call> ok'),
    (
        HermesToolParser,
        f'<tool_call>{{"name": "get_weather", "arguments": {{}}}} x</tool_call>\n{HERMES_GOOD}',
    ),
    (HermesToolParser, '<tool_call>{"name": "get_weather", "arguments": {"a": 1}}\n</tool_'),
    (HermesToolParser, f'<tool_call>{{"name": "get_time", "arguments": {{x}}}}</tool_call>\n{HERMES_GOOD}'),
    (HermesToolParser, f"{HERMES_GOOD}\n<tool_call>not json</tool_call>\n{HERMES_GOOD}"),
    (
        HermesToolParser,
        '<tool_call>{"name": "get_weather", "arguments": {"note": "</tool_call>"}}</tool_call>',
    ),
    (HermesToolParser, '<tool_call>{"name": "delete_all", "arguments": {}}</tool_call> and more'),
    # the last "name" key wins, the first not being offered (a review's find)
    (HermesToolParser, '<tool_call>{"name": "nope", "name": "get_weather", "arguments": {}}</tool_call>'),
    # cut off after a close marker written inside a finished string: a call with its arguments so far
    (
        HermesToolParser,
        '<tool_call>{"name": "get_weather", "arguments": {"note": "</tool_call>", "city": "Pa',
    ),
    (HermesToolParser, '<tool_call>{"name": "get_weather", "arguments": {"note": "a\\"</tool_call>", "c'),
    (HermesToolParser, 'Checking: <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'),
    (HermesToolParser, 'Checking: <tool_call>\n{"name": "get_wea'),
    (HermesToolParser, "Checking: <tool_"),
    (HermesToolParser, "No calls here, {just: braces} and </tool_call>."),
    (Llama3JsonToolParser, '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    (Llama3JsonToolParser, '<|python_tag|>{"name": "get_time", "arguments": {"tz": "a;b"}}'),
    (
        Llama3JsonToolParser,
        '{"name": "get_weather", "parameters": {}}; {"name": "get_time", "parameters": {}}',
    ),
    (Llama3JsonToolParser, '{"name": "get_weather", "parameters": {"city": Paris}} and text'),
    (Llama3JsonToolParser, '{"name": "get_weather", "parameters": {bad}}'),
    (
        Llama3JsonToolParser,
        '{"name": "get_weather", "parameters": {}}; {"name": "get_time", "parameters": {x}}',
    ),
    (Llama3JsonToolParser, '{"name": "get_weather", "parameters": {"city": "Pa'),
    (Llama3JsonToolParser, '{"name": "get_weather", "parameters": {}}; hello'),
    (Llama3JsonToolParser, '{"name": "get_weather", "parameters": {}}; '),
    (Llama3JsonToolParser, "It is sunny {today}."),
]


def _parsed(parser_cls, text):
    whole = parser_cls(OFFERED).parse(text)
    return whole.content or "", [(c.name, c.arguments) for c in whole.tool_calls]


def _streamed(parser_cls, text, cuts):
    parser, content, deltas, start = parser_cls(OFFERED), "", [], 0
    for end in [*sorted(cuts), len(text)]:
        out = parser.feed(text[start:end])
        content, deltas, start = content + out.content, deltas + out.tool_calls, end
    last = parser.finish()
    return content + last.content, [
        (c.name, c.arguments) for c in merge_tool_deltas(deltas + last.tool_calls)
    ]


@pytest.mark.parametrize(("parser_cls", "text"), STREAM_CASES)
def test_a_json_tool_call_stream_split_anywhere_gives_what_parse_gives(parser_cls, text):
    """The stream sent a call's arguments as they grew, before the call was known to be valid: a
    malformed one went out as a call with broken arguments (and its text was lost or leaked into
    content) where the whole answer kept it as content. Cut once anywhere, and at every character."""
    expected = _parsed(parser_cls, text)
    for cuts in [[cut] for cut in range(len(text) + 1)] + [list(range(1, len(text)))]:
        assert _streamed(parser_cls, text, cuts) == expected, cuts


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(STREAM_CASES), st.data())
def test_a_json_tool_call_stream_in_random_pieces_gives_what_parse_gives(case, data):
    parser_cls, text = case
    cuts = data.draw(st.sets(st.integers(0, len(text))), label="cuts")
    assert _streamed(parser_cls, text, cuts) == _parsed(parser_cls, text)


@pytest.mark.parametrize(
    ("parser_cls", "text"),
    [
        (HermesToolParser, '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"</tool_call>'),
        (HermesToolParser, '<tool_call>{"name": "get_weather", "arguments": {bad}}</tool_call>'),
        (
            HermesToolParser,
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>',
        ),
        (Llama3JsonToolParser, '{"name": "get_weather", "parameters": {"city": Paris}} and text'),
        # malformed outside the arguments: a call with '{"city": "Paris"}' (found by a longer fuzz)
        (
            HermesToolParser,
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}, "id": nul}</tool_call>',
        ),
        (Llama3JsonToolParser, '{"name": "get_weather", "x": [1 2], "parameters": {}}'),
    ],
)
def test_a_malformed_json_tool_call_is_content_whole_and_streamed(parser_cls, text):
    """Malformed JSON inside a call (even where the close marker cuts its arguments short) is the
    raw text as content and no call: the whole answer made the first a call with arguments
    '{"city": "Paris"', the stream made every one a call."""
    assert _parsed(parser_cls, text) == (text, [])
    assert _streamed(parser_cls, text, range(1, len(text))) == (text, [])


def test_streamed_json_tool_calls_are_valid_calls_with_their_ids_and_indices():
    """Held back until whole, a call still goes out named once, first, with a fresh id per index."""
    text = f"Sure.\n{HERMES_GOOD}\n{HERMES_GOOD.replace('Paris', 'Rome')}"
    parser, deltas = HermesToolParser(OFFERED), []
    for char in text:
        deltas += parser.feed(char).tool_calls
    deltas += parser.finish().tool_calls
    named = [d for d in deltas if d.name is not None]
    assert [(d.index, d.name) for d in named] == [(0, "get_weather"), (1, "get_weather")]
    assert all(d.id and d.id.startswith("call_") for d in named) and named[0].id != named[1].id
    assert all(d.id is None for d in deltas if d not in named)
    calls = merge_tool_deltas(deltas)
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Paris"}, {"city": "Rome"}]


def test_a_cut_off_call_with_a_close_marker_in_a_string_keeps_its_arguments_so_far():
    text = '<tool_call>{"name": "get_weather", "arguments": {"note": "</tool_call>", "city": "Pa'
    expected = ("", [("get_weather", '{"note": "</tool_call>", "city": "Pa')])
    assert _parsed(HermesToolParser, text) == expected
    assert _streamed(HermesToolParser, text, range(1, len(text))) == expected


def test_a_separator_no_call_follows_stays_in_the_content():
    """llama3_json: the ``;`` after a call was dropped when plain text followed it (a review's
    find): content " hello" for "...}; hello"."""
    text = '{"name": "get_weather", "parameters": {}}; hello'
    assert _parsed(Llama3JsonToolParser, text) == ("; hello", [("get_weather", "{}")])
    # one that ends the output is the calls' punctuation, not content (the fix above made it ';',
    # where vLLM has no content: the next review's find), streamed too
    for text in (
        '{"name": "get_weather", "parameters": {}};',
        '{"name": "get_weather", "parameters": {}}; \n',
    ):
        assert _parsed(Llama3JsonToolParser, text) == ("", [("get_weather", "{}")])
        assert Llama3JsonToolParser(OFFERED).parse(text).content is None
        for cuts in [range(1, len(text)), *([cut] for cut in range(len(text) + 1))]:
            assert _streamed(Llama3JsonToolParser, text, cuts) == ("", [("get_weather", "{}")]), cuts
