"""``/v1/responses``: OpenAI's Responses API, run by the chat pipeline, and its stored responses.

``POST``: the body (``responses_schema``) becomes a chat request, which ``routes.admit_chat``
admits as the chat route does (template, sampling, grammar, tools); its one choice's text goes
through the same output parsers, and comes back as a ``Response`` object or its stream of events
(``responses_output``). With ``store`` (the default) the finished response, and the conversation
it ran on, go to the process's :class:`ResponseStore` (bounded, ``--responses-store-size``):
``GET``/``DELETE /v1/responses/{id}`` read and delete it, ``GET .../input_items`` lists its
conversation, and a later request's ``previous_response_id`` continues it (that conversation, the
response's output, then the new ``input``; the new ``instructions``, not the old). A stream is
stored when it ends (completed, incomplete or failed); a request the client left is not (one
that ended before the server saw the client go is stored: it cannot tell it from a slow reader).
``POST .../cancel`` (for OpenAI's background responses, which minisgl does not run) is OpenAI's
400 for a response of another kind; a response being made is stopped by its client leaving
(a dropped connection aborts it, streamed or not) or by ``/abort_request`` with its id, or with
the client's ``X-Request-Id`` header (as on the chat route: a response answered whole has no id
before it ends), which the answer's ``X-Request-Id`` header carries back.
``POST /v1/responses/input_tokens`` counts the prompt a request would run on, rendered as above
without running it; ``POST /v1/responses/compact`` (OpenAI's encrypted compaction) is a 400.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import ValidationError

from minisgl_core.sampling import SamplingParams, short_repr
from minisgl_core.server import responses as r
from minisgl_core.server.api_options import ApiOptions, ApiTokenizer
from minisgl_core.server.errors import APIError
from minisgl_core.server.handling import client_request_id, respond, with_request_id
from minisgl_core.server.responses_output import EventStream, new_id, read_whole, response_object, usage
from minisgl_core.server.responses_schema import (
    HISTORY,
    FunctionChoice,
    InputItem,
    InputTokensRequest,
    ResponsesRequest,
    responses_names,
    responses_renamed,
)
from minisgl_core.server.responses_store import ResponseStore
from minisgl_core.server.routes import admit_chat, chat_prompt_ids, name_group
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
            else {"type": "text"},
            **({"verbosity": body.text.verbosity} if body.text and body.text.verbosity else {}),
        },
        "reasoning": body.reasoning.model_dump(exclude_none=True) if body.reasoning else None,
        "truncation": "disabled",
        "background": False,
        "previous_response_id": body.previous_response_id,
        "metadata": body.metadata or {},
        "user": body.user,
        "safety_identifier": body.safety_identifier,
        "prompt_cache_key": body.prompt_cache_key,
        "prompt_cache_retention": body.prompt_cache_retention,
        "max_tool_calls": body.max_tool_calls,
        "service_tier": body.service_tier or "default",
    }


#: how a request names the option that turns storing off
STORE_OFF = "this server stores no responses (--responses-store-size 0)"


def _history(store: ResponseStore, rid: str) -> list[InputItem]:
    """The items a request naming ``rid`` as its ``previous_response_id`` continues; a 400 as
    OpenAI's (its code ``previous_response_not_found``) for one not stored."""
    if not store.enabled:
        raise APIError(
            400,
            f"previous_response_id: {STORE_OFF}: send the whole conversation in input",
            "previous_response_id",
            "unsupported_field",
        )
    conversation = store.conversation(rid)
    if conversation is None:
        raise APIError(
            400,
            f"Previous response with id {short_repr(rid)} not found: it was never stored (store false), was "
            f"deleted, or was evicted (--responses-store-size keeps the latest {store.max_responses})",
            "previous_response_id",
            "previous_response_not_found",
        )
    try:
        return HISTORY.validate_python(conversation)
    except ValidationError:  # (its output items are what this route writes: not expected)
        logger.exception("stored response %s cannot be read back", rid)
        raise APIError(500, f"the stored response {short_repr(rid)} cannot be read back") from None


def _listed(item: dict[str, Any]) -> dict[str, Any]:
    """A stored input item as OpenAI lists it, one of the SDK's ``ResponseItem`` types: status
    ``completed`` where it was sent with none (those types require one), a message's text sent as
    a string its one part (``input_text``, an assistant's ``output_text``: a client iterating
    ``content`` got the string's characters), an assistant's text parts ``output_text`` with their
    annotations and the other roles' ``input_text``."""
    listed = {**item, "status": item.get("status") or "completed"}
    if item.get("type") != "message":
        return listed
    content = item["content"]
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
    if item.get("role") == "assistant":
        parts = [
            part if part["type"] == "refusal" else {"annotations": [], **part, "type": "output_text"}
            for part in parts
        ]
    else:  # (an output_text part sent in a user's message is read as its text)
        parts = [
            {"type": "input_text", "text": part["text"]} if part["type"] == "output_text" else part
            for part in parts
        ]
    return {**listed, "content": parts}


