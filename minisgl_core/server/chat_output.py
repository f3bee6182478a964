"""One chat choice's text turned into OpenAI's message: reasoning split off first (with
``--reasoning-parser``), then tool calls read from the rest (when the request offers tools),
either from the whole text or delta by delta while streaming.

The parsers are plugins: an exception raised by one (building it, or reading text), or a result not
of the API's class, is a 500 naming
the selection (``--reasoning-parser qwen3``), its plugin and distribution, and the parser's class,
its traceback logged once; mid-stream the route's stream sends it as an error event
(server/handling.py)."""

from __future__ import annotations

import functools
import importlib.metadata
import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from minisgl_core.api import (
    ReasoningDelta,
    ReasoningParser,
    ReasoningResult,
    TagReasoningParser,
    ToolCall,
    ToolCallDelta,
    ToolParseResult,
    ToolStreamDelta,
)
from minisgl_core.api.process import ProcessContext
from minisgl_core.plugins import build
from minisgl_core.server.errors import APIError
from minisgl_core.server.tools import ToolPlan

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: what each parser method returns (the API's classes): anything else is the plugin's error, named
#: as its exceptions are (a str from parse was "internal error: AttributeError: 'str' object has
#: no attribute 'reasoning'", naming no parser)
_RETURNS: dict[tuple[str, str], type] = {
    ("reasoning", "parse"): ReasoningResult,
    ("reasoning", "feed"): ReasoningDelta,
    ("reasoning", "finish"): ReasoningDelta,
    ("tool call", "parse"): ToolParseResult,
    ("tool call", "feed"): ToolStreamDelta,
    ("tool call", "finish"): ToolStreamDelta,
}


@functools.cache
def _distribution_of(module: str) -> str | None:
    names = importlib.metadata.packages_distributions().get(module.split(".")[0])
    return names[0] if names else None


@contextmanager
def _parser_call(kind: str, cls: type, label: str | None) -> Iterator[None]:
    """Turn an exception raised inside a parser plugin into a 500 that names it: ``label`` is
    the selection as the command line made it (:attr:`ApiOptions.parser_labels`), None for a
    parser the server picked itself (a forced tool call's), named by its class alone."""
    try:
        yield
    except APIError:
        raise
    except Exception as exc:
        qualified = f"{cls.__module__}.{cls.__qualname__}"
        if label is not None:
            where = f"{label}, class {qualified},"
        else:
            dist = _distribution_of(cls.__module__)
            where = f"{kind} parser {qualified}" + (f" from {dist}" if dist else "")
        logger.exception("the %s failed", where.rstrip(","))
        raise APIError(500, f"the {where} failed: {type(exc).__name__}: {exc}"[:500]) from exc


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


class SpecialTextFilter:
    """Takes the texts of special tokens out of a stream of text, as ``skip_special_tokens`` would
    have from the tokens: for a tool parser that reads special tokens (``reads_special_tokens``),
    whose choices are detokenized with them kept, the ones no parser consumed (an EOS kept by
    ``include_stop_str_in_output``, a marker of a call that turned out malformed) leave the
    answer. Read left to right, longest text first; a piece that may still grow into one is held
    back, so a stream split anywhere gives what the whole text gives. (A model that spelled a
    special token's text out of ordinary tokens loses it too: the text cannot tell them apart.)"""

    def __init__(self, texts: Sequence[str]) -> None:
        texts = sorted({t for t in texts if t}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, texts))) if texts else None
        self._texts = texts
        self._longest = len(texts[0]) if texts else 0
        self._firsts = {t[0] for t in texts}  # (a real tokenizer has a thousand: <SPECIAL_12>...)
        self._held = ""

    def feed(self, text: str, final: bool = False) -> str:
        text, self._held = self._held + text, ""
        if self._pattern is None:
            return text
        out: list[str] = []
        at = 0
        while at < len(text):
            tail = text[at:]
            if (
                not final
                and len(tail) < self._longest
                and tail[0] in self._firsts
                and any(len(t) > len(tail) and t.startswith(tail) for t in self._texts)
            ):
                self._held = tail  # may still become (a longer) special token
                break
            match = self._pattern.match(text, at)
            if match:
                at = match.end()
                continue
            nxt = self._pattern.search(text, at + 1)
            # (the next place a special token may begin, or the end part that may begin one)
            stop = nxt.start() if nxt else len(text)
            stop = min(stop, max(at + 1, len(text) - self._longest + 1))
            out.append(text[at:stop])
            at = stop
        return "".join(out)

    def finish(self) -> str:
        return self.feed("", final=True)

    def whole(self, text: str) -> str:
        return self.feed(text, final=True)


