"""One chat choice's text turned into OpenAI's message: reasoning split off first (with
``--reasoning-parser``), then tool calls read from the rest (when the request offers tools),
either from the whole text or delta by delta while streaming."""

from __future__ import annotations

import json
from typing import Any

from minisgl_core.api import ReasoningParser, ToolCall, ToolCallDelta
from minisgl_core.server.tools import ToolPlan


def tool_call_json(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def tool_call_delta_json(delta: ToolCallDelta) -> dict[str, Any]:
    out: dict[str, Any] = {"index": delta.index}
    function: dict[str, Any] = {"arguments": delta.arguments}
    if delta.id is not None:
        out["id"], out["type"] = delta.id, "function"
    if delta.name is not None:
        function["name"] = delta.name
    out["function"] = function
    return out


class ChoiceOutput:
    """Use one instance per choice, either for :meth:`message` or for a stream of :meth:`delta`."""

    def __init__(self, plan: ToolPlan, reasoning_parser: type[ReasoningParser] | None) -> None:
        self.reasoning = reasoning_parser() if reasoning_parser is not None else None
        self.tools = plan.parser(plan.tools) if plan.parser is not None else None
        self.single_call = plan.single_call
        self.made_calls = False
        self._tool_parser = plan.parser
        self._tool_list = plan.tools
        #: streaming: the text given to the tool parser, read again whole at the end (a call cut
        #: off part-way, by a stop string or a malformed object, keeps what was sent, but only
        #: whole calls make the finish reason "tool_calls", as in :meth:`message`)
        self._streamed: list[str] = []

    def message(self, text: str) -> dict[str, Any]:
        """The whole assistant message of a finished choice."""
        content: str | None = text
        message: dict[str, Any] = {"role": "assistant"}
        if self.reasoning is not None:
            split = self.reasoning.parse(text)
            message["reasoning_content"], content = split.reasoning, split.content
        if self.tools is not None and content is not None:
            parsed = self.tools.parse(content)
            content, calls = parsed.content, self._kept(parsed.tool_calls)
            self.made_calls = _all_whole(calls)
            if calls:
                message["tool_calls"] = [tool_call_json(c) for c in calls]
        message["content"] = content
        return message

    def delta(self, text: str, final: bool) -> dict[str, Any]:
        """The stream delta for the next piece of text (``final``: the choice ended with it)."""
        reasoning, content = "", text
        if self.reasoning is not None:
            parts = [self.reasoning.feed(text), *([self.reasoning.finish()] if final else [])]
            reasoning, content = "".join(p.reasoning for p in parts), "".join(p.content for p in parts)
        calls: list[ToolCallDelta] = []
        if self.tools is not None:
            self._streamed.append(content)
            parts = [self.tools.feed(content), *([self.tools.finish()] if final else [])]
            content = "".join(p.content for p in parts)
            calls = [d for p in parts for d in p.tool_calls if not (self.single_call and d.index > 0)]
        out: dict[str, Any] = {}
        if reasoning:
            out["reasoning_content"] = reasoning
        if content:
            out["content"] = content
        if calls:
            out["tool_calls"] = [tool_call_delta_json(d) for d in calls]
        return out

    def finish_reason(self, reason: str | None) -> str | None:
        """``"tool_calls"`` for a choice that stopped after whole calls only, streamed or not."""
        if reason != "stop":
            return reason
        if self._streamed and self._tool_parser is not None:  # once, at the end of a stream
            text, self._streamed = "".join(self._streamed), []
            self.made_calls = _all_whole(
                self._kept(self._tool_parser(self._tool_list).parse(text).tool_calls)
            )
        return "tool_calls" if self.made_calls else reason

    def _kept(self, calls: list[ToolCall]) -> list[ToolCall]:
        return calls[: 1 if self.single_call else None]


def _all_whole(calls: list[ToolCall]) -> bool:
    """Whether there are calls and each is finished: a forced call cut off by a stop string keeps
    its partial arguments, and "tool_calls" would tell the client to run it."""
    if not calls:
        return False
    try:
        return all(isinstance(json.loads(c.arguments), dict) for c in calls)
    except ValueError:
        return False
