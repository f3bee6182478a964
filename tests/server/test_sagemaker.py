"""Amazon SageMaker's routes, as vLLM's OpenAI server has them: ``/ping`` answers as /health (and
is as public), ``POST /invocations`` answers as the route its body's keys name (``messages``:
chat, ``prompt``: completions, ``input``: responses, ``text`` / ``input_ids``: /generate), its
errors, stream, request id, metrics and API key included. Each answer is checked against the
route's own answer to the same body, the OpenAI routes through the official client."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from minisgl_core.server.api_options import ApiOptions
from minisgl_core.server.app import create_app
from minisgl_core.server.limits import ServerLimits
from minisgl_core.server.state import ModelInfo, ServerState

from .conftest import API_KEY

CHAT = {"messages": [{"role": "user", "content": "Tell me about Paris"}], "max_tokens": 8, "temperature": 0}
COMPLETION = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
GENERATE = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
RESPONSE = {"input": "Tell me about Rome", "max_output_tokens": 8, "temperature": 0, "store": False}
#: what /invocations names when a body fits no route: each key, and where it sends a body
KEYS = (
    "messages for /v1/chat/completions; prompt for /v1/completions; input for /v1/responses; "
    "text or input_ids for /generate"
)


def auth_header() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}"}


def invoke(server, body: Any, headers: dict[str, str] | None = None, **kwargs: Any) -> httpx.Response:
    """POST /invocations; ``body`` as JSON, or bytes sent as they are."""
    content = body if isinstance(body, bytes) else json.dumps(body)
    headers = {"Content-Type": "application/json", **(headers or {})}
    return httpx.post(f"{server.url}/invocations", content=content, headers=headers, timeout=120, **kwargs)


def post(server, path: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body)
    headers = {"Content-Type": "application/json", **(headers or {})}
    return httpx.post(f"{server.url}{path}", content=content, headers=headers, timeout=120)


def comparable(answer: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI answer less what differs between two runs of one request: its id and time, and
    the prompt tokens the prefix cache held (the second run finds the first's)."""
    out = {k: v for k, v in answer.items() if k not in ("id", "created")}
    if isinstance(out.get("usage"), dict):
        out["usage"] = {k: v for k, v in out["usage"].items() if k != "prompt_tokens_details"}
    return out


def comparable_generate(answer: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in answer["meta_info"].items() if k not in ("id", "e2e_latency", "cached_tokens")}
    return {**answer, "meta_info": meta}


# ------------------------------------------------------------------------ /ping


@pytest.mark.parametrize("method", ["GET", "POST", "HEAD"])
@pytest.mark.parametrize("key", [True, False])
def test_ping_answers_as_health_with_or_without_the_key(server, auth, method, key):
    headers = auth if key else {}
    health = httpx.get(f"{server.url}/health", headers=headers)
    ping = httpx.request(method, f"{server.url}/ping", headers=headers)
    assert health.status_code == 200, health.text
    assert ping.status_code == 200, ping.text
    if method != "HEAD":
        assert ping.json() == health.json() == {"status": "ok"}


def test_ping_is_unhealthy_when_health_is():
    """An engine that stopped reporting: /ping answers /health's 503 and body."""
    info = ModelInfo(name="m", path="m", max_context_len=2048, kv_capacity_tokens=16384, vocab_size=1024)
    state = ServerState(endpoints=None, model=info)
    state.failure = "the engine failed: a test"  # (what a dead worker leaves; state.health() reads it)
    client = TestClient(create_app(state, api_key=API_KEY))  # no lifespan: no engine to start
    health = client.get("/health")
    assert health.status_code == 503, health.text
    for method in ("GET", "POST"):
        ping = client.request(method, "/ping")
        assert (ping.status_code, ping.json()) == (503, health.json())


# ------------------------------------------------------------------------ /invocations, answers


def test_a_chat_body_answers_as_chat_completions(server, client, model_name):
    ref = client.chat.completions.with_raw_response.create(model=model_name, **CHAT).http_response
    got = invoke(server, {**CHAT, "model": model_name}, auth_header())
    assert got.status_code == 200, got.text
    assert got.json()["object"] == "chat.completion"
    assert got.json()["id"].startswith("chatcmpl-")
    assert comparable(got.json()) == comparable(ref.json())
    assert got.headers["x-request-id"] == got.json()["id"]


