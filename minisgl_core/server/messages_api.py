"""``/v1/messages``: Anthropic's Messages API, run by the chat pipeline.

``POST``: the body (``messages_schema``) becomes a chat request, which ``routes.admit_chat``
admits as the chat route does (template, sampling, grammar, tools); its one choice's text goes
through the same output parsers, read token by token as /v1/responses reads it
(``EventStream.read``), into Anthropic's content blocks: ``thinking`` (with
``--reasoning-parser``; its ``signature`` empty: minisgl signs nothing), ``text`` and ``tool_use``
(id ``toolu_...``, the arguments parsed). Streamed, the same blocks go out as Anthropic's events
(``message_start``, ``content_block_start``/``_delta``/``_stop``, ``message_delta``,
``message_stop``; an ``error`` event for an error once the stream began), so the SDK assembles the
message a whole answer gives. ``POST /v1/messages/count_tokens`` counts the prompt without
running it. Errors of these routes are in Anthropic's shape (``errors.anthropic_error_body``), and
they take the key as Anthropic's clients send it, ``x-api-key``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from minisgl_core.server import responses as r
from minisgl_core.server.api_options import ApiOptions, ApiTokenizer
from minisgl_core.server.chat_output import ChoiceOutput
from minisgl_core.server.errors import APIError, anthropic_error_body
from minisgl_core.server.handling import client_request_id, respond, with_request_id
from minisgl_core.server.messages_schema import (
    CountTokensRequest,
    MessagesRequest,
    messages_names,
    messages_renamed,
)
from minisgl_core.server.responses_output import EventStream, new_id
from minisgl_core.server.routes import admit_chat, chat_prompt_ids, name_group
from minisgl_core.server.state import ServerState

logger = logging.getLogger(__name__)


class MessageBlocks(EventStream):
    """One message's content blocks, built from the chat deltas ``EventStream.read`` gives (a
    whole answer read as its stream), with Anthropic's stream events for them (each "" without
    ``render``)."""

    def __init__(self, render: bool = True) -> None:
        super().__init__(logprobs=False, render=render)
        self.blocks: list[dict[str, Any]] = []
        #: each tool_use block's arguments as the parser wrote them (JSON text), by block index
        self._arguments: dict[int, str] = {}
        self._open_kind: str | None = None

    def event(self, kind: str, **fields: Any) -> str:
        if not self._render:
            return ""
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, ensure_ascii=False)}\n\n"

    def delta(self, message: dict[str, Any], logprobs: list[dict[str, Any]]) -> list[str]:
        out = []
        if message.get("reasoning_content"):
            out += self._text("thinking", message["reasoning_content"])
        if message.get("content"):
            out += self._text("text", message["content"])
        for call in message.get("tool_calls", ()):
            out += self._call(call)
        return out

    def finish(self, incomplete: bool = False) -> list[str]:
        return self._close()

    def _text(self, kind: str, text: str) -> list[str]:
        out = [] if self._open_kind == kind else self._open(kind)
        index = len(self.blocks) - 1
        if kind == "thinking":
            self.blocks[index]["thinking"] += text
            delta = {"type": "thinking_delta", "thinking": text}
        else:
            self.blocks[index]["text"] += text
            delta = {"type": "text_delta", "text": text}
        return [*out, self.event("content_block_delta", index=index, delta=delta)]

    def _call(self, call: dict[str, Any]) -> list[str]:
        out = []
        if self._open_kind != "tool_use" or call["index"] != self._call_index:
            out += self._open("tool_use", name=call["function"].get("name", ""))
            self._call_index = call["index"]
        index = len(self.blocks) - 1
        arguments = call["function"].get("arguments", "")
        if arguments:
            self._arguments[index] += arguments
            delta = {"type": "input_json_delta", "partial_json": arguments}
            out.append(self.event("content_block_delta", index=index, delta=delta))
        return out

    def _open(self, kind: str, name: str = "") -> list[str]:
        out = self._close()
        block: dict[str, Any]
        if kind == "thinking":
            block = {"type": "thinking", "thinking": "", "signature": ""}
        elif kind == "text":
            block = {"type": "text", "text": ""}
        else:
            block = {"type": "tool_use", "id": new_id("toolu"), "name": name, "input": {}}
            self._arguments[len(self.blocks)] = ""
        self.blocks.append(block)
        self._open_kind = kind
        return [
            *out,
            self.event("content_block_start", index=len(self.blocks) - 1, content_block=dict(block)),
        ]

    def _close(self) -> list[str]:
        if self._open_kind is None:
            return []
        index = len(self.blocks) - 1
        if self._open_kind == "tool_use":
            self.blocks[index]["input"] = _tool_input(self._arguments[index], self.blocks[index]["name"])
        self._open_kind = None
        return [self.event("content_block_stop", index=index)]


def _tool_input(arguments: str, name: str) -> dict[str, Any]:
    """A call's arguments as the object Anthropic's ``input`` is (the tool parsers write JSON)."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise APIError(500, f"the tool parser gave arguments for {name!r} that are not a JSON object")
    return value


