"""Routes outside the OpenAI API: the native /generate, /metrics, and /health (never behind the key)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from minisgl_core.server import responses as r
from minisgl_core.server.errors import sse_error
from minisgl_core.server.handling import check_sampling, respond
from minisgl_core.server.schemas import GenerateRequest
from minisgl_core.server.state import RequestGroup, ServerState


def native_router(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.post("/generate")
    async def generate(body: GenerateRequest, request: Request) -> Response:
        fields = body.sampling_fields()
        check_sampling(
            fields, {"max_tokens": "sampling_params.max_new_tokens", "logprobs": "top_logprobs_num"}
        )
        group = RequestGroup(state)
        await group.add(
            fields,
            1,
            text=body.text,
            input_ids=body.input_ids,
            max_tokens_field="sampling_params.max_new_tokens",
            grammar_field=body.sampling_params.grammar_field,
        )
        rid = r.new_id("gen")

        async def chunks() -> AsyncIterator[str]:
            choice = r.Choice(0)
            async for delta in group.deltas():
                if delta.finish_reason == "error":
                    yield sse_error(delta.error)
                    return
                choice.merge(delta)
                if delta.text or delta.finish_reason is not None:
                    yield r.sse(
                        r.generate_result(
                            rid, choice, group.prompt_tokens, group.arrival, body.return_logprob
                        )
                    )
            yield r.DONE

        def build(choices: list[r.Choice]) -> dict:
            return r.generate_result(rid, choices[0], group.prompt_tokens, group.arrival, body.return_logprob)

        return await respond(group, request, body.stream, chunks, build)

    @router.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")

    return router


def health_router(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health() -> JSONResponse:
        if state.failure is not None:
            return JSONResponse({"status": "failed", "error": state.failure}, status_code=503)
        return JSONResponse({"status": "ok"})

    return router
