"""Qwen3's thinking: ``<think>…</think>`` opening the answer becomes ``reasoning_content``.

With ``chat_template_kwargs={"enable_thinking": false}`` Qwen3's template writes an empty
``<think></think>`` into the prompt itself, so the answer opens without one: all content.

DeepSeek-R1 (and its distills) opens ``<think>`` in the prompt, so its answer usually begins
inside the reasoning: ``Let me think.</think>The answer.``. Its parser reads the answer as if it
began with ``<think>`` when it does not (vLLM's DeepSeekR1ReasoningParser, SGLang's deepseek-r1 with
force_reasoning): an answer without ``</think>`` is all reasoning.
"""

from minisgl_core.api import ReasoningDelta, TagReasoningParser


class Qwen3ReasoningParser(TagReasoningParser):
    start_tag = "<think>"
    end_tag = "</think>"


class DeepSeekR1ReasoningParser(Qwen3ReasoningParser):
    """The answer starts in the reasoning; one that opens with ``<think>`` (after whitespace) is
    read as Qwen3's. The server feeds ``<think>`` first where the prompt ended with it: the tag is
    then there, and not added again."""

    def __init__(self) -> None:
        super().__init__()
        #: the output so far while it may still open with start_tag; None once that is known
        self._opening: str | None = ""

    def feed(self, text: str) -> ReasoningDelta:
        if self._opening is None:
            return super().feed(text)
        self._opening += text
        if self.start_tag.startswith(self._opening.lstrip()):  # whitespace, or a part of the tag
            return ReasoningDelta()
        return super().feed(self._opened())

    def finish(self) -> ReasoningDelta:
        if self._opening is None:
            return super().finish()
        first, last = super().feed(self._opened()), super().finish()
        return ReasoningDelta(first.reasoning + last.reasoning, first.content + last.content)

    def _opened(self) -> str:
        """The output held so far, opening with start_tag (added unless it is there)."""
        opening, self._opening = self._opening or "", None
        return opening if opening.lstrip().startswith(self.start_tag) else self.start_tag + opening
