"""Without the API key a request gets its 401 before anything looks at its body: an
unauthenticated client got "malformed JSON body", the 415 of a compressed body or the 413 of a
large one (found by a probe); vLLM answers 401 first. With the key those answers are unchanged."""

from __future__ import annotations

import gzip

from starlette.testclient import TestClient

from minisgl_core.server.api_options import ApiOptions
from minisgl_core.server.app import create_app
from minisgl_core.server.limits import ServerLimits
from minisgl_core.server.state import ModelInfo, ServerState

from .conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
ORIGIN = "https://app.example"


def _client(**options) -> tuple[TestClient, ServerState]:
    info = ModelInfo(name="m", path="m", max_context_len=2048, kv_capacity_tokens=16384, vocab_size=1024)
    state = ServerState(endpoints=None, model=info, limits=ServerLimits(max_body_bytes=1000))
    # no lifespan: every answer below comes before the engine would be asked
    return TestClient(create_app(state, api_key=API_KEY, options=ApiOptions(**options))), state


BAD_BODIES = [
    # (what, content, extra headers, status with the key)
    ("malformed JSON", b'{"messages": [', {}, 400),
    ("a compressed body", gzip.compress(b'{"prompt": "hi"}'), {"Content-Encoding": "gzip"}, 415),
    ("a body over the limit", b'{"prompt": "' + b"x" * 2000 + b'"}', {}, 413),
]


def test_no_key_is_401_before_the_body_is_looked_at():
    client, state = _client()
    for what, content, headers, with_key in BAD_BODIES:
        headers = {"Content-Type": "application/json", **headers}
        for path in ("/v1/completions", "/generate", "/tokenize", "/v1/nowhere"):
            resp = client.post(path, content=content, headers=headers)
            assert resp.status_code == 401, (what, path, resp.text)
            assert resp.json()["error"]["code"] == "invalid_api_key"
        resp = client.post("/v1/completions", content=content, headers={**headers, **AUTH})
        assert resp.status_code == with_key, (what, resp.text)
    assert state.metrics.rejected >= 12
    # /health needs no key; HEAD is GET's
    assert client.get("/health").status_code in (200, 503)
    assert client.head("/v1/models").status_code == 401


def test_a_refused_request_still_carries_the_cors_headers():
    """A browser reads a 401 (or 413) only with Access-Control-Allow-Origin on it; preflights,
    which carry no key, still pass."""
    client, _ = _client(allowed_origins=(ORIGIN,))
    preflight = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization",
    }
    resp = client.options("/v1/completions", headers=preflight)
    assert resp.status_code == 200 and resp.headers["access-control-allow-origin"] == ORIGIN
    resp = client.post("/v1/completions", json={"prompt": "hi"}, headers={"Origin": ORIGIN})
    assert resp.status_code == 401 and resp.headers["access-control-allow-origin"] == ORIGIN
    big = b'{"prompt": "' + b"x" * 2000 + b'"}'
    resp = client.post(
        "/v1/completions", content=big, headers={"Origin": ORIGIN, **AUTH, "Content-Type": "application/json"}
    )
    assert resp.status_code == 413 and resp.headers["access-control-allow-origin"] == ORIGIN
