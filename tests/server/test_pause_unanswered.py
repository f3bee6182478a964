"""/pause_generation and /continue_generation whose answer never comes (the scheduler stopped
reporting: stopped, or stuck outside a step): a 503, but the message was sent and the engine pauses
(or goes on) once it reads it. The API server must count it paused all the same, or a SIGTERM's
drain would not continue the engine and the accepted requests would wait out the whole shutdown
timeout. The scheduler is faked: the test answers, or does not, in its place. (A busy scheduler,
in one long step, answers late and the call waits: tests/server/test_long_step.py.)

Found: the API's ``paused`` was set only after the answer, so an error (then a 504 past the health
bound) left it None.
"""

from __future__ import annotations

import asyncio

import pytest

from minisgl_core.messages import ContinueGeneration, PauseGeneration
from minisgl_core.server import state as state_module
from minisgl_core.server.errors import APIError
from minisgl_core.server.limits import ServerLimits
from minisgl_core.server.state import ModelInfo, ServerState

from .conftest import FakeSocket


def make_state() -> ServerState:
    model = ModelInfo(name="m", path="m", max_context_len=2048, kv_capacity_tokens=16384, vocab_size=100)
    state = ServerState(None, model, limits=ServerLimits(health_timeout_s=0.2))
    state.to_tokenizer = FakeSocket()
    return state


async def pause_unanswered(state: ServerState, mode: str) -> None:
    state.loop = asyncio.get_running_loop()
    state.last_report_at = state_module.time.monotonic()  # healthy when the call starts
    with pytest.raises(APIError) as caught:
        await state.pause_generation(mode)
    assert caught.value.status == 503


@pytest.mark.parametrize("mode", ["abort", "retract", "in_place"])
def test_an_unanswered_pause_is_a_503_but_counts_as_paused(sent, mode):
    async def scenario() -> None:
        state = make_state()
        await pause_unanswered(state, mode)
        assert [type(m) for m in sent] == [PauseGeneration] and sent[0].mode == mode
        assert state.paused == mode
        state.start_draining()  # SIGTERM: the drain continues the engine so the requests finish
        assert [type(m) for m in sent] == [PauseGeneration, ContinueGeneration]
        assert state.paused is None

    asyncio.run(scenario())


def test_an_unanswered_continue_is_a_503_but_counts_as_going_on(sent):
    async def scenario() -> None:
        state = make_state()
        state.loop = asyncio.get_running_loop()
        state.paused = "in_place"  # (as an answered pause leaves it)
        state.last_report_at = state_module.time.monotonic()
        with pytest.raises(APIError) as caught:
            await state.continue_generation()
        assert caught.value.status == 503
        assert [type(m) for m in sent] == [ContinueGeneration]
        assert state.paused is None
        state.start_draining()  # nothing left to continue
        assert len(sent) == 1

    asyncio.run(scenario())