def test_a_completion_body_answers_as_completions(server, client, model_name):
    ref = client.completions.with_raw_response.create(model=model_name, **COMPLETION).http_response
    got = invoke(server, COMPLETION, auth_header())  # (model is optional)
    assert got.status_code == 200, got.text
    assert got.json()["object"] == "text_completion"
    assert comparable(got.json()) == comparable(ref.json())


def test_a_generate_body_answers_as_generate(server, auth):
    for body in (GENERATE, {"input_ids": [1, 2, 3, 4], "sampling_params": GENERATE["sampling_params"]}):
        ref = post(server, "/generate", body, auth)
        got = invoke(server, body, auth)
        assert got.status_code == ref.status_code == 200, got.text
        assert comparable_generate(got.json()) == comparable_generate(ref.json())
        assert got.json()["meta_info"]["id"].startswith("gen-")


def test_an_input_body_answers_as_responses(server, client, model_name):
    ref = client.responses.create(model=model_name, **RESPONSE)
    got = invoke(server, {**RESPONSE, "text": {"format": {"type": "text"}}}, auth_header())
    assert got.status_code == 200, got.text
    assert got.json()["object"] == "response"
    assert got.json()["output"][0]["content"][0]["text"] == ref.output_text
    assert got.json()["usage"]["output_tokens"] == ref.usage.output_tokens


def test_the_request_id_header_is_the_routes(server, client, model_name):
    ref = client.chat.completions.with_raw_response.create(
        model=model_name, **CHAT, extra_headers={"X-Request-Id": "sm-1"}
    ).http_response
    got = invoke(server, CHAT, {**auth_header(), "X-Request-Id": "sm-1"})
    assert got.headers["x-request-id"] == ref.headers["x-request-id"] == "sm-1"
    assert got.json()["id"] == ref.json()["id"] == "chatcmpl-sm-1"


# ------------------------------------------------------------------------ streams


def chat_text(server, client, model_name) -> tuple[str, str]:
    stream = client.chat.completions.create(model=model_name, **CHAT, stream=True)
    ref = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    return ref, "".join(e["choices"][0]["delta"].get("content") or "" for e in events(server, CHAT))


def completion_text(server, client, model_name) -> tuple[str, str]:
    stream = client.completions.create(model=model_name, **COMPLETION, stream=True)
    ref = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    return ref, "".join(e["choices"][0]["text"] for e in events(server, COMPLETION))


def generate_text(server, client, model_name) -> tuple[str, str]:
    ref = post(server, "/generate", GENERATE, auth_header()).json()["text"]
    return ref, events(server, GENERATE)[-1]["text"]  # (each chunk has the text so far)


