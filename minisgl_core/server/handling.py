"""What every generating route does the same way: the request's one SamplingParams, then answering from a
RequestGroup as a stream of SSE chunks or as one JSON body, aborting whatever the client abandons."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from minisgl_core.sampling import SamplingParams, cut, merge_sampling, short_repr
from minisgl_core.server.errors import APIError, sse_error
from minisgl_core.server.responses import DONE, Choice
from minisgl_core.server.schemas import MAX_REQUEST_ID_CHARS, header_text, header_value_problem
from minisgl_core.server.state import ModelInfo, RequestGroup

logger = logging.getLogger(__name__)

#: status for a request whose client left before the answer (nginx's convention; nobody reads it)
CLIENT_CLOSED = 499


def sampling_params(fields: dict[str, Any], rename: dict[str, str], model: ModelInfo) -> SamplingParams:
    """The request's SamplingParams, built and validated here once for every process after this one.

    Field by field: what the request set (None = unset), else the model's default
    (``--generation-config``), else SamplingParams' own (OpenAI's); ``max_tokens`` left unset stays
    None, and admission gives the request what the context leaves (at most the model's default).
    A bad field is a 400 naming it (``rename``: the body's name for a field), before anything
    reaches the workers (an integer past 64 bits cannot even travel there); the model's defaults
    were checked at start."""
    defaults = {k: v for k, v in model.sampling_defaults.items() if k != "max_tokens"}
    try:
        params = SamplingParams(**{**merge_sampling(fields, defaults), "max_tokens": fields["max_tokens"]})
    except ValueError as exc:
        name = str(exc).split(" ", 1)[0]
        message = _as_sent(str(exc), fields.get(name))
        raise APIError(400, message.replace(name, rename.get(name, name), 1), rename.get(name, name)) from exc
    check_token_ids(
        list(params.stop_token_ids), model.vocab_size, rename.get("stop_token_ids", "stop_token_ids")
    )
    return params


def _as_sent(message: str, value: Any) -> str:
    """``message`` showing a list field's value as the client sent it (JSON), not as the Python
    tuple SamplingParams keeps: ``stop must be non-empty strings, got ('',)`` read as Python."""
    if isinstance(value, list):
        kept = f", got {short_repr(tuple(value))}"
        if message.endswith(kept):
            return message[: -len(kept)] + f", got {cut(json.dumps(value, ensure_ascii=False))}"
    return message


# A score-only request (/v1/completions' echo with max_tokens 0, OpenAI's legacy way to score a
# text; /generate's max_new_tokens 0, SGLang's) returns no new text, only the prompt's logprobs if
# asked. The engine generates one token at least: it runs with one and the route drops it.


def score_only_fields(fields: dict[str, Any], asked: str) -> dict[str, Any]:
    """The fields a score-only request runs with: one token, generated and then dropped; a
    ``min_tokens`` is refused (``asked``: how the route's body says score-only, for the message)."""
    if fields.get("min_tokens"):
        raise APIError(400, f"min_tokens: {asked} generates nothing; leave min_tokens at 0", "min_tokens")
    return {**fields, "max_tokens": 1}


@contextmanager
def room_to_score(score_only: bool, model: ModelInfo, asked: str) -> Iterator[None]:
    """A prompt that leaves no room for a score-only request's one token is refused saying so,
    not as the client's max_tokens 0 being 1 (the engine cannot run past the context, nor the
    page table hold a token there)."""
    try:
        yield
    except APIError as exc:
        if not (score_only and exc.code == "context_length_exceeded" and "max_tokens" in exc.message):
            raise
        room = model.max_model_len
        limit = (
            f"the context length {room}" if room == model.max_context_len else f"the KV pool ({room} tokens)"
        )
        exc.message = (
            f"{asked} still generates one token (then drops it), so the prompt must leave room for "
            f"it: at most {room - 1} tokens, {limit} less one; shorten the prompt"
        )
        exc.param = "prompt"
        raise


def drop_generated(delta: Choice) -> None:
    """A score-only request's delta (or whole choice) without the token generated after the
    prompt: a finish by that token (its stop or its length) reads ``length``; an abort or an error
    stays what it is."""
    delta.text, delta.token_ids, delta.logprobs = "", [], []
    if delta.finish_reason in ("stop", "length"):
        delta.finish_reason, delta.matched_stop = "length", None


def check_token_ids(ids: list[int], vocab_size: int, param: str) -> None:
    """Token ids must be the model's: integers in [0, vocab_size), else a 400 naming ``param``."""
    for token in ids:
        if not 0 <= token < vocab_size:
            shown = str(token) if abs(token) < 10**20 else f"{str(token)[:20]}..."
            raise APIError(
                400, f"{param}: token ids must be integers in [0, {vocab_size}), got {shown}", param
            )


async def wait_for_all(group: RequestGroup, request: Request) -> list[Choice] | None:
    """Every choice of the group once finished; None if the client went away first."""
    choices = [Choice(i) for i in range(group.num_choices)]

    async def gather() -> None:
        async for delta in group.deltas():
            choices[delta.index].merge(delta)

    async def client_gone() -> None:
        # The body is already read, so the next ASGI message is the disconnect, whenever it comes.
        while (await request.receive())["type"] != "http.disconnect":
            pass

    answer, gone = asyncio.ensure_future(gather()), asyncio.ensure_future(client_gone())
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
        if answer.done():
            answer.result()
            return choices
        return None
    finally:
        answer.cancel()
        gone.cancel()
        group.close()


def first_error(choices: list[Choice]) -> Choice | None:
    return next((c for c in choices if c.finish_reason == "error"), None)


def client_request_id(request: Request, field: str | None) -> str | None:
    """The id a client gave its request, for the answer's id: the ``X-Request-Id`` header, which
    wins as in vLLM, else the body's field (vLLM's ``request_id``, SGLang's ``rid``); None for
    neither (an empty header is none). A header longer than the field's bound, or one that cannot
    be sent back as it came (a control character: :func:`header_value_problem`), is a 400."""
    header = request.headers.get("x-request-id")
    if not header:
        return field
    if len(header) > MAX_REQUEST_ID_CHARS:
        raise APIError(
            400,
            f"X-Request-Id: at most {MAX_REQUEST_ID_CHARS} characters, got {len(header)}",
            "X-Request-Id",
        )
    if (problem := header_value_problem(header)) is not None:
        raise APIError(400, f"X-Request-Id: {problem}", "X-Request-Id")
    return header


def with_request_id(response: Response, given: str | None, generated: str) -> Response:
    """``response`` with the ``X-Request-Id`` header: the client's id, else the answer's own."""
    response.headers["X-Request-Id"] = header_text(given or generated)
    return response


async def respond(
    group: RequestGroup,
    request: Request,
    stream: bool,
    chunks: Callable[[], AsyncIterator[str]],
    build: Callable[[list[Choice]], dict[str, Any]],
) -> Response:
    """Stream ``chunks()`` as SSE, or wait for every choice and answer ``build(choices)``."""
    if stream:
        return StreamingResponse(_closing(group, chunks), media_type="text/event-stream")
    choices = await wait_for_all(group, request)
    if choices is None:
        return Response(status_code=CLIENT_CLOSED)
    if (failed := first_error(choices)) is not None:
        error = failed.error or "the request failed"
        if group.timed_out:
            raise APIError(504, error, "timeout", "request_timeout")
        if group.state.failure is not None:
            raise APIError(503, error, code="server_unavailable")
        raise APIError(failed.error_status, error, failed.error_param, failed.error_code)
    return JSONResponse(build(choices))


async def _closing(group: RequestGroup, chunks: Callable[[], AsyncIterator[str]]) -> AsyncIterator[str]:
    try:
        async for chunk in chunks():
            yield chunk
            # Let the event loop poll the socket between chunks: a step's chunks (one a choice) were
            # written back to back in one turn of the loop, so after a client left, the server kept
            # writing to the closed socket (asyncio logged "socket.send() raised exception." for
            # each write past the fifth: 40-60 lines for a dropped stream of n=64) before it saw it.
            await asyncio.sleep(0)
    # An error raised while streaming (a parser plugin's, or a bug): the status line went out with
    # the first chunk, so it is an event, then [DONE]; dropping the connection told the client nothing.
    except APIError as exc:
        yield sse_error(exc.message, exc.status, exc.param, exc.code)
        yield DONE
    except Exception as exc:
        logger.exception("a stream failed")
        yield sse_error(f"internal error: {type(exc).__name__}: {exc}"[:500])
        yield DONE
    finally:
        group.close()  # also runs when the client disconnects mid-stream (the task is cancelled)
