"""A busy server is not a broken one: while one scheduler step runs longer than the health bound
(a CPU prefill of ~2,000-token prompts takes a minute), /health_generate answers 200 and the calls
that wait for the scheduler's answer (/flush_cache, /pause_generation, /continue_generation) get
it once the step ends; a step past --step-timeout, or a scheduler gone silent, is a 503. The
tokenizer and the scheduler are played by the test: it admits what the API server sends and
reports as rank 0 does (its step heartbeat's stats carry STEP_MS while a step is in flight).

Found by a probe of the real default model: four 1,900-token prompts in one 60 s prefill step, and
meanwhile /health_generate 503 ("did not finish within its timeout of 20s") and /flush_cache and
/continue_generation 504 ("a long step?"), with /health 200 throughout.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from minisgl_core.messages import (
    STEP_MS,
    Admission,
    ContinueGeneration,
    DetokOutputs,
    FlushCache,
    PauseGeneration,
    TokenizeRequest,
)
from minisgl_core.server.errors import APIError
from minisgl_core.server.limits import ServerLimits
from minisgl_core.server.native_routes import info_router
from minisgl_core.server.state import ModelInfo, ServerState

from .conftest import FakeSocket

#: the health bound of these tests: every step below outlasts it several times
HEALTH_S = 0.3


def make_state(step_timeout_s: float = 60.0) -> ServerState:
    model = ModelInfo(name="m", path="m", max_context_len=2048, kv_capacity_tokens=16384, vocab_size=100)
    limits = ServerLimits(health_timeout_s=HEALTH_S, step_timeout_s=step_timeout_s)
    state = ServerState(None, model, limits=limits)
    state.to_tokenizer = FakeSocket()
    state.loop = asyncio.get_running_loop()
    state.last_report_at = time.monotonic()
    return state


def health_generate(state: ServerState):
    router = info_router(state, {})
    return next(route.endpoint for route in router.routes if route.path == "/health_generate")


async def admit(state: ServerState, sent: list) -> None:
    """The tokenizer admits every prompt sent so far (its requests then wait for the scheduler)."""
    for _ in range(100):
        if state.admissions:
            break
        await asyncio.sleep(0.01)
    for msg in sent:
        if isinstance(msg, TokenizeRequest) and not (fut := state.admissions[msg.rids[0]]).done():
            fut.set_result(Admission(msg.rids[0], prompt_len=1, max_tokens=1))


async def step(state: ServerState, seconds: float, began_ago: float = 0.0, outputs: bool = False) -> None:
    """Rank 0 in one step for ``seconds`` (begun ``began_ago`` before): its heartbeat's stats four
    times a second... here twenty; with ``outputs`` instead many short steps, each with another
    request's token. Then the step's end: stats without STEP_MS."""
    began = time.monotonic() - began_ago
    while time.monotonic() - began < began_ago + seconds:
        if outputs:
            state._dispatch(
                DetokOutputs(
                    rids=[999],
                    token_ids=[5],
                    texts=["x"],
                    finish_reasons=[None],
                    matched_stops=[None],
                    logprobs=[None],
                    errors=[None],
                    prompt_logprobs=[None],
                )  # fmt: skip
            )
        else:
            ran_ms = int((time.monotonic() - began) * 1000)
            state._dispatch(DetokOutputs(stats={"running": 4, "waiting": 0, STEP_MS: ran_ms}))
        await asyncio.sleep(0.05)
    state._dispatch(DetokOutputs(stats={"running": 4, "waiting": 0}))


def answer(state: ServerState, msg, result) -> None:
    """The scheduler's answer to a control message, as the detokenizer passes it on."""
    if isinstance(msg, FlushCache):
        state._dispatch(DetokOutputs(flushed=[[msg.token, result]]))
    else:
        state._dispatch(DetokOutputs(answers=[[msg.token, result]]))


