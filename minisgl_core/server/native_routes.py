"""Routes outside the OpenAI API: the native /generate, /metrics, the model and server info a router
asks for, and /health (never behind the key)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from minisgl_core.sampling import SamplingParams, short_repr
from minisgl_core.server import responses as r
from minisgl_core.server.errors import APIError, sse_error
from minisgl_core.server.handling import (
    check_token_ids,
    client_request_id,
    drop_generated,
    respond,
    room_to_score,
    sampling_params,
    score_only_fields,
    with_request_id,
)
from minisgl_core.server.routes import fields_named
from minisgl_core.server.schemas import GenerateRequest
from minisgl_core.server.state import RequestGroup, ServerState

#: /generate's max_new_tokens when the request and the model's generation config leave it unset:
#: SGLang's default (the rest of the context held a client's CPU for minutes)
GENERATE_DEFAULT_MAX_TOKENS = 128

#: SamplingParams field -> the native body's name for it, as errors name it
NATIVE_NAMES = {
    **{
        name: f"sampling_params.{name}"
        for name in (
            "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "seed",
            "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
        )
    },
    "max_tokens": "sampling_params.max_new_tokens",
    "min_tokens": "sampling_params.min_new_tokens",
    "logprobs": "top_logprobs_num",
    "prompt_logprobs": "top_logprobs_num",
}  # fmt: skip


def native_router(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.post("/generate")
    async def generate(body: GenerateRequest, request: Request) -> Response:
        given = client_request_id(request, body.rid)
        names = {**NATIVE_NAMES, "grammar": body.sampling_params.grammar_field}
        # what SamplingParams' and admission's messages call these fields, as this body does
        spelled = {
            "max_tokens": NATIVE_NAMES["max_tokens"],
            "min_tokens": NATIVE_NAMES["min_tokens"],
            "prompt": "text" if body.text is not None else "input_ids",
        }
        # max_new_tokens 0 (SGLang's way to score a prompt): no new text, the prompt's logprobs
        # if asked; one token is generated and dropped (messages say "max_tokens 0", renamed)
        score_only = body.sampling_params.max_new_tokens == 0
        fields = body.sampling_fields()
        with fields_named(spelled):
            if score_only:
                fields = score_only_fields(fields, "max_tokens 0")
            params = sampling_params(fields, names, state.model)
        if body.input_ids is not None:
            check_token_ids(body.input_ids, state.model.vocab_size, "input_ids")
        group = RequestGroup(state)
        group.set_timeout(body.timeout)
        # SGLang's priority runs larger values first (its default; vLLM's and ours: lower first)
        group.set_priority(-body.priority)
        with fields_named(spelled), room_to_score(score_only, state.model, "max_tokens 0"):
            await group.add(
                params,
                1,
                text=body.text,
                input_ids=body.input_ids,
                max_tokens_field=NATIVE_NAMES["max_tokens"],
                grammar_field=body.sampling_params.grammar_field,
                default_max_tokens=GENERATE_DEFAULT_MAX_TOKENS,
            )
        if body.return_logprob and body.logprob_start_len >= group.prompt_tokens:
            # (known once the prompt is tokenized; the admitted request is withdrawn): past the
            # prompt, input_token_logprobs came back empty, silently
            group.withdraw()
            raise APIError(
                400,
                f"logprob_start_len {short_repr(body.logprob_start_len)} is past the prompt, which has "
                f"{group.prompt_tokens} tokens: give a position in [0, {group.prompt_tokens - 1}], "
                "or -1 for no input logprobs",
                "logprob_start_len",
            )
        rid = given or r.new_id("gen")

        def result(choice: r.Choice) -> dict:
            return r.generate_result(
                rid,
                choice,
                group.prompt_tokens,
                group.arrival,
                body.return_logprob,
                body.logprob_start_len,
                body.return_text_in_logprobs,
                group.cached_tokens,
            )

        async def chunks() -> AsyncIterator[str]:
            choice = r.Choice(0)
            async for delta in group.deltas():
                if delta.finish_reason == "error":
                    # The status line went out long ago: the error is an event, and [DONE] still
                    # tells the client the stream ended on purpose.
                    yield sse_error(delta.error, delta.error_status, delta.error_param, delta.error_code)
                    yield r.DONE
                    return
                if score_only:
                    drop_generated(delta)
                choice.merge(delta)
                if delta.text or delta.finish_reason is not None:
                    yield r.sse(result(choice))
            yield r.DONE

        def build(choices: list[r.Choice]) -> dict:
            if score_only:
                drop_generated(choices[0])
            return result(choices[0])

        return with_request_id(await respond(group, request, body.stream, chunks, build), given, rid)

    @router.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")

    return router


def health_router(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health() -> JSONResponse:
        """200 while the engine makes progress; 503 once a worker failed, stopped or went silent."""
        problem = state.health()
        if problem is not None:
            return JSONResponse({"status": "unhealthy", "error": problem}, status_code=503)
        return JSONResponse({"status": "ok"})

    return router


def info_router(state: ServerState, info: dict[str, Any]) -> APIRouter:
    """What routers such as the SGLang Model Gateway ask a worker: a health check that runs the
    engine, and the model and server descriptions (behind the API key like the rest)."""
    router = APIRouter()
    model = state.model

    @router.get("/health_generate")
    async def health_generate() -> JSONResponse:
        """Healthy only if one greedy token comes out of the engine within the health bound."""
        problem = state.health()
        if problem is None:
            group = RequestGroup(state, probe=True)
            group.set_timeout(state.limits.health_timeout_s)
            try:
                await group.add(_PROBE, 1, input_ids=[0])
                async for delta in group.deltas():
                    if delta.finish_reason == "error":
                        problem = delta.error
            except APIError as exc:
                if exc.status != 429:  # a full queue is busy, not broken
                    problem = exc.message
            finally:
                group.close()
        if problem is not None:
            return JSONResponse({"status": "unhealthy", "error": problem}, status_code=503)
        return JSONResponse({"status": "ok"})

    def model_info() -> dict[str, Any]:
        return {
            "model_path": model.path,
            "tokenizer_path": model.path,
            "served_model_name": model.name,
            "is_generation": True,
            "max_context_len": model.max_context_len,
            "vocab_size": model.vocab_size,
            "architecture": info.get("architecture"),
        }

    def server_info() -> dict[str, Any]:
        return {
            **model_info(),
            "version": minisgl_version(),
            "kv_capacity_tokens": model.kv_capacity_tokens,
            "tp_size": info.get("tp_size", 1),
            "attn": info.get("attn", []),
            "max_queued_requests": state.limits.max_queued_sequences,
            "queued_or_running": len(state.pending),
        }

    def load() -> list[dict[str, int]]:
        """SGLang's load report (one entry per data-parallel rank; we have one), which load-aware
        routing policies poll; counts from rank 0's latest stats. ``num_tokens`` is the KV held by
        live requests, as SGLang counts it: the prefix cache it can reclaim is not load (a replica
        with a warm cache read as busy)."""
        engine = state.metrics.engine
        held = engine.get("kv_used_tokens", 0) - engine.get("cache_evictable_tokens", 0)
        return [
            {
                "dp_rank": 0,
                "num_reqs": engine.get("running", 0) + engine.get("waiting", 0),
                "num_waiting_reqs": engine.get("waiting", 0),
                "num_tokens": max(0, held),
            }
        ]

    async def flush_cache() -> dict[str, Any]:
        """Empty the prefix cache (SGLang's /flush_cache; vLLM's /reset_prefix_cache), e.g.
        between benchmark runs so that one run's prompts are not another's cache hits. Refused
        (400) while requests are running or waiting."""
        return {"status": "ok", "flushed_tokens": await state.flush_cache()}

    # POST only (SGLang's route takes GET too; here a GET, and so a HEAD probe, changes nothing)
    for path in ("/flush_cache", "/reset_prefix_cache"):
        router.add_api_route(path, flush_cache, methods=["POST"], name=path[1:], operation_id=path[1:])
    # Both spellings: SGLang's older /get_* names and its newer ones.
    router.add_api_route("/get_load", load, methods=["GET"])
    router.add_api_route("/get_model_info", model_info, methods=["GET"])
    router.add_api_route("/model_info", model_info, methods=["GET"])
    router.add_api_route("/get_server_info", server_info, methods=["GET"])
    router.add_api_route("/server_info", server_info, methods=["GET"])
    return router


#: the smallest request that runs the engine: one greedy token
_PROBE = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


def minisgl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("minisgl-core")
    except PackageNotFoundError:
        return "unknown"
