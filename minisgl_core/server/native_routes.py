"""Routes outside the OpenAI API: the native /generate, /metrics, the model and server info a router
asks for, and /health and /ping (never behind the key)."""

from __future__ import annotations

import asyncio
import time
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
from minisgl_core.server.schemas import (
    AbortRequestBody,
    ContinueGenerationBody,
    GenerateItem,
    GenerateRequest,
    PauseGenerationBody,
    UpdateWeightsBody,
)
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


def native_names(prefix: str) -> dict[str, str]:
    """NATIVE_NAMES for sampling_params at ``prefix`` (``sampling_params.2`` in a batch)."""
    return {
        name: f"{prefix}.{spelled.split('.', 1)[1]}" if spelled.startswith("sampling_params.") else spelled
        for name, spelled in NATIVE_NAMES.items()
    }


def _prepare(item: GenerateItem, state: ServerState) -> tuple[SamplingParams, bool, dict[str, str]]:
    """A /generate prompt's SamplingParams, whether it only scores its prompt, and what the
    errors call its fields; a 400 for a bad field, before anything is admitted."""
    names = {
        **native_names(item.sampling_prefix),
        "grammar": item.sampling.grammar_field(item.sampling_prefix),
    }
    # what SamplingParams' and admission's messages call these fields, as this body does
    spelled = {
        "max_tokens": names["max_tokens"],
        "min_tokens": names["min_tokens"],
        "prompt": item.prompt_field,
    }
    # max_new_tokens 0 (SGLang's way to score a prompt): no new text, the prompt's logprobs
    # if asked; one token is generated and dropped (messages say "max_tokens 0", renamed)
    score_only = item.sampling.max_new_tokens == 0
    fields = item.sampling_fields()
    with fields_named(spelled):
        if score_only:
            fields = score_only_fields(fields, "max_tokens 0")
        params = sampling_params(fields, names, state.model)
    if item.input_ids is not None:
        check_token_ids(item.input_ids, state.model.vocab_size, item.prompt_field)
    return params, score_only, spelled


