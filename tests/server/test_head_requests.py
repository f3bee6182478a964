"""HEAD on every GET route answers like the GET without a body (load balancers and Kubernetes
probes send HEAD); routes without a GET still answer 405."""

from __future__ import annotations

import httpx
from starlette.testclient import TestClient

from minisgl_core.server.app import create_app
from minisgl_core.server.state import ModelInfo, ServerState

from .conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def app_client() -> tuple[TestClient, ServerState]:
    info = ModelInfo(name="m", path="m", max_context_len=2048, kv_capacity_tokens=16384, vocab_size=1024)
    state = ServerState(endpoints=None, model=info)
    # no lifespan: the routes below answer from the state alone, without an engine
    return TestClient(create_app(state, api_key=API_KEY)), state


def test_head_answers_like_get_without_a_body():
    client, state = app_client()
    for path, headers in [("/health", {}), ("/v1/models", AUTH), ("/v1/models/m", AUTH), ("/metrics", AUTH),
                          ("/get_model_info", AUTH), ("/openapi.json", AUTH)]:  # fmt: skip
        get, head = client.get(path, headers=headers), client.head(path, headers=headers)
        assert (get.status_code, head.status_code) == (200, 200), path
        assert head.content == b"" and get.content, path
        assert head.headers["content-type"] == get.headers["content-type"], path
    # errors keep their status: no key, an unknown model, a route that only takes POST
    assert client.head("/v1/models").status_code == 401
    assert client.head("/v1/models/other", headers=AUTH).status_code == 404
    refused = client.head("/v1/completions", headers=AUTH)
    assert refused.status_code == 405 and refused.headers["allow"] == "POST" and refused.content == b""
    # a 405 from a GET route names HEAD among what it allows (it named GET only)
    put = client.put("/health", headers=AUTH)
    assert put.status_code == 405 and put.headers["allow"] == "GET, HEAD", put.headers
    # unhealthy: 503 for both health checks, still without a body
    state.start_draining()
    for path in ("/health", "/health_generate"):
        assert client.get(path, headers=AUTH).status_code == 503, path
        head = client.head(path, headers=AUTH)
        assert head.status_code == 503 and head.content == b"", path


def test_head_on_a_live_server(server):
    # through uvicorn: the probe's HEAD on a real server, healthy, and one that runs the engine
    for path, status in [("/health", 200), ("/health_generate", 200), ("/v1/models", 200)]:
        resp = httpx.head(f"{server.url}{path}", headers=AUTH, timeout=30)
        assert resp.status_code == status and resp.content == b"", path


def test_health_generate_probes_are_left_out_of_metrics(server, read_metrics, model_name):
    """/health_generate runs one token through the engine; a router polls it every few seconds, and
    each probe counted as a client's request in /metrics (its prompt and generated token, its
    finish "length", its latencies). Left out now."""
    counted = (
        "requests",
        "minisgl_prompt_tokens_total",
        "minisgl_generation_tokens_total",
        "minisgl_time_to_first_token_seconds_count",
        "minisgl_e2e_request_latency_seconds_count",
    )

    def read() -> dict[str, float]:
        m = read_metrics()
        m["requests"] = sum(v for k, v in m.items() if k.startswith("minisgl_requests_total{"))
        return {k: m[k] for k in counted}

    before = read()
    for _ in range(3):
        assert httpx.get(f"{server.url}/health_generate", headers=AUTH, timeout=30).json() == {"status": "ok"}
    after = read()
    assert after == before
    # a client's request of the same size still counts, once each
    body = {"model": model_name, "prompt": [0], "max_tokens": 1, "temperature": 0}
    resp = httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=30)
    assert resp.status_code == 200, resp.text
    client = read()
    assert {k: client[k] - after[k] for k in counted} == dict.fromkeys(counted, 1.0)
