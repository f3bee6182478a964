"""The parser plugin kinds: minisgl_register_tool_parsers and minisgl_register_reasoning_parsers
fill their registries, a new format is a few class attributes, and bad names say what to install."""

from __future__ import annotations

import json
from importlib import metadata

import pytest

from minisgl_core.api import ReasoningParser, ReasoningResult, ToolParser, scan_tool_call
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
    # vLLM's name for the same tags
    assert plugins.resolve("reasoning_parsers", "deepseek_r1") is plugins.resolve(
        "reasoning_parsers", "qwen3"
    )
    with pytest.raises(
        PluginError, match=r"unknown --tool-call-parser 'mistral'; installed: hermes, llama3_json"
    ):
        plugins.resolve("tool_parsers", "mistral")
    with pytest.raises(PluginError, match="minisgl-plugin-granite-reasoning"):
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
    ],
)
def test_scan_tool_call(text, status, name, arguments):
    scan = scan_tool_call(text)
    assert (scan.status, scan.name, scan.arguments) == (status, name, arguments)
    if status == "complete":
        assert scan.end == len(text)


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
