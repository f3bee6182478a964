"""A chat answer as OpenAI's Responses API gives it: the ``Response`` object, whose ``output`` holds
a ``reasoning`` item (the reasoning parser's text), ``message`` items (``output_text``) and a
``function_call`` item per tool call; and, streaming, the events that build the same items.

Both read the chat pipeline's output (``ChoiceOutput``) token by token, a whole answer as its
stream (:func:`output_items`), so a response is the same streamed or not, and its items come in
the order the model wrote them, as OpenAI's: text, a call, then more text are a message, a
function_call and a second message (a message item per run of text between calls). Each
output_text's logprobs are those of the tokens that wrote it (tokens that wrote the reasoning or a
call have none). When the output ran out of tokens the response is ``incomplete``, and so is its
last item.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

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
    """The usage: ``cached_tokens``, of the input tokens, those read from the prefix cache; a
    reasoning item's tokens are its text's, encoded again."""
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


def output_items(output: ChoiceOutput, choice: Choice, logprobs: bool) -> list[dict[str, Any]]:
    """The output items of a whole choice: those its stream builds (:meth:`EventStream.read`),
    in the order they were written; a message item even when the text is empty, unless there is
    something else."""
    stream = EventStream(logprobs, render=False)
    stream.read(output, choice)
    stream.finish(incomplete=choice.finish_reason == "length")
    return stream.items


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
        whose logprobs each text takes, are the same streamed or not."""
        out = []
        # without a tool parser nothing can come between two texts, and without logprobs nothing
        # is attributed to tokens: the delta reads as one piece (a whole answer is one delta)
        whole = output.tools is None and not self._logprobs
        for text, entries in [(delta.text, [])] if whole else delta.tokens():
            logprobs = chat_logprobs(entries)["content"] if self._logprobs else []
            out += self.delta(output.delta(text, final=False), logprobs)
        if delta.finish_reason is not None:
            out += self.delta(output.delta("", final=True), [])
        return out

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