@pytest.mark.parametrize("outputs", [False, True], ids=["one-long-step", "a-queue-of-short-steps"])
def test_health_generate_is_ok_while_the_engine_is_busy_past_the_health_bound(sent, outputs):
    """The probe waits behind a step three times the health bound (or behind other requests whose
    tokens keep coming): healthy, as SGLang counts any output of the engine. It was a 503."""

    async def scenario() -> None:
        state = make_state()
        check = asyncio.ensure_future(health_generate(state)())
        await admit(state, sent)
        await step(state, 3 * HEALTH_S, outputs=outputs)
        resp = await check
        assert resp.status_code == 200, resp.body

    asyncio.run(scenario())


def test_health_generate_says_a_step_past_the_step_bound_is_stuck(sent):
    """A step that never ends keeps its heartbeat reporting (/health 200, as vLLM's): past
    --step-timeout, /health_generate calls the engine stuck and says why."""

    async def scenario() -> None:
        state = make_state(step_timeout_s=1.0)
        check = asyncio.ensure_future(health_generate(state)())
        await admit(state, sent)
        await step(state, 1.0, began_ago=2.0)
        resp = await check
        assert resp.status_code == 503
        assert "step has run for" in resp.body.decode() and "--step-timeout" in resp.body.decode()
        assert state.health() is None  # (/health: alive)

    asyncio.run(scenario())


def test_health_generate_is_a_503_when_nothing_comes_out_of_an_idle_engine(sent):
    """The scheduler idle and reporting, the probe admitted but never answered (a pipeline
    wedged between them): unhealthy within the health bound, as before."""

    async def scenario() -> None:
        state = make_state()
        check = asyncio.ensure_future(health_generate(state)())
        await admit(state, sent)
        started = time.monotonic()
        while not check.done():
            state._dispatch(DetokOutputs(stats={"running": 0, "waiting": 0}))  # the idle heartbeat
            await asyncio.sleep(0.05)
        resp = await check
        assert resp.status_code == 503 and "did not come" in resp.body.decode()
        assert time.monotonic() - started < HEALTH_S + 1

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "call, result, expected",
    [
        ("flush", 12, 12),
        ("pause", "", 0),
        ("continue", "", None),
    ],
)
def test_control_calls_get_their_answer_after_a_step_longer_than_the_health_bound(
    sent, call, result, expected
):
    """The scheduler reads control messages between steps, so one sent during a long step is
    answered once it ends: the call waits for it, as SGLang's and vLLM's do. It was a 504 past the
    health bound, saying the action would happen anyway (a client retrying it did it twice)."""

    async def scenario() -> None:
        state = make_state()
        if call == "continue":
            state.paused = "in_place"
        run = {
            "flush": state.flush_cache,
            "pause": lambda: state.pause_generation("in_place"),
            "continue": state.continue_generation,
        }[call]
        calling = asyncio.ensure_future(run())
        await step(state, 3 * HEALTH_S)
        assert not calling.done()
        answer(state, sent[-1], result)
        assert await calling == expected
        assert state.paused == ("in_place" if call == "pause" else None)
        assert len(sent) == 1  # sent once

    asyncio.run(scenario())


def test_control_calls_give_up_with_a_503_when_the_step_is_stuck_or_the_scheduler_silent(sent):
    """A step past --step-timeout, or a scheduler that stopped reporting (no heartbeat: stopped or
    stuck outside a step): 503 saying why, and a pause sent all the same counts as paused (a
    SIGTERM's drain then continues the engine, tests/server/test_pause_unanswered.py)."""

    async def scenario() -> None:
        state = make_state(step_timeout_s=1.0)
        flushing = asyncio.ensure_future(state.flush_cache())
        await asyncio.sleep(0.01)  # sent while the step was younger than the bound
        await step(state, 2.0, began_ago=0.5)
        with pytest.raises(APIError) as caught:
            await flushing
        assert caught.value.status == 503 and "--step-timeout" in caught.value.message
        assert [type(m) for m in sent] == [FlushCache]

        state = make_state()
        with pytest.raises(APIError) as caught:
            await state.pause_generation("retract")  # nothing reports from here on
        assert caught.value.status == 503 and "has not reported" in caught.value.message
        assert state.paused == "retract" and isinstance(sent[-1], PauseGeneration)
        state.start_draining()
        assert isinstance(sent[-1], ContinueGeneration) and state.paused is None

    asyncio.run(scenario())
