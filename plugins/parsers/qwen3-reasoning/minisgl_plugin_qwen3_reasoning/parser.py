"""Qwen3's thinking: ``<think>…</think>`` opening the answer becomes ``reasoning_content``.

With ``chat_template_kwargs={"enable_thinking": false}`` Qwen3's template writes an empty
``<think></think>`` into the prompt itself, so the answer opens without one: all content.
"""

from minisgl_core.api import TagReasoningParser


class Qwen3ReasoningParser(TagReasoningParser):
    start_tag = "<think>"
    end_tag = "</think>"
