"""A refused CORS preflight answers in OpenAI's error shape, as every other 4xx of the server:
Starlette's plain-text "Disallowed CORS origin" could not be read by clients that parse every
error as ``{"error": {...}}`` (found by a probe)."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from minisgl_core.server.api_options import ApiOptions
from minisgl_core.server.app import create_app
from minisgl_core.server.state import ModelInfo, ServerState
from minisgl_core.testing.cli_runner import run_cli

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


@pytest.mark.parametrize("value", ["https://app.example/", "https://app.example/app", "app.example", "null"])
def test_an_allowed_origin_no_browser_sends_is_refused_at_start_up(value):
    """A probe's find: ``--allowed-origins https://app.example/`` started a server whose every
    preflight from https://app.example was refused (a browser's Origin has no path, not even /)."""
    proc = run_cli(["serve", "--model", "demo", "--port", "0", "--allowed-origins", f"*,{value}"])
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr
    # (after the demo model's warning)
    assert proc.stderr.splitlines()[-1:] == [
        f"minisgl: error: --allowed-origins: {value!r} is not an origin: give scheme://host[:port] "
        "with nothing after it, as a browser sends it (e.g. https://app.example), or '*'"
    ]


@pytest.mark.parametrize("value", ["https://bücher.example", "http://💥.com:8080"])
def test_an_allowed_origin_whose_host_is_not_ascii_is_refused(value):
    """A browser's Origin writes such a host in punycode (https://xn--bcher-kva.example): the
    value as given never matched, and every preflight from it was refused, nothing said at start-up."""
    from minisgl_core.config import ConfigError
    from minisgl_core.server.cli import _origin

    with pytest.raises(ConfigError) as refused:
        _origin(value)
    assert str(refused.value) == (
        f"--allowed-origins: {value!r}: a browser sends a host that is not ASCII in its punycode "
        "form (xn--...); give that form"
    )


@pytest.mark.parametrize(
    ("value", "sent"),
    [
        ("HTTPS://App.Example", "https://app.example"),
        ("https://app.example:443", "https://app.example"),
        ("http://localhost:8080", "http://localhost:8080"),
        ("http://[::1]:80", "http://[::1]"),
        ("chrome-extension://abcdef", "chrome-extension://abcdef"),
    ],
)
def test_an_allowed_origin_is_matched_as_a_browser_writes_it(value, sent):
    """Scheme and host in lower case, the scheme's default port left out: as the Origin header has
    them (Starlette compares the strings)."""
    from minisgl_core.server.cli import _origin

    assert _origin(value) == sent
