"""The Qwen3 reasoning parser: whole and streamed at every split."""

from __future__ import annotations

import pytest
from minisgl_plugin_qwen3_reasoning.parser import Qwen3ReasoningParser

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
