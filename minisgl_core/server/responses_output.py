"""A chat answer as OpenAI's Responses API gives it: the ``Response`` object, whose ``output`` holds
a ``reasoning`` item (the reasoning parser's text), ``message`` items (``output_text``) and a
``function_call`` item per tool call; and, streaming, the events that build the same items.

Both read the chat pipeline's output (``ChoiceOutput``) token by token, a whole answer as its
stream (:func:`output_items`), so a response is the same streamed or not, and its items come in
the order the model wrote them, as OpenAI's: text, a call, then more text are a message, a
function_call and a second message (a message item per run of text between calls). Each
output_text's logprobs are those of the tokens that wrote it (tokens that wrote the reasoning or a
call have none). When the output ran out of tokens the response is ``incomplete``, and so is its
last item (the last item too of a response /abort_request cut short, status ``cancelled``).

``usage.output_tokens_details.reasoning_tokens`` counts the generated tokens that wrote the
reasoning, read one by one as the items are (:class:`ReasoningTokens`), not its text encoded
again (which is not the inverse of generation): the same streamed or not.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from minisgl_core.api import TagReasoningParser
from minisgl_core.server.responses import chat_logprobs

if TYPE_CHECKING:
    from minisgl_core.server.chat_output import ChoiceOutput
    from minisgl_core.server.responses import Choice

#: each output item type's id prefix (OpenAI's: rs_..., msg_..., fc_...)
_ITEM_PREFIX = {"reasoning": "rs", "message": "msg", "function_call": "fc"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_object(
    rid: str,
    created_at: int,
    echo: dict[str, Any],
    output: list[dict[str, Any]],
    status: str,
    usage: dict[str, Any] | None = None,
    error: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The Response; ``echo``: the request's settings it repeats (model, tools, temperature...)."""
    return {
        "id": rid,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        **echo,
        "output": output,
        "usage": usage,
    }


def usage(
    input_tokens: int, output_tokens: int, reasoning_tokens: int, cached_tokens: int = 0
) -> dict[str, Any]:
    """The usage: ``cached_tokens``, of the input tokens, those read from the prefix cache;
    ``reasoning_tokens``, of the output tokens, those that wrote the reasoning
    (:class:`ReasoningTokens`)."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }


def _text_part(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return part


def _new_item(kind: str, **fields: Any) -> dict[str, Any]:
    item: dict[str, Any] = {"id": new_id(_ITEM_PREFIX[kind]), "type": kind}
    if kind == "message":
        item |= {"role": "assistant", "content": []}
    elif kind == "reasoning":
        item |= {"summary": [], "content": []}
    return item | fields | {"status": "in_progress"}


def _finished(items: list[dict[str, Any]], incomplete: bool) -> list[dict[str, Any]]:
    """Every item completed, but the last when the output ran out of tokens while writing it."""
    for item in items:
        item["status"] = "incomplete" if incomplete and item is items[-1] else "completed"
    return items


def read_whole(output: ChoiceOutput, choice: Choice, logprobs: bool) -> EventStream:
    """A whole choice read as its stream is (:meth:`EventStream.read`), without rendering events:
    its ``items`` in the order they were written (a message item even when the text is empty,
    unless there is something else), and its :meth:`~EventStream.reasoning_tokens`."""
    stream = EventStream(logprobs, render=False)
    stream.read(output, choice)
    stream.finish(incomplete=choice.finish_reason in ("length", "abort"))
    return stream


class ReasoningTokens:
    """Which of a choice's generated tokens wrote its reasoning, told token by token as the
    reasoning parser reads them (:meth:`add`): the tokens from the output's first through the one
    that closed the reasoning, tags included (``<think>``, text, ``</think>``: all of them; the
    whitespace after the end tag, which the parser drops, and the answer's tokens are not), or all
    of the output's where the reasoning never closed (the output ran out, or stopped, while
    thinking). An output that did not open the reasoning has none.

    The token that closed it is the one whose text completed a :class:`TagReasoningParser`'s
    ``end_tag``; the output opened the reasoning where its start (after whitespace) is
    ``start_tag``, the prompt ended with it (``ChoiceOutput.reasoning_opened``), or the parser
    gave reasoning text (deepseek_r1 reads an output without ``start_tag`` as reasoning). A
    parser of another shape tells no tag: the reasoning closed with the last token that gave
    reasoning text, if any token after it gave the answer (text or a call)."""

    def __init__(self, output: ChoiceOutput) -> None:
        parser = output.reasoning
        tagged = isinstance(parser, TagReasoningParser)
        self._tags = (parser.start_tag, parser.end_tag) if tagged else None
        #: tokens read, and through which one the reasoning is known to run
        self._read = 0
        self._last_reasoning = 0
        #: (tags) the token that completed end_tag, if one did
        self._closed_at: int | None = None
        #: the output opened the reasoning; (tags) its start while it may still be start_tag
        self._opened = output.reasoning_opened
        self._head: str | None = None if self._opened or not tagged else ""
        #: (tags) the text read since start_tag that may be the start of end_tag
        self._tail = ""
        #: a token gave the answer (text or a call)
        self._answered = False

    @property
    def settled(self) -> bool:
        """Later tokens cannot change the count: with tags, the end tag came or the answer began
        (a TagReasoningParser answers only after the reasoning); never for other parsers."""
        return self._tags is not None and (self._closed_at is not None or self._answered)

    def add(self, text: str | None, message: dict[str, Any]) -> None:
        """The next token's ``text`` and the stream delta it gave (``ChoiceOutput.delta``); None
        and the delta of the output's end (what the parsers held back)."""
        if text is not None:
            self._read += 1
        if message.get("reasoning_content"):
            self._last_reasoning = self._read
        if message.get("content") or message.get("tool_calls"):
            self._answered = True
        if self._tags is None or self._closed_at is not None or text is None:
            return
        start, end = self._tags
        if self._head is not None:  # whether the output opens with start_tag is not known yet
            head = (self._head + text).lstrip()
            if head.startswith(start):
                self._opened, self._head, text = True, None, head[len(start) :]
            elif start.startswith(head):
                self._head = head
                return
            else:
                self._head = None
        window = self._tail + text
        if end in window:
            self._closed_at = self._read
        else:
            self._tail = window[max(len(window) - len(end) + 1, 0) :] if len(end) > 1 else ""

    @property
    def closed_by_last(self) -> bool:
        """The token read last completed the end tag (with tags)."""
        return self._closed_at is not None and self._closed_at == self._read

    def count(self, output_tokens: int) -> int:
        """The reasoning's tokens, of the choice's ``output_tokens``."""
        if not (self._opened or self._last_reasoning):
            return 0
        if self._closed_at is not None:
            return min(self._closed_at, output_tokens)
        return min(self._last_reasoning, output_tokens) if self._answered else output_tokens


