"""The OpenAI-compatible routes: /v1/chat/completions, /v1/completions and /v1/models.

Each route validates its body (schemas), opens a RequestGroup on the server state, adds its
prompts (a 400 comes back here, before any streaming starts), then streams SSE chunks or waits for
the whole answer. Leaving a route for any reason closes the group, which aborts what is unfinished.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response

from minisgl_core.server import responses as r
from minisgl_core.server.errors import APIError, sse_error
from minisgl_core.server.handling import check_sampling, respond
from minisgl_core.server.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from minisgl_core.server.state import RequestGroup, ServerState


def make_router(state: ServerState) -> APIRouter:
    router = APIRouter()
    model = state.model

    def check_model(body: SamplingFields) -> None:
        if body.model is not None and body.model not in (model.name, model.path):
            raise APIError(
                404,
                f"the model {body.model!r} does not exist; this server serves {model.name!r}",
                "model",
                "model_not_found",
            )

    # ---------------------------------------------------------------- chat

    @router.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        check_model(body)
        fields = body.sampling_fields()
        check_sampling(fields, {"max_tokens": body.max_tokens_field, "logprobs": "top_logprobs"})
        group = RequestGroup(state)
        await group.add(
            fields,
            body.n,
            messages=body.template_messages(),
            max_tokens_field=body.max_tokens_field,
            grammar_field=body.grammar_field,
        )
        rid, created = r.new_id("chatcmpl"), int(time.time())

        async def chunks() -> AsyncIterator[str]:
            for i in range(group.num_choices):
                yield r.sse(r.chat_chunk(rid, model.name, created, i, {"role": "assistant", "content": ""}))
            completion_tokens = 0
            async for delta in group.deltas():
                if delta.finish_reason == "error":
                    yield sse_error(delta.error)
                    return
                completion_tokens += len(delta.token_ids)
                if not delta.text and delta.finish_reason is None and not delta.logprobs:
                    continue
                yield r.sse(
                    r.chat_chunk(
                        rid,
                        model.name,
                        created,
                        delta.index,
                        {"content": delta.text} if delta.text else {},
                        logprobs=r.chat_logprobs(delta.logprobs) if delta.logprobs else None,
                        finish_reason=delta.finish_reason,
                    )
                )
            if body.include_usage:
                yield r.sse(
                    r.usage_chunk(
                        rid,
                        model.name,
                        created,
                        "chat.completion.chunk",
                        group.prompt_tokens,
                        completion_tokens,
                    )
                )
            yield r.DONE

        def build(choices: list[r.Choice]) -> dict:
            return r.chat_completion(rid, model.name, choices, group.prompt_tokens, body.logprobs)

        return await respond(group, request, body.stream, chunks, build)

    # ---------------------------------------------------------------- completions

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        check_model(body)
        fields = body.sampling_fields()
        check_sampling(fields, {})
        try:
            prompts = body.prompts()
        except ValueError as exc:
            raise APIError(400, str(exc), "prompt") from exc
        group = RequestGroup(state)
        try:
            for prompt in prompts:
                if isinstance(prompt, str):
                    await group.add(fields, body.n, text=prompt, grammar_field=body.grammar_field)
                else:
                    await group.add(fields, body.n, input_ids=prompt, grammar_field=body.grammar_field)
        except BaseException:
            group.close()  # the prompts admitted before the bad one
            raise
        rid, created = r.new_id("cmpl"), int(time.time())
        with_logprobs = body.logprobs is not None

        async def chunks() -> AsyncIterator[str]:
            completion_tokens = 0
            offsets = [0] * group.num_choices
            async for delta in group.deltas():
                if delta.finish_reason == "error":
                    yield sse_error(delta.error)
                    return
                completion_tokens += len(delta.token_ids)
                if not delta.text and delta.finish_reason is None and not delta.logprobs:
                    continue
                logprobs = None
                if delta.logprobs:
                    logprobs = r.completion_logprobs(delta.logprobs, offsets[delta.index])
                offsets[delta.index] += len(delta.text)
                yield r.sse(
                    r.completion_chunk(
                        rid,
                        model.name,
                        created,
                        delta.index,
                        delta.text,
                        logprobs=logprobs,
                        finish_reason=delta.finish_reason,
                    )
                )
            if body.include_usage:
                yield r.sse(
                    r.usage_chunk(
                        rid, model.name, created, "text_completion", group.prompt_tokens, completion_tokens
                    )
                )
            yield r.DONE

        def build(choices: list[r.Choice]) -> dict:
            return r.completion(rid, model.name, choices, group.prompt_tokens, with_logprobs)

        return await respond(group, request, body.stream, chunks, build)

    # ---------------------------------------------------------------- info

    @router.get("/v1/models")
    async def models() -> dict:
        return {
            "object": "list",
            "data": [
                {
                    "id": model.name,
                    "object": "model",
                    "created": state.created,
                    "owned_by": "minisgl",
                    "root": model.path,
                    "max_model_len": model.max_context_len,
                }
            ],
        }

    return router