def _not_found(store: ResponseStore, rid: str) -> APIError:
    why = STORE_OFF if not store.enabled else "it was never stored (store false), was deleted, or was evicted"
    return APIError(404, f"Response with id {short_repr(rid)} not found: {why}", "response_id")


def responses_router(
    state: ServerState, options: ApiOptions, tokenizer: ApiTokenizer, store: ResponseStore | None = None
) -> APIRouter:
    """The routes; ``store``: where responses are kept (default: one of
    ``options.responses_store_size`` responses)."""
    router = APIRouter()
    model = state.model
    store = store if store is not None else ResponseStore(options.responses_store_size)

    @router.get("/v1/responses/{response_id}")
    async def get_response(
        response_id: str, stream: bool = False, starting_after: int | None = None
    ) -> Response:
        if stream or starting_after is not None:
            # (the JSON answer, read by a client as the stream it asked for, was no event at all)
            raise APIError(
                400,
                "a stored response is answered whole: minisgl keeps no events to stream again; GET it "
                "without stream (or send the request itself with stream true)",
                "stream" if stream else "starting_after",
                "unsupported_field",
            )
        stored = store.get(response_id)
        if stored is None:
            raise _not_found(store, response_id)
        return Response(stored.response, media_type="application/json")

    @router.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str) -> dict[str, Any]:
        if not store.delete(response_id):
            raise _not_found(store, response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    @router.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(response_id: str) -> None:
        """OpenAI's cancel (``client.responses.cancel``) stops a ``background`` response, which
        minisgl never runs: its 400 for a response of another kind (it was a bare 404 "Not
        Found", as for an unknown path), saying what stops one still running."""
        if response_id not in state.named and store.get(response_id) is None:
            raise _not_found(store, response_id)
        raise APIError(
            400,
            "Cannot cancel a synchronous response: minisgl runs no background responses; "
            f'POST /abort_request {{"rid": {json.dumps(response_id)}}} ends one still running, as cancelled',
            "response_id",
        )

    @router.get("/v1/responses/{response_id}/input_items")
    async def list_input_items(
        response_id: str,
        limit: int = Query(default=20, ge=1, le=100),
        order: Literal["asc", "desc"] = "desc",
        after: str | None = None,
    ) -> dict[str, Any]:
        """OpenAI's list of the items a stored response ran on (``desc``: the latest first),
        ``after`` the id of the last item of the page before."""
        stored = store.get(response_id)
        if stored is None:
            raise _not_found(store, response_id)
        items = [_listed(item) for item in json.loads(stored.input_items)]
        if order == "desc":
            items.reverse()
        if after is not None:
            at = next((i for i, item in enumerate(items) if item.get("id") == after), None)
            if at is None:
                raise APIError(
                    400,
                    f"after: no input item {short_repr(after)} in response {short_repr(response_id)}",
                    "after",
                )
            items = items[at + 1 :]
        page = items[:limit]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0].get("id") if page else None,
            "last_id": page[-1].get("id") if page else None,
            "has_more": len(items) > limit,
        }

    @router.post("/v1/responses/input_tokens")
    async def count_input_tokens(body: InputTokensRequest) -> dict[str, Any]:
        """OpenAI's ``client.responses.input_tokens.count``: the tokens of the prompt the same
        request would run on (its ``usage.input_tokens``): ``previous_response_id``'s conversation,
        ``instructions``, ``input``, the tools and the reasoning effort, rendered by the chat
        template as ``POST /v1/responses`` renders them; nothing runs."""
        model.check_name(body.model)
        history = _history(store, body.previous_response_id) if body.previous_response_id is not None else []
        chat, origins = body.chat_request(history)
        with responses_names(origins):
            ids = await chat_prompt_ids(state, options, chat, tokenizer)
        return {"object": "response.input_tokens", "input_tokens": len(ids)}

    @router.post("/v1/responses/compact")
    async def compact_response() -> None:
        """OpenAI's ``client.responses.compact`` returns the conversation shrunk to an encrypted
        ``compaction`` item that only OpenAI's models read: minisgl has no such thing to make
        (its 405 "Method Not Allowed" named no reason, for GET /v1/responses/{id} has the path)."""
        raise APIError(
            400,
            "POST /v1/responses/compact is not supported: minisgl makes no compaction items (OpenAI's "
            "are encrypted, for its models to read); send the conversation in input, or continue a "
            "stored response with previous_response_id",
        )

    @router.post("/v1/responses")
    async def create_response(body: ResponsesRequest, request: Request) -> Response:
        model.check_name(body.model)
        # the client's id for /abort_request (the response's own id is known only once it is
        # answered, unless streamed): the X-Request-Id header, as on the chat route; not the response's id
        given = client_request_id(request, None)
        history = _history(store, body.previous_response_id) if body.previous_response_id is not None else []
        chat, origins = body.chat_request(history)
        with responses_names(origins):
            admitted = await admit_chat(state, options, chat, tokenizer)
        group = admitted.group
        rid, created = new_id("resp"), int(time.time())
        # (/abort_request finds it by the client's id, and by its own, which a stream's first event gives)
        name_group(group, given, rid)
        echo = echo_fields(body, admitted.params, model.name)
        conversation = body.stored_items(history) if body.store and store.enabled else []

        def kept(response: dict[str, Any]) -> dict[str, Any]:
            if body.store:
                store.put(response, conversation)
            return response

        def usage_of(output_tokens: int, stream: EventStream) -> dict[str, Any]:
            reasoning = stream.reasoning_tokens(output_tokens)
            return usage(group.prompt_tokens, output_tokens, reasoning, group.cached_tokens)

        def build(choices: list[r.Choice]) -> dict[str, Any]:
            (choice,) = choices
            stream = read_whole(admitted.new_output(), choice, body.logprobs)
            status = _status(choice.finish_reason)
            output_tokens = len(choice.token_ids)
            return kept(
                response_object(rid, created, echo, stream.items, status, usage_of(output_tokens, stream))
            )

        async def events() -> AsyncIterator[str]:
            stream = EventStream(body.logprobs)
            output = admitted.new_output()
            for event in stream.start(response_object(rid, created, echo, [], "in_progress")):
                yield event
            output_tokens, finish = 0, None
            try:
                async for delta in group.deltas():
                    if delta.finish_reason == "error":
                        error, param = delta.error or "the request failed", delta.error_param
                        if delta.error_status == 400:  # (the engine's: it names the chat request's fields)
                            error = responses_renamed(error, origins)
                            param = responses_renamed(param, origins) if param else param
                        for event in _failed(stream, rid, created, echo, error, delta.error_status,
                                             param, delta.error_code, kept):  # fmt: skip
                            yield event
                        return
                    output_tokens += len(delta.token_ids)
                    finish = delta.finish_reason or finish
                    for event in stream.read(output, delta):
                        yield event
                status = _status(finish)
                for event in stream.finish(status != "completed"):
                    yield event
                final = kept(
                    response_object(rid, created, echo, stream.items, status, usage_of(output_tokens, stream))
                )
                yield stream.event(_last_event(status), response=final)
            # an error raised while streaming (a parser plugin's, or a bug): the status line went
            # out with the first event, so it is an event too, as on the chat route
            except APIError as exc:
                for event in _failed(
                    stream, rid, created, echo, exc.message, exc.status, exc.param, exc.code, kept
                ):
                    yield event
            except Exception as exc:
                logger.exception("a response stream failed")
                message = f"internal error: {type(exc).__name__}: {exc}"[:500]
                for event in _failed(stream, rid, created, echo, message, 500, None, None, kept):
                    yield event

        with responses_names(origins):  # (a 400 the engine found, answered whole)
            return with_request_id(await respond(group, request, body.stream, events, build), given, rid)

    return router


