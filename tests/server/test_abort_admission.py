"""/abort_request against a request still being admitted, and a score-only answer's abort, with
the engine faked: the tokenizer worker's admissions are answered by the test, so an abort can land
exactly while a batch's first prompt is being tokenized.

Found: ``abort_all`` while a batch's first prompt was tokenized ended that prompt, but the route
went on to admit the batch's later prompts, which then ran to their end; and a score-only
``/generate`` (``max_new_tokens`` 0) that was aborted answered finish ``length``, as if it had
finished.
"""

from __future__ import annotations

import asyncio

import pytest

from minisgl_core.messages import AbortRequest, Admission, TokenizeRequest
from minisgl_core.sampling import SamplingParams
from minisgl_core.server.handling import drop_generated
from minisgl_core.server.responses import Choice
from minisgl_core.server.state import ModelInfo, RequestGroup, ServerState, TokenEvent

from .conftest import FakeSocket

MESSAGE = "stopped by the test"


def make_state() -> ServerState:
    model = ModelInfo(name="m", path="m", max_context_len=2048, kv_capacity_tokens=16384, vocab_size=100)
    state = ServerState(None, model)
    state.to_tokenizer = FakeSocket()
    return state


async def admit(state: ServerState, request: TokenizeRequest, prompt_len: int = 3) -> None:
    """The tokenizer worker's answer: the request is admitted."""
    state.admissions[request.rids[0]].set_result(Admission(request.rids[0], prompt_len, 8))


async def wait_sent(sent: list, count: int) -> None:
    for _ in range(100):
        if len(sent) >= count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{count} messages were not sent: {sent}")


def test_abort_all_while_a_batch_is_admitted_ends_its_later_prompts_too(sent):
    async def scenario() -> None:
        state = make_state()
        group = RequestGroup(state)
        group.expect(3)

        async def admit_batch() -> None:
            for text in ("first", "second"):
                await group.add(SamplingParams(max_tokens=8), 1 if text == "first" else 2, text=text)

        route = asyncio.create_task(admit_batch())
        await wait_sent(sent, 1)  # the first prompt is with the tokenizer worker
        assert state.abort_requests(None, MESSAGE) == 1
        await admit(state, sent[0])
        await wait_sent(sent, 3)  # the abort of the first, then the second prompt
        await admit(state, sent[2])
        await route

        tokenized = [m for m in sent if isinstance(m, TokenizeRequest)]
        aborted = {m.rid for m in sent if isinstance(m, AbortRequest)}
        # every engine request of the batch is aborted, the second prompt's two samples included
        assert aborted == {rid for m in tokenized for rid in m.rids}, sent
        assert not group.unfinished and not state.pending
        events: list[TokenEvent] = []
        while not group.queue.empty():
            events.append(group.queue.get_nowait())
        assert sorted((e.index, e.finish_reason, e.error) for e in events) == [
            (i, "abort", MESSAGE) for i in range(3)
        ]
        assert state.metrics.finished["abort"] == 3

    asyncio.run(scenario())


def test_an_abort_by_name_after_admission_leaves_other_requests_alone(sent):
    """(the whole-request mark is the aborted group's own: another group admitted later runs)"""

    async def scenario() -> None:
        state = make_state()
        first, second = RequestGroup(state), RequestGroup(state)
        task = asyncio.create_task(first.add(SamplingParams(max_tokens=8), text="a"))
        await wait_sent(sent, 1)
        await admit(state, sent[0])
        await task
        first.name("mine")
        assert state.abort_requests("mine", MESSAGE) == 1
        task = asyncio.create_task(second.add(SamplingParams(max_tokens=8), text="b"))
        await wait_sent(sent, 3)
        await admit(state, sent[2])
        await task
        assert second.unfinished and second.aborted is None
        assert [m.rid for m in sent if isinstance(m, AbortRequest)] == sent[0].rids

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("finish", "expected"), [("stop", "length"), ("length", "length"), ("abort", "abort"), ("error", "error")]
)
def test_a_score_only_choice_keeps_an_abort_or_an_error(finish, expected):
    choice = Choice(0)
    choice.add(TokenEvent(0, 7, "x", finish, "x" if finish == "stop" else None, None, "why"))
    drop_generated(choice)
    assert (choice.text, choice.token_ids, choice.finish_reason) == ("", [], expected)
    assert choice.matched_stop is None
