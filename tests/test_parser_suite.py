"""The parser suites catch what they are for: each mutant of a first-party parser fails the
test named for its mistake, and the unmutated parsers pass (the plugins' own test modules run the
whole suites on them)."""

from __future__ import annotations

import pytest
from minisgl_plugin_hermes.parser import HermesToolParser
from minisgl_plugin_qwen3_reasoning.parser import Qwen3ReasoningParser

from minisgl_core.api import ReasoningDelta, ToolCall, ToolParseResult, ToolStreamDelta
from minisgl_core.testing.parser_suite import ReasoningParserSuite, ToolParserSuite

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SAMPLES = [(f"Checking.\n{CALL}", "Checking.", [("get_weather", {"city": "Paris"})])]


class DropsOneCharacterPieces(HermesToolParser):
    """Streamed, content that arrives one character at a time is lost (whole, nothing is)."""

    def feed(self, text: str) -> ToolStreamDelta:
        out = super().feed(text)
        return ToolStreamDelta("", out.tool_calls) if len(text) == 1 else out


class OneId(HermesToolParser):
    def parse(self, text: str) -> ToolParseResult:
        result = super().parse(text)
        return ToolParseResult(
            result.content, [ToolCall("call_" + "0" * 24, c.name, c.arguments) for c in result.tool_calls]
        )


class StripsContent(HermesToolParser):
    def parse(self, text: str) -> ToolParseResult:
        result = super().parse(text)
        return ToolParseResult(result.content.strip() if result.content else None, result.tool_calls)


class SharedBuffer(Qwen3ReasoningParser):
    """State on the class: every instance shares one buffer."""

    shared: list[str] = []

    def feed(self, text: str) -> ReasoningDelta:
        SharedBuffer.shared.append(text)
        return super().feed("".join(SharedBuffer.shared) if len(SharedBuffer.shared) > 1 else text)


TOOL_MUTANTS = [
    (DropsOneCharacterPieces, "test_a_stream_split_anywhere_gives_what_parse_gives", "streamed in pieces"),
    (OneId, "test_calls_have_distinct_openai_ids_and_json_object_arguments", "id 'call_0+'"),
    (StripsContent, "test_plain_text_is_content", "leading and trailing spaces"),
]


@pytest.mark.parametrize(
    ("parser", "test_name", "message"), TOOL_MUTANTS, ids=[m[0].__name__ for m in TOOL_MUTANTS]
)
def test_tool_suite_catches(parser, test_name: str, message: str) -> None:
    class Suite(ToolParserSuite):
        parser_cls = parser
        samples = [
            *SAMPLES,
            ("<tool_call>" + CALL[11:] + "\n" + CALL, None, [("get_weather", {"city": "Paris"})] * 2),
        ]

    with pytest.raises(AssertionError, match=message):
        getattr(Suite(), test_name)()


def test_reasoning_suite_catches_state_shared_between_parsers() -> None:
    class Suite(ReasoningParserSuite):
        parser_cls = SharedBuffer
        samples = [("<think>a</think>b", "a", "b")]

    SharedBuffer.shared.clear()
    with pytest.raises(AssertionError):
        Suite().test_a_stream_split_anywhere_gives_what_parse_gives()


def test_a_suite_without_samples_says_so() -> None:
    class Suite(ToolParserSuite):
        parser_cls = HermesToolParser

    with pytest.raises(TypeError, match="must set samples"):
        Suite().test_samples_parse_to_their_content_and_calls()