def _status(finish_reason: str | None) -> str:
    """A response's status from how its choice finished: ``incomplete`` at max_output_tokens,
    ``cancelled`` when /abort_request ended it (OpenAI's status of a cancelled response; it keeps
    what was made, its last item ``incomplete``), else ``completed``."""
    return {"length": "incomplete", "abort": "cancelled"}.get(finish_reason or "", "completed")


def _last_event(status: str) -> str:
    """The event that ends a stream of that status: ``response.completed`` or
    ``response.incomplete``; a cancelled response's too, for OpenAI's stream events have no
    ``response.cancelled`` (a client read that type as another event: the SDK's
    ``ResponseStreamEvent`` union made it a ``response.audio.delta``), and the response it carries
    ended short of its end, as an incomplete one, with what it made (its status ``cancelled``)."""
    return "response.completed" if status == "completed" else "response.incomplete"


def _failed(
    stream: EventStream,
    rid: str,
    created: int,
    echo: dict[str, Any],
    message: str,
    status: int,
    param: str | None,
    code: str | None,
    kept: Callable[[dict[str, Any]], dict[str, Any]],
) -> list[str]:
    """An error mid-stream: an ``error`` event with the status's code (``request_timeout``...), then
    ``response.failed`` with what was generated so far (``kept``: stored, if the request asked)."""
    failure = {"code": "server_error" if status >= 500 else "invalid_prompt", "message": message}
    failed = kept(response_object(rid, created, echo, stream.items, "failed", error=failure))
    return [
        stream.event("error", code=code or failure["code"], message=message, param=param),
        stream.event("response.failed", response=failed),
    ]