def stop_reason(
    finish_reason: str | None, matched_stop: str | int | None, output: ChoiceOutput
) -> str | None:
    """Anthropic's stop_reason: ``tool_use`` after calls, ``stop_sequence`` for a stop string,
    ``max_tokens`` at the limit, ``end_turn`` at the model's end; None for a request that
    ``/abort_request`` ended (Anthropic's has no such end)."""
    reason = output.finish_reason(finish_reason)
    if reason == "tool_calls":
        return "tool_use"
    if reason == "length":
        return "max_tokens"
    if reason == "stop":
        return "stop_sequence" if isinstance(matched_stop, str) else "end_turn"
    return None


def message_object(
    mid: str,
    model: str,
    blocks: list[dict[str, Any]],
    reason: str | None,
    stop: str | None,
    usage: dict[str, int],
) -> dict[str, Any]:
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": reason,
        "stop_sequence": stop,
        "stop_details": None,
        "usage": usage,
    }


def usage(input_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, int]:
    """Anthropic's usage: ``cache_read_input_tokens`` the prompt's tokens the prefix cache held
    (chat's cached_tokens); minisgl writes no cache on request (``cache_creation_input_tokens`` 0)."""
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_read_input_tokens": cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def messages_router(state: ServerState, options: ApiOptions, tokenizer: ApiTokenizer) -> APIRouter:
    router = APIRouter()
    model = state.model

    def check(body: MessagesRequest | CountTokensRequest) -> None:
        model.check_name(body.model)
        thinking = body.thinking
        if thinking is not None and thinking.type == "enabled" and options.reasoning_parser is None:
            # (the thinking would come back as text, tags and all: not Anthropic's thinking blocks)
            raise APIError(
                400,
                "thinking: this server splits no reasoning from the answer: start it with "
                "--reasoning-parser (e.g. qwen3) to get thinking blocks, or leave thinking out",
                "thinking",
                "unsupported_field",
            )

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(body: CountTokensRequest) -> dict[str, Any]:
        """The tokens of the prompt the same request would run on (its ``usage.input_tokens``),
        rendered by the chat template as ``POST /v1/messages`` renders it; nothing runs."""
        check(body)
        chat, origins = body.chat()
        with messages_names(origins):
            ids = await chat_prompt_ids(state, options, chat, tokenizer)
        return {"input_tokens": len(ids)}

    @router.post("/v1/messages")
    async def create_message(body: MessagesRequest, request: Request) -> Response:
        check(body)
        given = client_request_id(request, None)
        chat, origins = body.chat()
        with messages_names(origins):
            admitted = await admit_chat(state, options, chat, tokenizer)
        group = admitted.group
        mid = new_id("msg")
        name_group(group, given, mid)

        def build(choices: list[r.Choice]) -> dict[str, Any]:
            (choice,) = choices
            output = admitted.new_output()
            blocks = MessageBlocks(render=False)
            blocks.read(output, choice)
            blocks.finish()
            reason = stop_reason(choice.finish_reason, choice.matched_stop, output)
            stop = choice.matched_stop if reason == "stop_sequence" else None
            counted = usage(group.prompt_tokens, len(choice.token_ids), group.cached_tokens)
            return message_object(mid, model.name, blocks.blocks, reason, stop, counted)

        async def events() -> AsyncIterator[str]:
            blocks = MessageBlocks()
            output = admitted.new_output()
            start = message_object(mid, model.name, [], None, None,
                                   usage(group.prompt_tokens, 0, group.cached_tokens))  # fmt: skip
            yield blocks.event("message_start", message=start)
            output_tokens = 0
            try:
                async for delta in group.deltas():
                    if delta.finish_reason == "error":
                        message = delta.error or "the request failed"
                        if delta.error_status == 400:  # (the engine's: it names the chat request's fields)
                            message = messages_renamed(message, origins)
                        yield _error_event(delta.error_status, message)
                        return
                    output_tokens += len(delta.token_ids)
                    for event in blocks.read(output, delta):
                        yield event
                    if delta.finish_reason is not None:
                        for event in blocks.finish():
                            yield event
                        reason = stop_reason(delta.finish_reason, delta.matched_stop, output)
                        stop = delta.matched_stop if reason == "stop_sequence" else None
                        final = usage(group.prompt_tokens, output_tokens, group.cached_tokens)
                        yield blocks.event(
                            "message_delta",
                            delta={"stop_reason": reason, "stop_sequence": stop, "stop_details": None},
                            usage=final,
                        )
                yield blocks.event("message_stop")
            # an error raised while streaming (a parser plugin's, or a bug): the status line went
            # out with the first event, so it is an event too, as on the chat route
            except APIError as exc:
                yield _error_event(exc.status, exc.message)
            except Exception as exc:
                logger.exception("a message stream failed")
                yield _error_event(500, f"internal error: {type(exc).__name__}: {exc}"[:500])

        with messages_names(origins):  # (a 400 the engine found, answered whole)
            return with_request_id(await respond(group, request, body.stream, events, build), given, mid)

    return router


def _error_event(status: int, message: str) -> str:
    return f"event: error\ndata: {json.dumps(anthropic_error_body(status, message))}\n\n"