class ChoiceOutput:
    """Use one instance per choice, either for :meth:`message` or for a stream of :meth:`delta`."""

    def __init__(
        self,
        plan: ToolPlan,
        reasoning_parser: type[ReasoningParser] | None,
        labels: Mapping[type, str] | None = None,
        reasoning_opened: bool = False,
        grammar_answer: bool = False,
        hidden_special: Sequence[str] = (),
        context: ProcessContext | None = None,
    ) -> None:
        """``labels``: how errors name each parser class (:attr:`ApiOptions.parser_labels`);
        ``context``: the process's, for a parser whose constructor takes ``ctx``;
        ``hidden_special``: texts of special tokens to take out of the content and reasoning the
        parsers give (:class:`SpecialTextFilter`; a request that skips special tokens, detokenized
        with them kept for a tool parser that ``reads_special_tokens``);
        ``reasoning_opened``: the prompt ended with a TagReasoningParser's start tag, so the output
        is read as if it began with it (it begins inside the reasoning);
        ``grammar_answer``: a grammar constrained the answer (``Admission.grammar_answer``), after
        the reasoning's end tag or from the output's first token, so the text after the end tag is
        the answer as generated, whitespace included (a TagReasoningParser drops the whitespace
        after the end tag, a model's "</think>\n\n", which there is the grammar's: a regex or
        choice opening with a space), and an output that does not open the reasoning itself is the
        answer whole, whatever a TagReasoningParser reads (deepseek_r1's reads an output without
        its end tag as reasoning)."""
        self._labels = labels or {}
        self.reasoning_opened = reasoning_opened
        self._reasoning_cls = reasoning_parser
        self.reasoning = (
            self._call("reasoning", reasoning_parser, build, reasoning_parser, context)
            if reasoning_parser
            else None
        )
        if reasoning_opened and isinstance(self.reasoning, TagReasoningParser):
            self._reasoning(self.reasoning.feed, self.reasoning.start_tag)  # (nothing to send yet)
        self._exact_answer = grammar_answer and isinstance(self.reasoning, TagReasoningParser)
        #: with an exact answer (see :meth:`_answer_part`): whether the output opened the reasoning
        #: (None: not known yet), whether the answer has begun, and the text held until then
        self._opened: bool | None = True if reasoning_opened else None
        self._answer_begun = False
        self._held = ""
        #: with an exact answer: neither the prompt nor the output opened the reasoning, so the
        #: grammar applied from the first token and the whole output is the answer, whatever the
        #: parser reads (deepseek_r1's reads an output without <think> as reasoning)
        self._unreasoned = False
        self.tools = (
            self._call("tool call", plan.parser, build, plan.parser, context, plan.tools)
            if plan.parser
            else None
        )
        self.single_call = plan.single_call
        self.made_calls = False
        self._tool_parser = plan.parser
        self._tool_list = plan.tools
        self._context = context
        #: streaming: the text given to the tool parser, read again whole at the end (a call cut
        #: off part-way by a stop string is sent with its arguments so far, but only whole calls
        #: make the finish reason "tool_calls", as in :meth:`message`)
        self._streamed: list[str] = []
        self._hidden = tuple(hidden_special)
        self._content_filter = SpecialTextFilter(self._hidden)
        self._reasoning_filter = SpecialTextFilter(self._hidden)

    def message(self, text: str) -> dict[str, Any]:
        """The whole assistant message of a finished choice."""
        content: str | None = text
        message: dict[str, Any] = {"role": "assistant"}
        if self.reasoning is not None:
            split = self._reasoning(self.reasoning.parse, text)
            message["reasoning_content"], content = split.reasoning, split.content
            answer = self._answer_part(text)
            if answer is not None:
                content = answer or None
            if self._unreasoned:
                message["reasoning_content"] = None
        if self.tools is not None:
            # (an answer all reasoning is an empty one, as a stream feeds it: a named tool_choice's
            # call is still certain)
            parsed = self._tool(self.tools.parse, content or "")
            content, calls = parsed.content, self._kept(parsed.tool_calls)
            self.made_calls = _all_whole(calls)
            if calls:
                message["tool_calls"] = [tool_call_json(c) for c in calls]
        if self._hidden:
            reasoning = message.get("reasoning_content")
            if reasoning is not None:
                message["reasoning_content"] = SpecialTextFilter(self._hidden).whole(reasoning) or None
            if content is not None:
                content = SpecialTextFilter(self._hidden).whole(content) or None
        if content is None and "tool_calls" not in message and not message.get("reasoning_content"):
            content = ""  # an empty answer, as without parsers (theirs says "no part" with None)
        message["content"] = content
        return message

    def delta(self, text: str, final: bool) -> dict[str, Any]:
        """The stream delta for the next piece of text (``final``: the choice ended with it)."""
        reasoning, content = "", text
        if self.reasoning is not None:
            parts = [
                self._reasoning(self.reasoning.feed, text),
                *([self._reasoning(self.reasoning.finish)] if final else []),
            ]
            reasoning, content = "".join(p.reasoning for p in parts), "".join(p.content for p in parts)
            answer = self._answer_part(text)
            if answer is not None:
                content = answer
            if self._unreasoned:
                reasoning = ""
        calls: list[ToolCallDelta] = []
        if self.tools is not None:
            self._streamed.append(content)
            parts = [
                self._tool(self.tools.feed, content),
                *([self._tool(self.tools.finish)] if final else []),
            ]
            content = "".join(p.content for p in parts)
            calls = [d for p in parts for d in p.tool_calls if not (self.single_call and d.index > 0)]
        if self._hidden:
            reasoning = self._reasoning_filter.feed(reasoning, final)
            content = self._content_filter.feed(content, final)
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
            parsed = self._tool(
                self._tool(build, self._tool_parser, self._context, self._tool_list).parse, text
            )
            self.made_calls = _all_whole(self._kept(parsed.tool_calls))
        return "tool_calls" if self.made_calls else reason

    def _answer_part(self, text: str) -> str | None:
        """With an exact answer (``grammar_answer``): the part of ``text``, the next piece
        of output (the whole of it for :meth:`message`), that belongs to the answer after the
        reasoning's end tag, as generated; None before the answer begins. An output that did not
        open the reasoning (nor did the prompt) is the answer whole: the engine applied the
        grammar from its first token. Only the text the tags may still span is held between
        pieces."""
        if not self._exact_answer:
            return None
        if self._answer_begun:
            return text
        assert isinstance(self.reasoning, TagReasoningParser)
        start, end = self.reasoning.start_tag, self.reasoning.end_tag
        window = self._held + text
        if self._opened is None:  # everything so far is held until the output's opening is known
            head = window.lstrip()
            if head.startswith(start):
                self._opened = True
            elif start.startswith(head):
                self._held = window
                return None
            else:
                self._answer_begun, self._unreasoned, self._held = True, True, ""
                return window
        where = window.find(end)
        if where < 0:
            self._held = window[-(len(end) - 1) :] if len(end) > 1 else ""  # a tag's start, maybe
            return None
        self._answer_begun, self._held = True, ""
        return window[where + len(end) :]

    def _call(self, kind: str, cls: type, fn: Callable[..., T], *args: Any) -> T:
        with _parser_call(kind, cls, self._labels.get(cls)):
            out = fn(*args)
            name = getattr(fn, "__name__", "")
            expected = _RETURNS.get((kind, name))
            if expected is not None and not isinstance(out, expected):
                raise TypeError(f"{name}() returned {type(out).__name__}, not {expected.__name__}")
            return out

    def _reasoning(self, fn: Callable[..., T], *args: Any) -> T:
        assert self._reasoning_cls is not None
        return self._call("reasoning", self._reasoning_cls, fn, *args)

    def _tool(self, fn: Callable[..., T], *args: Any) -> T:
        assert self._tool_parser is not None
        return self._call("tool call", self._tool_parser, fn, *args)

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
