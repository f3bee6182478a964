"""SGLang's ``POST /abort_request``: a request named by its client's id (``X-Request-Id``, vLLM's
``request_id``, SGLang's ``rid``, a batch's rid for its prompt) or its answer's id ends with what it
produced so far, finish reason ``abort``; ``abort_all`` ends every unfinished one. RL frameworks
(slime, verl) call it to stop rollouts."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from minisgl_core.server.schemas import ABORT_MESSAGE

#: more tokens than a request can make before the test aborts it (ignore_eos: it cannot stop early)
LONG = {"max_new_tokens": 2000, "ignore_eos": True, "temperature": 0.0}
ABORTED = 'minisgl_requests_total{finish_reason="abort"}'


def abort(server, auth, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/abort_request", json=body, headers=auth, timeout=30)


def aborted(server, auth, **body: Any) -> int:
    resp = abort(server, auth, **body)
    assert resp.status_code == 200, resp.text
    return resp.json()["aborted"]


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def abort_when_named(server, auth, rid: str, expected: int = 1) -> None:
    """Abort ``rid`` as soon as the server knows it (before its prompt is admitted it is unknown: 0)."""
    wait_for(lambda: aborted(server, auth, rid=rid) == expected, f"{rid} to be aborted")


def server_info(server, auth) -> dict[str, Any]:
    return httpx.get(f"{server.url}/get_server_info", headers=auth).json()


def assert_nothing_left(server, auth) -> None:
    """No request runs, in the API server or the engine (aborted there too: the rest of a long
    request would take it many more seconds), and no id stays named once every request ended (the
    registry does not leak)."""

    def idle() -> dict[str, Any] | None:
        info = server_info(server, auth)
        load = httpx.get(f"{server.url}/get_load", headers=auth).json()[0]
        return info if info["queued_or_running"] == 0 and load["num_reqs"] == 0 else None

    info = wait_for(idle, "the requests to end", 10)
    assert info["abortable_ids"] == 0, info


def generate(server, auth, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/generate", json=body, headers=auth, timeout=300)


def test_generate_aborted_by_its_rid_answers_what_it_made(server, auth, read_metrics):
    before = read_metrics()
    body = {"text": "Tell me a long story", "rid": "abort-gen-1", "sampling_params": LONG}
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(generate, server, auth, body)
        # some tokens first, so that the answer has a prefix to check
        wait_for(
            lambda: (
                read_metrics()["minisgl_generation_tokens_total"]
                >= before["minisgl_generation_tokens_total"] + 4
            ),
            "the first tokens",
        )
        assert aborted(server, auth, rid="abort-gen-1") == 1
        resp = answer.result(timeout=120)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    meta = out["meta_info"]
    assert meta["id"] == "abort-gen-1"
    assert meta["finish_reason"] == {"type": "abort", "message": ABORT_MESSAGE}
    made = out["output_ids"]
    assert 0 < len(made) < LONG["max_new_tokens"] and meta["completion_tokens"] == len(made)
    # the same greedy request, run for as many tokens, made the same ones
    reference = generate(
        server, auth, {**body, "rid": None, "sampling_params": {**LONG, "max_new_tokens": len(made)}}
    )
    assert reference.json()["output_ids"] == made
    assert reference.json()["text"].startswith(out["text"])
    # once more: it is over (nothing to abort), and /metrics counted it once, as an abort
    assert aborted(server, auth, rid="abort-gen-1") == 0
    assert read_metrics()[ABORTED] == before[ABORTED] + 1
    assert_nothing_left(server, auth)


def test_a_stream_ends_with_an_abort_chunk_then_done(server, auth):
    body = {"text": "Count to a thousand", "rid": "abort-stream-1", "stream": True, "sampling_params": LONG}
    events = []
    with httpx.stream("POST", f"{server.url}/generate", json=body, headers=auth, timeout=120) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[len("data: ") :])
            if len(events) == 1:  # its first token is out: stop it
                assert aborted(server, auth, rid="abort-stream-1", abort_message="rollout over") == 1
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    last = chunks[-1]["meta_info"]
    assert last["finish_reason"] == {"type": "abort", "message": "rollout over"}
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert 0 < last["completion_tokens"] < LONG["max_new_tokens"]
    assert_nothing_left(server, auth)


def test_chat_aborted_by_its_x_request_id(client, server, auth, model_name):
    def ask() -> Any:
        return client.chat.completions.create(
            model=model_name,
            messages=[{"role": "user", "content": "Write an essay."}],
            max_tokens=1900,
            temperature=0,
            extra_body={"ignore_eos": True},
            extra_headers={"X-Request-Id": "chat-abort-1"},
        )

    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(ask)
        abort_when_named(server, auth, "chat-abort-1")
        out = answer.result(timeout=120)
    assert out.id == "chatcmpl-chat-abort-1"
    assert out.choices[0].finish_reason == "abort"
    assert out.usage.completion_tokens < 1900
    assert_nothing_left(server, auth)


def test_a_response_answered_whole_aborted_by_its_x_request_id(client, server, auth, model_name):
    """/v1/responses took no client id: a response answered whole has no id until it ends, so only
    closing the connection stopped it. Its X-Request-Id header now names it, as chat's does; the
    response keeps its own resp_ id, and ends cancelled with what it made."""

    def ask() -> Any:
        return client.responses.with_raw_response.create(
            model=model_name,
            input="Tell me a very long story",  # (greedy, the tiny model runs to max_output_tokens)
            max_output_tokens=1900,
            temperature=0,
            extra_headers={"X-Request-Id": "resp-abort-1"},
        )

    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(ask)
        abort_when_named(server, auth, "resp-abort-1")
        raw = answer.result(timeout=120)
    out = raw.parse()
    assert raw.headers["x-request-id"] == "resp-abort-1"
    assert out.id.startswith("resp_") and out.status == "cancelled", out
    assert 0 < out.usage.output_tokens < 1900
    assert_nothing_left(server, auth)
    # an id that cannot come back in the header is chat's 400, before anything runs
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model=model_name, input="hi", max_output_tokens=2, extra_headers={"X-Request-Id": "x" * 257}
        )
    assert refused.value.body["param"] == "X-Request-Id", refused.value.body


def test_a_completion_stream_aborted_by_its_answer_id(client, server, auth, model_name):
    stream = client.completions.create(
        model=model_name,
        prompt="Once upon a time",
        max_tokens=1900,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = []
    for chunk in stream:
        if not chunks:
            assert chunk.id.startswith("cmpl-")
            assert aborted(server, auth, rid=chunk.id) == 1
        chunks.append(chunk)
    assert chunks[-1].choices[0].finish_reason == "abort"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert_nothing_left(server, auth)


def test_a_batch_rid_aborts_only_its_prompt(server, auth):
    """A batch's rid names its prompt's samples (each sample also by its answer's id): the other
    prompts run to their end."""
    body = {
        "text": ["Tell a long story", "Say something"],
        "rid": ["batch-a", "batch-b"],
        "sampling_params": [{**LONG, "n": 2}, {**LONG, "max_new_tokens": 200}],
    }
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(generate, server, auth, body)
        abort_when_named(server, auth, "batch-a-1")  # one sample, by its answer's id
        assert aborted(server, auth, rid="batch-a") == 1  # the prompt's other one
        resp = answer.result(timeout=180)
    assert resp.status_code == 200, resp.text
    a0, a1, b = resp.json()
    assert [a0["meta_info"]["id"], a1["meta_info"]["id"], b["meta_info"]["id"]] == [
        "batch-a-0",
        "batch-a-1",
        "batch-b",
    ]
    for sample in (a0, a1):
        assert sample["meta_info"]["finish_reason"]["type"] == "abort"
        assert len(sample["output_ids"]) < LONG["max_new_tokens"]
    assert b["meta_info"]["finish_reason"] == {"type": "length", "matched": None}
    assert len(b["output_ids"]) == 200
    assert_nothing_left(server, auth)


def test_abort_all_ends_every_request_and_the_server_serves_on(client, server, auth, model_name):
    def chat() -> Any:
        return client.chat.completions.create(
            model=model_name,
            messages=[{"role": "user", "content": "Go on."}],
            max_tokens=1900,
            extra_body={"ignore_eos": True},
        )

    with ThreadPoolExecutor(2) as pool:
        answers = [
            pool.submit(generate, server, auth, {"text": "One", "sampling_params": LONG}),
            pool.submit(chat),
        ]
        total = [0]

        def all_aborted() -> bool:
            total[0] += aborted(server, auth, abort_all=True)
            return total[0] >= 2

        wait_for(all_aborted, "both requests to be aborted")
        native, openai_style = answers[0].result(timeout=120), answers[1].result(timeout=120)
    assert total[0] == 2
    assert native.json()["meta_info"]["finish_reason"]["type"] == "abort"
    assert openai_style.choices[0].finish_reason == "abort"
    assert aborted(server, auth, abort_all=True) == 0
    assert_nothing_left(server, auth)
    # the engine freed them: a request runs as before
    out = generate(server, auth, {"text": "Hi", "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}})
    assert out.status_code == 200 and out.json()["meta_info"]["finish_reason"]["type"] == "length"


def test_an_unknown_rid_aborts_nothing(server, auth):
    assert aborted(server, auth, rid="nobody-has-this-id") == 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "rid"),
        ({"rid": "", "abort_all": False}, "rid"),
        ({"abort_all": "yes"}, "abort_all"),
        ({"rid": 5}, "rid"),
        ({"rid": "x", "stream": True}, "stream"),
    ],
)
def test_bad_bodies_are_400_naming_the_field(server, auth, body, param):
    resp = abort(server, auth, **body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param, resp.text


def test_it_is_behind_the_api_key(server, auth):
    assert httpx.post(f"{server.url}/abort_request", json={"abort_all": True}).status_code == 401
    assert abort(server, auth, rid="nobody-either").json() == {"aborted": 0}


def test_ids_are_forgotten_after_a_disconnect_and_a_refusal(server, auth):
    body = {"text": "Ramble", "rid": "gone-1", "stream": True, "sampling_params": LONG}
    with httpx.stream("POST", f"{server.url}/generate", json=body, headers=auth, timeout=120) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                assert server_info(server, auth)["abortable_ids"] == 1
                break  # the client goes away mid-stream
    # a batch refused after its first prompt was admitted (the second's logprob_start_len is past it)
    refused = generate(
        server,
        auth,
        {"text": ["a", "b"], "rid": ["r-1", "r-2"], "return_logprob": True, "logprob_start_len": [0, 500]},
    )
    assert refused.status_code == 400, refused.text
    assert_nothing_left(server, auth)
    assert aborted(server, auth, rid="gone-1") == 0


def test_a_streamed_response_aborted_by_its_id_is_cancelled(server, auth, client, model_name):
    """/v1/responses: named by its id (its stream's first event gives it), it ends with status
    "cancelled" and what it made, its last item incomplete (it ended "completed", as if whole, under
    abort_all). Its last event is ``response.incomplete``, one the official client knows: it was
    ``response.cancelled``, no type of OpenAI's stream events, which the client read as a
    ``ResponseAudioDeltaEvent``."""
    from openai.types.responses import ResponseIncompleteEvent, ResponseStreamEvent
    from pydantic import TypeAdapter

    strict = TypeAdapter(ResponseStreamEvent)  # (built before the stream: it takes a while)
    events = []
    stream = client.responses.create(
        model=model_name, input="Tell me a long story", max_output_tokens=2000, temperature=0.0, stream=True
    )
    for event in stream:
        events.append(event)
        if event.type == "response.output_text.delta" and sum(e.type == event.type for e in events) == 2:
            with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response"):
                client.responses.cancel(events[0].response.id)  # (OpenAI's, for background ones)
            assert aborted(server, auth, rid=events[0].response.id) == 1
    for event in events:
        strict.validate_python(event.to_dict())  # (every field, strictly)
    last = events[-1]
    assert isinstance(last, ResponseIncompleteEvent) and last.type == "response.incomplete", last
    assert last.response.status == "cancelled" and last.response.incomplete_details is None
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    [message] = last.response.output
    assert text and message.content[0].text == text and message.status == "incomplete"
    assert 0 < last.response.usage.output_tokens < 2000
    stored = client.responses.retrieve(last.response.id)
    assert stored.status == "cancelled" and stored.output_text == text
    assert_nothing_left(server, auth)


def test_a_response_aborted_whole_is_cancelled_its_last_item_incomplete(
    client, server, auth, model_name, read_metrics
):
    """/v1/responses answered whole, ended by abort_all (its id comes with the answer, too late to
    name it): status "cancelled", and its last item, cut short, "incomplete" as in the stream (it
    was "completed", as if the text had ended)."""

    def ask() -> Any:
        return client.responses.create(
            model=model_name, input="Tell me a long story", max_output_tokens=1900, temperature=0
        )

    made = "minisgl_generation_tokens_total"
    before = read_metrics()[made]
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(ask)
        wait_for(lambda: read_metrics()[made] >= before + 4, "the first tokens")
        assert aborted(server, auth, abort_all=True) == 1
        out = answer.result(timeout=120)
    assert out.status == "cancelled" and out.incomplete_details is None, out
    # (what the engine made may not have reached the API server yet: no count below)
    assert out.output[-1].status == "incomplete" and out.usage.output_tokens < 1900, out
    assert_nothing_left(server, auth)