class EventStream:
    """One response's stream events, in OpenAI's order, numbered: ``start`` (created, in
    progress), then each chat delta (``read`` makes them of the route's deltas) opens, fills and
    closes output items (item added, content part added, text deltas, text done, part done, item
    done; a call's arguments deltas and done), and ``finish`` closes the last item; the items
    built are the final response's output. Without ``render`` it only builds the items (each
    event is ""): a whole response, whose events nobody reads."""

    def __init__(self, logprobs: bool, render: bool = True) -> None:
        self.sequence = 0
        self._render = render
        self.items: list[dict[str, Any]] = []
        #: the part being written (a message's or the reasoning's text), if the last item has one
        self._part: dict[str, Any] | None = None
        self._logprobs = logprobs
        #: logprobs of tokens whose text has not gone out yet (a parser holds it, or it is none)
        self._pending: list[dict[str, Any]] = []
        #: the chat delta's index of the function call being written
        self._call_index: int | None = None
        #: with a reasoning parser, which tokens wrote the reasoning (made on the first read)
        self._reasoning: ReasoningTokens | None = None

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        if not self._render:
            return ""
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def start(self, response: dict[str, Any]) -> list[str]:
        return [
            self.event("response.created", response=response),
            self.event("response.in_progress", response=response),
        ]

    def read(self, output: ChoiceOutput, delta: Choice) -> list[str]:
        """Events for the route's next ``delta`` of the choice, read token by token
        (:meth:`Delta.tokens`): the parsers see the same pieces however many tokens a delta
        merged, so text that follows a call in one delta still comes after it, and the items, and
        whose logprobs each text takes, are the same streamed or not; so is which tokens wrote
        the reasoning (:meth:`reasoning_tokens`)."""
        if self._reasoning is None and output.reasoning is not None:
            self._reasoning = ReasoningTokens(output)
        counting = self._reasoning if self._reasoning is not None and not self._reasoning.settled else None
        out = []
        # without a tool parser nothing can come between two texts, and without logprobs nothing
        # is attributed to tokens: the delta reads as one piece (a whole answer is one delta),
        # once the reasoning's tokens are counted
        whole = output.tools is None and not self._logprobs
        tokens = delta.tokens()
        for text, entries in tokens:
            if whole and counting is None:
                text += "".join(rest for rest, _ in tokens)
            message = output.delta(text, final=False)
            if counting is not None:
                counting.add(text, message)
                if counting.closed_by_last and not (message.get("content") or message.get("tool_calls")):
                    # the token that closed the reasoning (and those of its tag held before it) wrote
                    # the reasoning, counted in reasoning_tokens: no output_text's logprobs
                    self._pending, entries = [], []
                counting = None if counting.settled else counting
            logprobs = chat_logprobs(entries)["content"] if self._logprobs else []
            out += self.delta(message, logprobs)
        if delta.finish_reason is not None:
            message = output.delta("", final=True)
            if counting is not None:
                counting.add(None, message)
            out += self.delta(message, [])
        return out

    def reasoning_tokens(self, output_tokens: int) -> int:
        """Of the ``output_tokens`` read, those that wrote the reasoning (none without a
        reasoning parser)."""
        return 0 if self._reasoning is None else self._reasoning.count(output_tokens)

    def delta(self, message: dict[str, Any], logprobs: list[dict[str, Any]]) -> list[str]:
        """Events for a chat stream delta (``ChoiceOutput.delta``) and its tokens' logprobs. Its
        text takes them, with those of earlier tokens that showed nothing (a tag, a marker held
        back that turned out text, whitespace a parser dropped); tokens that wrote reasoning or a
        call, and nothing else, are no output_text's."""
        self._pending += logprobs
        out = []
        if message.get("reasoning_content"):
            out += self._text("reasoning", message["reasoning_content"])
        if message.get("content"):
            out += self._text("message", message["content"])
        for call in message.get("tool_calls", ()):
            out += self._call(call)
        if message.get("reasoning_content") or message.get("tool_calls"):
            self._pending = []
        return out

    def finish(self, incomplete: bool) -> list[str]:
        """Close the last item (an empty message when there was no output at all); a message
        takes the logprobs of the tokens after its text that showed nothing (an eos)."""
        out = [] if self.items else self._open("message")
        if self._logprobs and self._part is not None and self.items[-1]["type"] == "message":
            self._part["logprobs"] += self._pending
        self._pending = []
        out += self._close(incomplete)
        return out

    def _text(self, kind: str, text: str) -> list[str]:
        out = (
            []
            if self.items and self.items[-1]["type"] == kind and self._part is not None
            else self._open(kind)
        )
        item, part = self.items[-1], self._part
        assert part is not None
        part["text"] += text
        where = {"item_id": item["id"], "output_index": len(self.items) - 1, "content_index": 0}
        if kind == "reasoning":
            return [*out, self.event("response.reasoning_text.delta", **where, delta=text)]
        logprobs, self._pending = self._pending, []
        if self._logprobs:
            part["logprobs"] += logprobs
        return [*out, self.event("response.output_text.delta", **where, delta=text, logprobs=logprobs)]

    def _call(self, call: dict[str, Any]) -> list[str]:
        out = []
        if call["index"] != self._call_index:
            self._call_index = call["index"]
            function = call["function"]
            out += self._open("function_call", call_id=call.get("id", ""), name=function.get("name", ""))
        item = self.items[-1]
        arguments = call["function"].get("arguments", "")
        if arguments:
            item["arguments"] += arguments
            out.append(
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=len(self.items) - 1,
                    delta=arguments,
                )
            )
        return out

    def _open(self, kind: str, **fields: Any) -> list[str]:
        out = self._close(incomplete=False) if self.items else []
        if kind == "function_call":
            fields["arguments"] = ""
        else:
            self._call_index = None
        item = _new_item(kind, **fields)
        self.items.append(item)
        out.append(self.event("response.output_item.added", output_index=len(self.items) - 1, item=item))
        if kind != "function_call":
            if kind == "message":
                self._part = _text_part("", [] if self._logprobs else None)
            else:
                self._part = {"type": "reasoning_text", "text": ""}
            out.append(self._part_event("response.content_part.added"))
            item["content"].append(self._part)
        return out

    def _part_event(self, kind: str) -> str:
        item = self.items[-1]
        return self.event(
            kind, item_id=item["id"], output_index=len(self.items) - 1, content_index=0, part=self._part
        )

    def _close(self, incomplete: bool) -> list[str]:
        item, index = self.items[-1], len(self.items) - 1
        out = []
        if item["type"] == "function_call":
            out.append(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
        elif self._part is not None:
            part, where = self._part, {"item_id": item["id"], "output_index": index, "content_index": 0}
            if item["type"] == "message":
                logprobs = part.get("logprobs", [])
                out.append(
                    self.event("response.output_text.done", **where, text=part["text"], logprobs=logprobs)
                )
            else:
                out.append(self.event("response.reasoning_text.done", **where, text=part["text"]))
            out.append(self._part_event("response.content_part.done"))
            self._part = None
        item["status"] = "incomplete" if incomplete else "completed"
        out.append(self.event("response.output_item.done", output_index=index, item=item))
        return out