def native_router(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.post("/generate")
    async def generate(body: GenerateRequest, request: Request) -> Response:
        """One prompt, or SGLang's batch; each prompt with ``n`` samples. One prompt with one
        sample answers an object; otherwise a list of them in prompt order (a prompt's samples
        together), and a stream's chunks carry their place in it as ``index``."""
        items = body.items()
        given = client_request_id(request, body.rid if isinstance(body.rid, str) else None)
        # every prompt's fields are checked before any is admitted
        prepared = [_prepare(item, state) for item in items]
        total = sum(item.sampling.n for item in items)
        single = body.batch_size is None and total == 1
        group = RequestGroup(state)
        group.set_timeout(body.timeout)
        # SGLang's priority runs larger values first (its default; vLLM's and ours: lower first)
        group.set_priority(-body.priority)
        if not single:
            # (the sequences a refusal blames: a batch's prompts, else the one prompt's n)
            prompt = "text" if body.text is not None else "input_ids"
            group.expect(total, "sampling_params.n" if body.batch_size is None else prompt)
        with group.admitting():  # (a prompt refused withdraws those admitted before it)
            for i, (item, (params, score_only, spelled)) in enumerate(zip(items, prepared)):
                with fields_named(spelled), room_to_score(score_only, state.model, "max_tokens 0"):
                    await group.add(
                        params,
                        item.sampling.n,
                        text=item.text,
                        input_ids=item.input_ids,
                        max_tokens_field=spelled["max_tokens"],
                        grammar_field=item.sampling.grammar_field(item.sampling_prefix),
                        # (the engine's 400s name these two; "stop" or "prompt" in its messages are words)
                        field_names={name: spelled[name] for name in ("max_tokens", "min_tokens")},
                        default_max_tokens=GENERATE_DEFAULT_MAX_TOKENS,
                    )
                prompt_tokens = group.choice_prompt_tokens[-1]
                if item.return_logprob and item.logprob_start_len >= prompt_tokens:
                    # (known once the prompt is tokenized; the admitted requests are withdrawn):
                    # past the prompt, input_token_logprobs came back empty, silently
                    name = (
                        f"logprob_start_len.{i}"
                        if isinstance(body.logprob_start_len, list)
                        else "logprob_start_len"
                    )
                    raise APIError(
                        400,
                        f"{name} {short_repr(item.logprob_start_len)} is past the prompt, which has "
                        f"{prompt_tokens} tokens: give a position in [0, {prompt_tokens - 1}], "
                        "or -1 for no input logprobs",
                        name,
                    )
        # each choice's prompt (its place in items) and its place among that prompt's samples
        owner = [(i, sample) for i, item in enumerate(items) for sample in range(item.sampling.n)]
        base = given or r.new_id("gen")

        def choice_id(index: int) -> str:
            """The answer's meta_info.id: a batch's rid list gives each prompt its own (its samples
            with their number after it), else the request's id with the answer's index after it
            (an X-Request-Id header wins over the rids, as over one rid)."""
            i, sample = owner[index]
            if single:
                return base
            if given is None and isinstance(body.rid, list):
                rid = items[i].rid
                return rid if items[i].sampling.n == 1 else f"{rid}-{sample}"
            return f"{base}-{index}"

        # what /abort_request finds it by: the request's id (given or its own) and any rid of the
        # body's (the header won over it), a batch's rid list each its prompt's samples, and
        # each answer's own id
        group.name(base)
        if isinstance(body.rid, str) and body.rid != base:
            group.name(body.rid)
        first = 0
        for i, item in enumerate(items):
            if isinstance(body.rid, list):
                group.name(body.rid[i], range(first, first + item.sampling.n))
            first += item.sampling.n
        if not single:
            for index in range(total):
                group.name(choice_id(index), range(index, index + 1))

        def result(choice: r.Choice) -> dict:
            item = items[owner[choice.index][0]]
            return r.generate_result(
                choice_id(choice.index),
                choice,
                group.choice_prompt_tokens[choice.index],
                group.arrival,
                item.return_logprob,
                item.logprob_start_len,
                body.return_text_in_logprobs,
                group.choice_cached_tokens.get(choice.index, 0),
                # (a weight update waits for running requests, and those arriving meanwhile wait
                # for it: whatever answered ran on the weights named now)
                state.weight_version,
            )

        def score_only(index: int) -> bool:
            return prepared[owner[index][0]][1]

        async def chunks() -> AsyncIterator[str]:
            choices = [r.Choice(i) for i in range(group.num_choices)]
            async for delta in group.deltas():
                if delta.finish_reason == "error":
                    # The status line went out long ago: the error is an event, and [DONE] still
                    # tells the client the stream ended on purpose.
                    yield sse_error(delta.error, delta.error_status, delta.error_param, delta.error_code)
                    yield r.DONE
                    return
                if score_only(delta.index):
                    drop_generated(delta)
                choice = choices[delta.index]
                choice.merge(delta)
                # a chunk for every token, as SGLang's: one whose text is held back (part of a
                # UTF-8 character, or of what may be a stop string) still shows in output_ids
                if delta.text or delta.token_ids or delta.finish_reason is not None:
                    chunk = result(choice)
                    if not single:
                        chunk["index"] = delta.index
                    yield r.sse(chunk)
            yield r.DONE

        def build(choices: list[r.Choice]) -> dict | list[dict]:
            for choice in choices:
                if score_only(choice.index):
                    drop_generated(choice)
            answers = [result(choice) for choice in choices]
            return answers[0] if single else answers

        return with_request_id(await respond(group, request, body.stream, chunks, build), given, base)

    @router.post("/abort_request")
    async def abort_request(body: AbortRequestBody) -> dict[str, int]:
        """SGLang's: end the requests named ``rid`` (a client's id: X-Request-Id, request_id, rid,
        a batch's rid for its prompt; or an answer's: ``gen-...``, ``chatcmpl-...``, ``cmpl-...``),
        or all with ``abort_all``; each ends with what it produced so far, finish reason
        ``abort``. The number of choices ended: 0 for an unknown rid, which SGLang ignores."""
        request_id = None if body.abort_all else body.rid
        return {"aborted": state.abort_requests(request_id, body.abort_message)}

    @router.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")

    return router


#: the routes never behind the API key: the health checks of load balancers and of SageMaker
PUBLIC_PATHS = frozenset({"/health", "/ping"})


def health_router(state: ServerState) -> APIRouter:
    """/health, and SageMaker's /ping (GET and POST), the same handler."""
    router = APIRouter()

    @router.get("/health")
    async def health() -> JSONResponse:
        """200 while the engine makes progress; 503 once a worker failed, stopped or went silent."""
        problem = state.health()
        if problem is not None:
            return JSONResponse({"status": "unhealthy", "error": problem}, status_code=503)
        return JSONResponse({"status": "ok"})

    for method in ("GET", "POST"):
        router.add_api_route(
            "/ping", health, methods=[method], name="ping", operation_id=f"ping_{method.lower()}"
        )
    return router


def info_router(state: ServerState, info: dict[str, Any]) -> APIRouter:
    """What routers such as the SGLang Model Gateway ask a worker: a health check that runs the
    engine, and the model and server descriptions (behind the API key like the rest)."""
    router = APIRouter()
    model = state.model

    @router.get("/health_generate")
    async def health_generate() -> JSONResponse:
        """Healthy if one greedy token comes out of the engine within the health bound, or the
        engine shows meanwhile that it is busy with other work (:func:`_probe`); not while a step
        has run past --step-timeout."""
        problem = state.serving_problem()
        if problem is None and state.paused is not None:
            problem = "generation is paused (/pause_generation); POST /continue_generation resumes it"
        if problem is None:
            problem = await _probe(state)
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
            "weight_version": state.weight_version,
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
            # ids /abort_request can name now (RequestGroup.name)
            "abortable_ids": len(state.named),
            # /pause_generation's mode while generation is paused, else None
            "paused": state.paused,
            # /update_weights_from_disk's token_step (weight_version is in model_info)
            "token_step": state.token_step,
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

    async def update_weights_from_disk(body: UpdateWeightsBody) -> JSONResponse:
        """New weights for the served model from ``model_path`` (SGLang's; RL trainers call it
        between rollouts): a checkpoint of the same config, loaded beside the served weights and
        copied in once every rank has it, then the prefix cache emptied (``flush_cache``). It
        waits for the requests running to finish (``abort_all_requests``: ends them now), and
        requests arriving meanwhile wait for the new weights. SGLang's answer, ``success`` false
        with OpenAI's error beside it (a 400) when the old weights serve on."""
        try:
            aborted = await state.update_weights(
                body.model_path, body.flush_cache, body.abort_all_requests, body.keep_pause
            )
        except APIError as exc:
            if exc.status != 400:
                raise
            failed = {"success": False, "message": exc.message, "num_paused_requests": 0}
            return JSONResponse({**exc.body(), **failed}, status_code=400)
        if body.weight_version is not None:
            state.weight_version = body.weight_version
        state.token_step = body.token_step
        ended = f"; {aborted} unfinished choices aborted" if aborted else ""
        message = f"weights updated from {body.model_path}{ended}"
        return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})

    async def pause_generation(body: PauseGenerationBody | None = None) -> dict[str, str]:
        """SGLang's: the engine stops generating once its step in flight has landed, until
        /continue_generation (RL trainers pause rollouts to update the weights). Requests arriving
        meanwhile are accepted and wait. ``mode`` says what becomes of the unfinished ones:
        ``abort`` (the default) ends them, each with what it made; ``retract`` gives their KV back,
        to be computed again after; ``in_place`` keeps it. /update_weights_from_disk runs at once
        while paused."""
        mode = (body or PauseGenerationBody()).mode
        await state.pause_generation(mode)
        return {"message": "Generation paused successfully.", "status": "ok"}

    async def continue_generation(body: ContinueGenerationBody | None = None) -> dict[str, str]:
        """SGLang's: generation paused by /pause_generation goes on; the requests that arrived
        meanwhile run."""
        await state.continue_generation()
        return {"message": "Generation continued successfully.", "status": "ok"}

    def weight_version() -> dict[str, str]:
        """The served weights' name: ``default``, or the last /update_weights_from_disk's
        ``weight_version``."""
        return {"weight_version": state.weight_version}

    router.add_api_route("/update_weights_from_disk", update_weights_from_disk, methods=["POST"])
    router.add_api_route("/get_weight_version", weight_version, methods=["GET"])
    router.add_api_route("/pause_generation", pause_generation, methods=["POST"])
    router.add_api_route("/continue_generation", continue_generation, methods=["POST"])
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
#: how often /health_generate looks whether the engine is busy while its probe waits
_PROBE_POLL_S = 0.25


