"""The Qwen3 and DeepSeek-R1 reasoning parsers: whole and streamed at every split."""

from __future__ import annotations

import pytest
from minisgl_plugin_qwen3_reasoning.parser import DeepSeekR1ReasoningParser, Qwen3ReasoningParser

from minisgl_core.api import ReasoningResult
from minisgl_core.testing.packaging_suite import PluginPackagingSuite
from minisgl_core.testing.parser_suite import ReasoningParserSuite

THINKING = "<think>\nThe user greets me; <b>answer</b> kindly.\n</think>\n\nHello! How can I help?"
NOT_THINKING = "Hello! <think> is only a word here."
UNFINISHED = "<think>\nLet me count: 1, 2, 3"


def stream(text: str, cuts: list[int]) -> tuple[str, str]:
    """(reasoning, content) of ``text`` fed in pieces ending at ``cuts``: the conformance suite's."""
    return TestQwen3ReasoningConformance().stream(text, cuts)


def test_thinking_is_split_off():
    assert Qwen3ReasoningParser().parse(THINKING) == ReasoningResult(
        "\nThe user greets me; <b>answer</b> kindly.\n", "Hello! How can I help?"
    )


def test_no_think_block_is_all_content():
    assert Qwen3ReasoningParser().parse(NOT_THINKING) == ReasoningResult(None, NOT_THINKING)


def test_unfinished_thinking_is_all_reasoning():
    assert Qwen3ReasoningParser().parse(UNFINISHED) == ReasoningResult("\nLet me count: 1, 2, 3", None)


@pytest.mark.parametrize("text", [THINKING, NOT_THINKING, UNFINISHED, "<think></think>Hi"])
def test_stream_split_anywhere_matches_parse(text):
    whole = Qwen3ReasoningParser().parse(text)
    expected = (whole.reasoning or "", whole.content or "")
    for cut in range(len(text) + 1):
        assert stream(text, [cut]) == expected, cut
    assert stream(text, list(range(1, len(text)))) == expected


class TestQwen3ReasoningPackaging(PluginPackagingSuite):
    plugin = "qwen3-reasoning"
    provides = {"reasoning_parsers": ["qwen3", "deepseek_r1"]}


class TestQwen3ReasoningConformance(ReasoningParserSuite):
    """The conformance kit's reasoning-parser suite, as a third party's parser would run it."""

    parser_cls = "qwen3"
    samples = [
        (THINKING, "\nThe user greets me; <b>answer</b> kindly.\n", "Hello! How can I help?"),
        (UNFINISHED, "\nLet me count: 1, 2, 3", None),
        (NOT_THINKING, None, NOT_THINKING),
    ]


R1_ANSWER = "Let me think.</think>The answer is 4."  # the prompt opened <think>: the output is inside


def test_deepseek_r1_output_begins_inside_the_reasoning():
    """deepseek_r1 was Qwen3's parser: an output closing a reasoning it did not open was all
    content, "</think>" included; as vLLM's and SGLang's, it begins inside the reasoning."""

    def parse(text: str) -> ReasoningResult:
        return DeepSeekR1ReasoningParser().parse(text)

    assert parse(R1_ANSWER) == ReasoningResult("Let me think.", "The answer is 4.")
    assert parse("\nStill thinking, cut off") == ReasoningResult("\nStill thinking, cut off", None)
    # an output that opens <think> itself is read as Qwen3's
    assert parse(THINKING) == Qwen3ReasoningParser().parse(THINKING)
    assert parse("<think></think>Hi") == ReasoningResult(None, "Hi")


def test_deepseek_r1_start_tag_fed_by_the_server_is_not_doubled():
    """Where the prompt ends with <think>, the server feeds the tag first (ChoiceOutput's
    reasoning_opened): the parser reads it as the output's own opening, not as reasoning text."""
    parser = DeepSeekR1ReasoningParser()
    parser.feed("<think>")
    assert parser.parse(R1_ANSWER) == ReasoningResult("Let me think.", "The answer is 4.")


class TestDeepSeekR1ReasoningConformance(ReasoningParserSuite):
    parser_cls = "deepseek_r1"
    samples = [
        (R1_ANSWER, "Let me think.", "The answer is 4."),
        ("Let me count: 1, 2, 3", "Let me count: 1, 2, 3", None),
        ("</think>\n\nHello!", None, "Hello!"),  # no reasoning
        (THINKING, "\nThe user greets me; <b>answer</b> kindly.\n", "Hello! How can I help?"),
        ("  <thin", "  <thin", None),  # a part of the tag only
    ]