def events(server, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON events of /invocations' stream for ``body``, which ends with [DONE]."""
    with httpx.stream(
        "POST", f"{server.url}/invocations", json={**body, "stream": True}, headers=auth_header(), timeout=120
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        data = [line[len("data: ") :] for line in resp.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]", data
    return [json.loads(d) for d in data[:-1]]


@pytest.mark.parametrize("texts", [chat_text, completion_text, generate_text])
def test_a_stream_through_invocations_is_the_routes(server, client, model_name, texts):
    ref, got = texts(server, client, model_name)
    assert got == ref and got


def test_a_responses_stream_through_invocations_is_the_routes(server, client, model_name):
    ref = list(client.responses.create(model=model_name, **RESPONSE, stream=True))
    with httpx.stream(  # (a Responses stream has no [DONE]: its last event says how it ended)
        "POST",
        f"{server.url}/invocations",
        json={**RESPONSE, "stream": True},
        headers=auth_header(),
        timeout=120,
    ) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        data = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
    # (how many tokens a delta carries depends on timing: the text they make does not)
    text = "".join(e["delta"] for e in data if e["type"] == "response.output_text.delta")
    assert text == "".join(e.delta for e in ref if e.type == "response.output_text.delta")
    assert text and (data[0]["type"], data[-1]["type"]) == (ref[0].type, ref[-1].type)


# ------------------------------------------------------------------------ errors


def assert_openai_error(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return error


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"model": "x", "max_tokens": 3},
        {"messages": None, "prompt": None},
        [CHAT],
        "hi",
        3,
        b"",
        b"{not json",
    ],
)
def test_a_body_no_route_takes_is_a_400_naming_the_keys(server, auth, body):
    error = assert_openai_error(invoke(server, body, auth), 400)
    assert error["type"] == "invalid_request_error"
    assert KEYS in error["message"], error


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/chat/completions", {**CHAT, "max_tokens": -1}, 400),
        ("/v1/chat/completions", {**CHAT, "no_such_field": 1}, 400),
        ("/v1/chat/completions", {**CHAT, "prompt": "also"}, 400),  # messages come first
        ("/v1/chat/completions", {**CHAT, "model": "not-served"}, 404),
        ("/v1/completions", {**COMPLETION, "prompt": [True, 5]}, 400),
        ("/v1/responses", {**RESPONSE, "temperature": "hot"}, 400),
        ("/generate", {**GENERATE, "input_ids": [1]}, 400),  # both prompts
        ("/generate", {"input_ids": [10**9]}, 400),
    ],
)
def test_a_bad_body_gets_the_routes_own_error(server, auth, read_metrics, path, body, status):
    ref = post(server, path, body, auth)
    before = read_metrics()["minisgl_requests_rejected_total"]
    got = invoke(server, body, auth)
    assert read_metrics()["minisgl_requests_rejected_total"] == before + 1  # counted once
    assert_openai_error(got, status)
    assert (got.status_code, got.json()) == (ref.status_code, ref.json())


def test_a_json_body_sent_as_text_is_refused_as_the_route_refuses_it(server, auth):
    headers = {**auth, "Content-Type": "text/plain"}
    ref = post(server, "/v1/chat/completions", json.dumps(CHAT).encode(), headers)
    got = invoke(server, json.dumps(CHAT).encode(), headers)
    assert_openai_error(got, 400)
    assert got.json() == ref.json()


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}])
@pytest.mark.parametrize("body", [CHAT, {}, b"{not json"])
def test_invocations_is_behind_the_api_key(server, headers, read_metrics, body):
    """The 401 comes before the body is looked at: one no route takes is not a 400."""
    ref = post(server, "/v1/chat/completions", CHAT, headers)
    before = read_metrics()["minisgl_requests_rejected_total"]
    got = invoke(server, body, headers)
    assert assert_openai_error(got, 401)["code"] == "invalid_api_key"
    assert got.json() == ref.json()
    assert read_metrics()["minisgl_requests_rejected_total"] == before + 1


def test_an_answer_through_invocations_is_counted_once(server, auth, read_metrics):
    before = read_metrics()
    assert invoke(server, {**COMPLETION, "max_tokens": 3}, auth).status_code == 200
    after = read_metrics()
    finished = 'minisgl_requests_total{finish_reason="length"}'
    assert after[finished] == before[finished] + 1
    assert after["minisgl_generation_tokens_total"] == before["minisgl_generation_tokens_total"] + 3


# ------------------------------------------------------------------------ the ASGI gates (no engine)


def app_client(**kwargs: Any) -> TestClient:
    info = ModelInfo(name="m", path="m", max_context_len=2048, kv_capacity_tokens=16384, vocab_size=1024)
    state = ServerState(endpoints=None, model=info, limits=ServerLimits(max_body_bytes=64))
    return TestClient(create_app(state, **kwargs))  # no lifespan: refused before the engine


def test_the_body_limit_applies():
    resp = app_client().post("/invocations", json={"prompt": "x" * 100})
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "body_too_large"


def test_cors_headers_come_with_its_answers():
    origin = "https://app.example"
    client = app_client(options=ApiOptions(allowed_origins=(origin,)))
    resp = client.post("/invocations", json={"nothing": 1}, headers={"Origin": origin})
    assert resp.status_code == 400
    assert resp.headers["access-control-allow-origin"] == origin
    preflight = client.options(
        "/invocations", headers={"Origin": origin, "Access-Control-Request-Method": "POST"}
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == origin