async def _probe(state: ServerState) -> str | None:
    """Run one greedy token through the whole pipeline: None (healthy) once it comes back, or once
    the engine shows it is busy with other work, as SGLang counts any output: a step in flight
    (its heartbeat; one prefill step takes minutes on a CPU, and the probe waits behind it) or
    other requests' tokens (the probe queued behind them). Else why not, once the health bound
    has passed or the server cannot serve (a step past --step-timeout)."""
    group = RequestGroup(state, probe=True)
    sent = time.monotonic()

    async def token() -> str | None:
        try:
            await group.add(_PROBE, 1, input_ids=[0])
        except APIError as exc:  # a full queue (429) is busy, not broken
            return None if exc.status == 429 else exc.message
        async for delta in group.deltas():
            if delta.finish_reason == "error":
                return delta.error
        return None

    answer = asyncio.ensure_future(token())
    try:
        while not answer.done():
            await asyncio.wait({answer}, timeout=_PROBE_POLL_S)
            if answer.done():
                break
            if (problem := state.serving_problem()) is not None:
                return problem
            if state.busy_since(sent):
                return None
            if (waited := time.monotonic() - sent) > (bound := state.limits.health_timeout_s):
                return (
                    f"the probe's token did not come within {waited:.1f}s (bound {bound:g}s), and the "
                    "engine showed no other work meanwhile"
                )
        return answer.result()
    finally:
        answer.cancel()
        group.close()


def minisgl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("minisgl-core")
    except PackageNotFoundError:
        return "unknown"
