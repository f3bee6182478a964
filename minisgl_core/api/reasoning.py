"""Reasoning parsers: separating a reasoning model's thinking from its answer.

A :class:`ReasoningParser` is made per choice of a chat request when the server runs with
``--reasoning-parser NAME``. :meth:`ReasoningParser.parse` splits a whole output into
``reasoning_content`` and ``content``; streaming, :meth:`ReasoningParser.feed` and
:meth:`ReasoningParser.finish` answer deltas of both. The content part then goes on to the tool
parser, if the request offered tools.

:class:`TagReasoningParser` implements the usual shape, reasoning between a start and an end tag
at the beginning of the output (Qwen3's ``<think>…</think>``); a plugin sets two attributes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from minisgl_core.api.json_scan import marker_prefix_length


@dataclass(frozen=True)
class ReasoningResult:
    reasoning: str | None
    content: str | None


@dataclass(frozen=True)
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""


class ReasoningParser(ABC):
    """One choice's reasoning parser. Use an instance either for :meth:`parse` or for a stream."""

    @abstractmethod
    def parse(self, text: str) -> ReasoningResult:
        """Split the complete output; a part that is absent or empty is None."""

    @abstractmethod
    def feed(self, text: str) -> ReasoningDelta:
        """Take the next piece of output; return what can be sent now."""

    @abstractmethod
    def finish(self) -> ReasoningDelta:
        """The output ended: return whatever was held back."""


class TagReasoningParser(ReasoningParser):
    """Reasoning is the text between ``start_tag`` (which must open the output, after whitespace)
    and ``end_tag``; the rest is content, without the whitespace right after ``end_tag``. Output
    that does not open with ``start_tag`` is all content; an unclosed one is all reasoning (the
    model ran out of tokens while thinking)."""

    start_tag: str = "<think>"
    end_tag: str = "</think>"

    def __init__(self) -> None:
        self._mode = "start"  # start -> reasoning -> after_end -> content
        self._buffer = ""

    def parse(self, text: str) -> ReasoningResult:
        first, last = self.feed(text), self.finish()
        reasoning = first.reasoning + last.reasoning
        content = first.content + last.content
        return ReasoningResult(reasoning or None, content or None)

    def feed(self, text: str) -> ReasoningDelta:
        self._buffer += text
        return self._run(final=False)

    def finish(self) -> ReasoningDelta:
        return self._run(final=True)

    def _run(self, final: bool) -> ReasoningDelta:
        reasoning, content = "", ""
        if self._mode == "start":
            head = self._buffer.lstrip()
            if head.startswith(self.start_tag):
                self._buffer, self._mode = head[len(self.start_tag) :], "reasoning"
            elif self.start_tag.startswith(head) and not final:
                return ReasoningDelta()
            else:
                self._mode = "content_only"
        if self._mode == "reasoning":
            where = self._buffer.find(self.end_tag)
            if where >= 0:
                reasoning = self._buffer[:where]
                self._buffer, self._mode = self._buffer[where + len(self.end_tag) :], "after_end"
            else:
                keep = 0 if final else marker_prefix_length(self._buffer, self.end_tag)
                reasoning = self._buffer[: len(self._buffer) - keep]
                self._buffer = self._buffer[len(self._buffer) - keep :]
        if self._mode == "after_end":
            self._buffer = self._buffer.lstrip()
            if self._buffer:
                self._mode = "content"
        if self._mode in ("content", "content_only"):
            content, self._buffer = self._buffer, ""
        return ReasoningDelta(reasoning, content)
