"""``StreamingToolParser`` (API 2.5), the scaffold a format writes one method of: a parser built on
it passes the conformance kit's tool-parser suite, and the scaffold's own rules (whitespace next
to calls, call indexes and ids, offered names) hold whole and streamed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from minisgl_core.api import StreamingToolParser, ToolParser, ToolParseResult
from minisgl_core.testing.parser_suite import WEATHER_TOOLS, ToolParserSuite

_CALL = re.compile(r"CALL (\w+) (\{.*\})")


class LineCalls(StreamingToolParser):
    """A format for the test: a line ``CALL name {arguments}`` is a call, any other line content."""

    def advance(self, final: bool) -> None:
        while "\n" in self.buffer or (final and self.buffer):
            line, newline, self.buffer = self.buffer.partition("\n")
            call = _CALL.fullmatch(line)
            if call and self.offered(call[1]) and _is_object(call[2]):
                self.take_held_whitespace()
                self.emit_call(call[1], call[2])
            else:
                self.emit_content(line + newline)


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


ONE = 'Let me check.\nCALL get_weather {"city": "Paris"}\n'
TWO = 'CALL get_weather {"city": "Paris"}\nCALL get_weather {"city": "Rome"}'
MALFORMED = 'CALL get_weather {"city": }\nsorry'
NOT_OFFERED = 'CALL delete_everything {}\nCALL get_weather {"city": "Oslo"}'


class TestLineCallsConformance(ToolParserSuite):
    parser_cls = LineCalls
    samples = [
        (ONE, "Let me check.", [("get_weather", {"city": "Paris"})]),
        (TWO, None, [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]),
        (MALFORMED, MALFORMED, []),
    ]
    more_outputs = [NOT_OFFERED, "\n\n" + ONE + "\n\n"]


def test_it_is_a_tool_parser_and_advance_must_be_written():
    assert issubclass(LineCalls, ToolParser)
    with pytest.raises(TypeError, match="advance"):
        type("NoAdvance", (StreamingToolParser,), {})()


def test_calls_are_numbered_with_new_ids_and_counted():
    parser = LineCalls(WEATHER_TOOLS)
    first = parser.feed(TWO[: TWO.index("\n") + 1])
    assert parser.calls_sent == 1 and first.content == ""
    [delta] = first.tool_calls
    assert (delta.index, delta.name, delta.arguments) == (0, "get_weather", '{"city": "Paris"}')
    assert delta.id.startswith("call_") and len(delta.id) == 29
    assert parser.feed(TWO[TWO.index("\n") + 1 :]).tool_calls == []  # a line still growing: held
    [second] = parser.finish().tool_calls
    assert second.index == 1 and parser.calls_sent == 2 and second.id != delta.id


def test_whitespace_is_held_and_dropped_next_to_calls_only():
    parser = LineCalls(WEATHER_TOOLS)
    assert parser.feed("Hello.\n").content == "Hello."  # the newline held: a call may follow
    assert parser.feed("more\n").content == "\nmore"  # content followed: it was content
    assert parser.finish().content == "\n"  # no call came: trailing whitespace is content
    assert LineCalls(WEATHER_TOOLS).parse(ONE).content == "Let me check."  # next to a call: not


def test_a_function_not_offered_is_content_and_no_tools_offers_any():
    result = LineCalls(WEATHER_TOOLS).parse(NOT_OFFERED)
    assert result.content == "CALL delete_everything {}" and [c.name for c in result.tool_calls] == [
        "get_weather"
    ]
    assert [c.name for c in LineCalls().parse(NOT_OFFERED).tool_calls] == ["delete_everything", "get_weather"]
    assert LineCalls(WEATHER_TOOLS).offered_names == {"get_weather"}


def _documented_line_calls() -> type[StreamingToolParser]:
    """docs/plugins.md's example of a StreamingToolParser, run as it is written there."""
    doc = (Path(__file__).parent.parent / "docs" / "plugins.md").read_text()
    start = doc.index("```python\ndef json_object") + len("```python\n")
    namespace: dict = {"json": json, "re": re, "StreamingToolParser": StreamingToolParser}
    exec(doc[start : doc.index("```", start)], namespace)
    return namespace["LineCalls"]


class TestTheDocumentedExample(ToolParserSuite):
    """Found: the example sent ``CALL f {oops}`` as a call whose arguments were no JSON, and ran
    the text either side of a call together (``Sure.Done.``)."""

    parser_cls = _documented_line_calls()
    samples = [
        (
            'Sure.\nCALL get_weather {"city": "Paris"}\nDone.',
            "Sure.\nDone.",
            [("get_weather", {"city": "Paris"})],
        ),
        (TWO, None, [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]),
        (ONE, "Let me check.", [("get_weather", {"city": "Paris"})]),
        (MALFORMED, MALFORMED, []),
        ("CALL get_weather {oops}\nsorry", "CALL get_weather {oops}\nsorry", []),
    ]
    more_outputs = [NOT_OFFERED, "\n\n" + ONE + "\n\n"]


def test_what_advance_leaves_in_the_buffer_at_the_end_is_content():
    """A format whose advance forgets the buffer at the end (waiting for a line that never ends)
    lost that text silently; the scaffold hands it over as content."""

    class Forgetful(StreamingToolParser):
        def advance(self, final: bool) -> None:
            while "\n" in self.buffer:
                line, newline, self.buffer = self.buffer.partition("\n")
                self.emit_content(line + newline)

    assert Forgetful().parse("one\ntwo") == ToolParseResult("one\ntwo", [])
    parser = Forgetful()
    assert parser.feed("one\ntw").content == "one"
    assert parser.finish().content == "\ntw"
