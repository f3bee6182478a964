"""Conformance suites for output parsers: subclass one in a test module and set the parser class
and a few outputs of your format with what they should give::

    from minisgl_core.testing.parser_suite import ToolParserSuite

    class TestMyToolParser(ToolParserSuite):
        parser_cls = "mine"      # a registered name, "module:Class", or the class itself
        samples = [              # (model output, content or None, [(name, arguments), ...])
            ('<call>{"name": "get_weather", "arguments": {"city": "Paris"}}</call>', None,
             [("get_weather", {"city": "Paris"})]),
        ]

Every sample is parsed whole and streamed split at every character boundary (one cut at each, and
one character at a time), and so is every beginning of it (an output that max_tokens or a stop
string cut off): the stream's content and its merged tool-call deltas must equal :meth:`parse`'s,
calls' arguments must be JSON objects, ids distinct and in OpenAI's shape, and text with nothing
of the format in it must stay content. ``more_outputs`` (malformed calls, calls to functions not
offered: whatever a format's own tests look at) are streamed split anywhere too; a format's tests
can stream with the suite's :meth:`ToolParserSuite.stream` (``TestMine().stream(text, cuts)``). :class:`ReasoningParserSuite` does the
same for reasoning parsers, with ``(output, reasoning or None, content or None)`` samples.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any, ClassVar

from minisgl_core.api import (
    ReasoningParser,
    ToolCall,
    ToolCallDelta,
    ToolParser,
    merge_tool_deltas,
)
from minisgl_core.testing.targets import build, resolve

#: a function offered by every request the suite makes (the samples' calls name it, or set ``tools``)
WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "the weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
#: text no tool-call or reasoning format takes as a call or as reasoning: content, whole and streamed
PLAIN_TEXTS = (
    "The weather in Paris is mild.",
    'Use {braces}, [brackets] and <angle> brackets;\n\nquotes " and \\ too.',
    "  leading and trailing spaces  ",
    "Emoji and accents: 🌤️ café",
)


def _cuts(text: str) -> list[list[int]]:
    """Where a stream of ``text`` is split: once at each boundary, and at every one."""
    return [[cut] for cut in range(len(text) + 1)] + [list(range(1, len(text)))]


class ToolParserSuite:
    """Tests every tool-call parser passes; set ``parser_cls`` and ``samples``."""

    #: the parser: its class, "package.module:Class", or a name registered by an installed plugin
    parser_cls: ClassVar[type[ToolParser] | str | None] = None
    #: (model output, its content or None, its calls as (name, arguments object)), in your format;
    #: give at least one output with a call and content around it, and one with two calls
    samples: ClassVar[Sequence[tuple[str, str | None, Sequence[tuple[str, Any]]]]] = ()
    #: the request's ``tools`` the parser is made with
    tools: ClassVar[list[dict[str, Any]]] = WEATHER_TOOLS
    #: outputs with nothing of the format in them (all content)
    plain_texts: ClassVar[Sequence[str]] = PLAIN_TEXTS
    #: more outputs to stream split anywhere against :meth:`parse` (malformed calls, ...)
    more_outputs: ClassVar[Sequence[str]] = ()

    # --- plumbing ---

    @classmethod
    def parser_class(cls) -> type[ToolParser]:
        if cls.parser_cls is None:
            raise TypeError(f"{cls.__name__} must set parser_cls")
        return resolve("tool_parsers", cls.parser_cls)

    @functools.cached_property
    def _resolved(self) -> type[ToolParser]:
        """The class, looked up once per test (a registered name loads the plugins: 30 ms)."""
        return self.parser_class()

    def make_parser(self) -> ToolParser:
        return build(self._resolved, self.tools)

    def stream(self, text: str, cuts: list[int]) -> tuple[str, list[ToolCall], list[ToolCallDelta]]:
        """``text`` fed in pieces ending at ``cuts``, then ``finish``: (content, merged calls, deltas)."""
        parser = self.make_parser()
        content, deltas, start = "", [], 0
        for end in [*cuts, len(text)]:
            out = parser.feed(text[start:end])
            content, deltas, start = content + out.content, deltas + list(out.tool_calls), end
        last = parser.finish()
        deltas += last.tool_calls
        return content + last.content, merge_tool_deltas(deltas), deltas

    def _with_samples(self) -> None:
        if not self.samples:
            raise TypeError(f"{type(self).__name__} must set samples: outputs of the parser's format")

    # --- tests ---

    def test_samples_parse_to_their_content_and_calls(self) -> None:
        self._with_samples()
        for text, content, calls in self.samples:
            result = self.make_parser().parse(text)
            assert result.content == content, f"content of {text!r}: {result.content!r}, expected {content!r}"
            got = [(c.name, json.loads(c.arguments)) for c in result.tool_calls]
            assert got == [(name, arguments) for name, arguments in calls], f"calls of {text!r}: {got}"

    def test_calls_have_distinct_openai_ids_and_json_object_arguments(self) -> None:
        self._with_samples()
        seen: set[str] = set()
        for text, _, _ in self.samples:
            for call in self.make_parser().parse(text).tool_calls:
                assert call.id.startswith("call_") and call.id not in seen, f"id {call.id!r} in {text!r}"
                seen.add(call.id)
                assert isinstance(json.loads(call.arguments), dict), (
                    f"arguments {call.arguments!r} of {text!r} are not a JSON object"
                )

    def test_plain_text_is_content(self) -> None:
        for text in self.plain_texts:
            result = self.make_parser().parse(text)
            assert (result.content, result.tool_calls) == (text, []), f"{text!r} gave {result}"
        result = self.make_parser().parse("")
        assert (result.content or "", result.tool_calls) == ("", []), f"an empty output gave {result}"

    def test_a_stream_split_anywhere_gives_what_parse_gives(self) -> None:
        self._with_samples()
        for text in [*(s[0] for s in self.samples), *self.plain_texts, *self.more_outputs]:
            whole = self.make_parser().parse(text)
            expected = (whole.content or "", [(c.name, c.arguments) for c in whole.tool_calls])
            for cuts in _cuts(text):
                content, calls, _ = self.stream(text, cuts)
                got = (content, [(c.name, c.arguments) for c in calls])
                assert got == expected, (
                    f"{text!r} streamed in pieces ending at {cuts}: {got}, parse: {expected}"
                )

    def test_an_output_cut_off_anywhere_parses_as_it_streams(self) -> None:
        """max_tokens or a stop string may end the output at any point, inside a call too: the
        whole answer and the stream must agree (a call whose name is complete is a call with its
        arguments so far; the hermes parser's whole answer made it content, its stream a call)."""
        self._with_samples()
        for sample, _, _ in self.samples:
            for end in range(len(sample) + 1):
                text = sample[:end]
                whole = self.make_parser().parse(text)
                expected = (whole.content or "", [(c.name, c.arguments) for c in whole.tool_calls])
                for cuts in ([], [end // 2], list(range(1, end))):
                    content, calls, _ = self.stream(text, cuts)
                    got = (content, [(c.name, c.arguments) for c in calls])
                    assert got == expected, (
                        f"{text!r} (cut off) streamed in pieces ending at {cuts}: {got}, parse: {expected}"
                    )

    def test_a_streamed_call_names_itself_once_before_its_arguments(self) -> None:
        self._with_samples()
        for text, _, _ in self.samples:
            _, _, deltas = self.stream(text, list(range(1, len(text))))
            named: set[int] = set()
            for delta in deltas:
                if delta.index not in named:
                    assert delta.id and delta.name, (
                        f"the first delta of call {delta.index} in {text!r}: {delta}"
                    )
                    named.add(delta.index)
                else:
                    assert delta.id is None and delta.name is None, f"call {delta.index} named twice: {delta}"

    def test_each_parser_keeps_its_own_state(self) -> None:
        """One instance per choice: a parser in the middle of a call must not leak into another."""
        self._with_samples()
        text = self.samples[0][0]
        first = self.make_parser()
        first.feed(text[: len(text) // 2])
        alone = self.make_parser().parse(text)
        again = self.make_parser().parse(text)
        assert [(c.name, c.arguments) for c in alone.tool_calls] == [
            (c.name, c.arguments) for c in again.tool_calls
        ]
        assert alone.content == again.content


class ReasoningParserSuite:
    """Tests every reasoning parser passes; set ``parser_cls`` and ``samples``."""

    #: the parser: its class, "package.module:Class", or a name registered by an installed plugin
    parser_cls: ClassVar[type[ReasoningParser] | str | None] = None
    #: (model output, its reasoning or None, its content or None), in your format; give one with
    #: both parts, one with reasoning cut off by the token limit, and one with no reasoning
    samples: ClassVar[Sequence[tuple[str, str | None, str | None]]] = ()

    @classmethod
    def parser_class(cls) -> type[ReasoningParser]:
        if cls.parser_cls is None:
            raise TypeError(f"{cls.__name__} must set parser_cls")
        return resolve("reasoning_parsers", cls.parser_cls)

    @functools.cached_property
    def _resolved(self) -> type[ReasoningParser]:
        return self.parser_class()

    def make_parser(self) -> ReasoningParser:
        return build(self._resolved)

    def stream(self, text: str, cuts: list[int]) -> tuple[str, str]:
        parser = self.make_parser()
        reasoning, content, start = "", "", 0
        for end in [*cuts, len(text)]:
            out = parser.feed(text[start:end])
            reasoning, content, start = reasoning + out.reasoning, content + out.content, end
        last = parser.finish()
        return reasoning + last.reasoning, content + last.content

    def _with_samples(self) -> None:
        if not self.samples:
            raise TypeError(f"{type(self).__name__} must set samples: outputs of the parser's format")

    def test_samples_parse_to_their_reasoning_and_content(self) -> None:
        self._with_samples()
        for text, reasoning, content in self.samples:
            result = self.make_parser().parse(text)
            assert (result.reasoning, result.content) == (reasoning, content), f"{text!r} gave {result}"

    def test_an_empty_output_has_neither_part(self) -> None:
        result = self.make_parser().parse("")
        assert (result.reasoning, result.content) == (None, None), f"an empty output gave {result}"

    def test_a_stream_split_anywhere_gives_what_parse_gives(self) -> None:
        self._with_samples()
        for text, _, _ in self.samples:
            whole = self.make_parser().parse(text)
            expected = (whole.reasoning or "", whole.content or "")
            for cuts in _cuts(text):
                got = self.stream(text, cuts)
                assert got == expected, (
                    f"{text!r} streamed in pieces ending at {cuts}: {got}, parse: {expected}"
                )

    def test_each_parser_keeps_its_own_state(self) -> None:
        self._with_samples()
        text = self.samples[0][0]
        self.make_parser().feed(text[: len(text) // 2])
        assert self.make_parser().parse(text) == self.make_parser().parse(text)
