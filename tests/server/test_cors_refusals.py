"""A refused CORS preflight answers in OpenAI's error shape, as every other 4xx of the server:
Starlette's plain-text "Disallowed CORS origin" could not be read by clients that parse every
error as ``{"error": {...}}`` (found by a probe)."""

from __future__ import annotations

from starlette.testclient import TestClient

from minisgl_core.server.api_options import ApiOptions
from minisgl_core.server.app import create_app
from minisgl_core.server.state import ModelInfo, ServerState

from .conftest import API_KEY

ORIGIN = "https://app.example"
FIX = "start the server with it in --allowed-origins (comma-separated; '*' allows any)"


def _client() -> TestClient:
    info = ModelInfo(name="m", path="m", max_context_len=2048, kv_capacity_tokens=16384, vocab_size=1024)
    state = ServerState(endpoints=None, model=info)
    # no lifespan: preflights are answered before the engine would be asked
    return TestClient(create_app(state, api_key=API_KEY, options=ApiOptions(allowed_origins=(ORIGIN,))))


def _preflight(client: TestClient, origin: str, method: str):
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": "authorization",
    }
    return client.options("/v1/chat/completions", headers=headers)


def test_a_preflight_from_an_origin_not_allowed_is_an_openai_error_naming_the_origin_and_the_flag():
    resp = _preflight(_client(), "https://evil.example", "POST")
    assert resp.status_code == 400
    assert resp.headers["content-type"] == "application/json"
    assert resp.json() == {
        "error": {
            "message": f"CORS preflight refused: origin 'https://evil.example' is not allowed: {FIX}",
            "type": "invalid_request_error",
            "param": None,
            "code": "cors_not_allowed",
        }
    }
    assert "access-control-allow-origin" not in resp.headers  # still refused, as before
    assert "Origin" in resp.headers["vary"]


def test_a_preflight_for_a_method_not_taken_names_the_methods():
    client = _client()
    resp = _preflight(client, ORIGIN, "DELETE")
    assert resp.status_code == 400
    assert resp.json()["error"] == {
        "message": "CORS preflight refused: method 'DELETE' is not allowed: the API takes GET, HEAD, POST, OPTIONS",
        "type": "invalid_request_error",
        "param": None,
        "code": "cors_not_allowed",
    }
    # the origin is allowed: a browser may read why
    assert resp.headers["access-control-allow-origin"] == ORIGIN
    both = _preflight(client, "https://evil.example", "PUT").json()["error"]["message"]
    assert both == (
        f"CORS preflight refused: origin 'https://evil.example' is not allowed: {FIX}; "
        "method 'PUT' is not allowed: the API takes GET, HEAD, POST, OPTIONS"
    )


def test_an_allowed_preflight_is_unchanged():
    resp = _preflight(_client(), ORIGIN, "POST")
    assert resp.status_code == 200 and resp.headers["access-control-allow-origin"] == ORIGIN
    assert resp.text == "OK"
