"""``POST /v1/responses``: OpenAI's Responses API, run by the chat pipeline.

The body (``responses_schema``) becomes a chat request, which ``routes.admit_chat`` admits as the
chat route does (template, sampling, grammar, tools); its one choice's text goes through the same
output parsers, and comes back as a ``Response`` object or its stream of events
(``responses_output``). Nothing is stored: there is no GET of a response, and no
``previous_response_id``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from minisgl_core.sampling import SamplingParams
from minisgl_core.server import responses as r
from minisgl_core.server.api_options import ApiOptions, ApiTokenizer
from minisgl_core.server.errors import APIError
from minisgl_core.server.handling import respond
from minisgl_core.server.responses_output import EventStream, new_id, read_whole, response_object, usage
from minisgl_core.server.responses_schema import FunctionChoice, ResponsesRequest, responses_names
from minisgl_core.server.routes import admit_chat
from minisgl_core.server.state import ServerState

logger = logging.getLogger(__name__)


def echo_fields(body: ResponsesRequest, params: SamplingParams, model: str) -> dict[str, Any]:
    """What a Response repeats of its request: the settings it ran with."""
    text_format = body.text.format if body.text is not None else None
    choice = body.tool_choice if body.tool_choice is not None else "auto"
    return {
        "model": model,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_logprobs": body.top_logprobs,
        "tools": [t.model_dump(exclude_none=True) for t in body.tools or ()],
        "tool_choice": choice.model_dump() if isinstance(choice, FunctionChoice) else choice,
        "parallel_tool_calls": body.parallel_tool_calls,
        "text": {
            "format": text_format.model_dump(by_alias=True, exclude_none=True)
            if text_format
            else {"type": "text"}
        },
        "reasoning": body.reasoning.model_dump(exclude_none=True) if body.reasoning else None,
        "truncation": "disabled",
        "background": False,
        "previous_response_id": None,
        "metadata": body.metadata or {},
        "user": body.user,
        "safety_identifier": body.safety_identifier,
        "prompt_cache_key": body.prompt_cache_key,
        "service_tier": body.service_tier or "default",
    }


def responses_router(state: ServerState, options: ApiOptions, tokenizer: ApiTokenizer) -> APIRouter:
    router = APIRouter()
    model = state.model

    @router.post("/v1/responses")
    async def create_response(body: ResponsesRequest, request: Request) -> Response:
        model.check_name(body.model)
        chat, origins = body.chat_request()
        with responses_names(origins):
            admitted = await admit_chat(state, options, chat, tokenizer)
        group = admitted.group
        rid, created = new_id("resp"), int(time.time())
        echo = echo_fields(body, admitted.params, model.name)

        def usage_of(output_tokens: int, stream: EventStream) -> dict[str, Any]:
            reasoning = stream.reasoning_tokens(output_tokens)
            return usage(group.prompt_tokens, output_tokens, reasoning, group.cached_tokens)

        def build(choices: list[r.Choice]) -> dict[str, Any]:
            (choice,) = choices
            stream = read_whole(admitted.new_output(), choice, body.logprobs)
            status = "incomplete" if choice.finish_reason == "length" else "completed"
            output_tokens = len(choice.token_ids)
            return response_object(rid, created, echo, stream.items, status, usage_of(output_tokens, stream))

        async def events() -> AsyncIterator[str]:
            stream = EventStream(body.logprobs)
            output = admitted.new_output()
            for event in stream.start(response_object(rid, created, echo, [], "in_progress")):
                yield event
            output_tokens, finish = 0, None
            try:
                async for delta in group.deltas():
                    if delta.finish_reason == "error":
                        error = delta.error or "the request failed"
                        for event in _failed(stream, rid, created, echo, error, delta.error_status,
                                             delta.error_param, delta.error_code):  # fmt: skip
                            yield event
                        return
                    output_tokens += len(delta.token_ids)
                    finish = delta.finish_reason or finish
                    for event in stream.read(output, delta):
                        yield event
                incomplete = finish == "length"
                for event in stream.finish(incomplete):
                    yield event
                status = "incomplete" if incomplete else "completed"
                final = response_object(
                    rid, created, echo, stream.items, status, usage_of(output_tokens, stream)
                )
                yield stream.event(f"response.{status}", response=final)
            # an error raised while streaming (a parser plugin's, or a bug): the status line went
            # out with the first event, so it is an event too, as on the chat route
            except APIError as exc:
                for event in _failed(
                    stream, rid, created, echo, exc.message, exc.status, exc.param, exc.code
                ):
                    yield event
            except Exception as exc:
                logger.exception("a response stream failed")
                message = f"internal error: {type(exc).__name__}: {exc}"[:500]
                for event in _failed(stream, rid, created, echo, message, 500, None, None):
                    yield event

        return await respond(group, request, body.stream, events, build)

    return router


def _failed(
    stream: EventStream,
    rid: str,
    created: int,
    echo: dict[str, Any],
    message: str,
    status: int,
    param: str | None,
    code: str | None,
) -> list[str]:
    """An error mid-stream: an ``error`` event with the status's code (``request_timeout``...), then
    ``response.failed`` with what was generated so far."""
    failure = {"code": "server_error" if status >= 500 else "invalid_prompt", "message": message}
    failed = response_object(rid, created, echo, stream.items, "failed", error=failure)
    return [
        stream.event("error", code=code or failure["code"], message=message, param=param),
        stream.event("response.failed", response=failed),
    ]
