"""Every option of the command line says what it does, and what it is when not given."""

from __future__ import annotations

import argparse

import pytest

from minisgl_core.cli import build_parser

SUBCOMMANDS = ("plugins", "generate", "serve", "shell", "bench")
BENCH_KINDS = ("offline", "serve", "grammar", "cpu", "make-model")


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a for a in parser._actions if not isinstance(a, (argparse._SubParsersAction, argparse._HelpAction))
    ]


@pytest.fixture(scope="module")
def parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands = {"minisgl": parser, **{name: sub.choices[name] for name in SUBCOMMANDS}}
    kinds = next(a for a in commands["bench"]._actions if isinstance(a, argparse._SubParsersAction))
    return {**commands, **{f"bench {kind}": kinds.choices[kind] for kind in BENCH_KINDS}}


@pytest.mark.parametrize("command", ["minisgl", *SUBCOMMANDS, *(f"bench {kind}" for kind in BENCH_KINDS)])
def test_every_option_has_help(parsers, command):
    missing = [a.option_strings or [a.dest] for a in options(parsers[command]) if not a.help]
    assert missing == [], f"minisgl {command}: no help text for {missing}"


@pytest.mark.parametrize("command", ["minisgl", "plugins", "generate"])
def test_every_option_with_a_default_shows_it(parsers, command):
    """The engine's options (generate's, as serve's and shell's) and the command's own: a default
    that is a value (not None, off or empty) is in the help as formatted, e.g. "(default: 8192)"."""
    parser = parsers[command]
    hidden = []
    for action in options(parser):
        if action.default in (None, False, [], "", argparse.SUPPRESS):
            continue
        shown = parser._get_formatter()._expand_help(action)
        if "default" not in shown or str(action.default) not in shown:
            hidden.append((action.option_strings, action.default, shown))
    assert hidden == []
