"""A client's id for its request: vLLM's ``request_id`` on chat and completions (the answer's id is
``chatcmpl-<id>`` / ``cmpl-<id>``), SGLang's ``rid`` on /generate (``meta_info.id``), and the
``X-Request-Id`` header, which wins over either as in vLLM; every answer carries an
``X-Request-Id`` header (the client's id, else the answer's own), streamed or not."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlparse

import httpx
import openai
import pytest

from .conftest import API_KEY

ASK = [{"role": "user", "content": "Say hi."}]


def test_chat_takes_request_id_and_the_header_wins(client, model_name):
    raw = client.chat.completions.with_raw_response.create(
        model=model_name, messages=ASK, max_tokens=2, extra_body={"request_id": "trace-7"}
    )
    assert raw.parse().id == "chatcmpl-trace-7" and raw.headers["x-request-id"] == "trace-7"
    raw = client.chat.completions.with_raw_response.create(
        model=model_name,
        messages=ASK,
        max_tokens=2,
        extra_body={"request_id": "body-id"},
        extra_headers={"X-Request-Id": "hdr-id"},
    )
    assert raw.parse().id == "chatcmpl-hdr-id" and raw.headers["x-request-id"] == "hdr-id"
    # no id given: a fresh one, and the header says it
    raw = client.chat.completions.with_raw_response.create(model=model_name, messages=ASK, max_tokens=2)
    own = raw.parse().id
    assert own.startswith("chatcmpl-") and raw.headers["x-request-id"] == own


def test_streamed_chunks_and_completions_carry_the_id(client, model_name):
    ids = {
        chunk.id
        for chunk in client.chat.completions.create(
            model=model_name, messages=ASK, max_tokens=4, n=2, stream=True, extra_body={"request_id": "s-1"}
        )
    }
    assert ids == {"chatcmpl-s-1"}
    out = client.completions.create(
        model=model_name, prompt=["a", "b"], max_tokens=2, extra_headers={"X-Request-Id": "c-1"}
    )
    assert out.id == "cmpl-c-1"
    ids = {
        chunk.id
        for chunk in client.completions.create(
            model=model_name, prompt="a", max_tokens=3, stream=True, extra_body={"request_id": "c-2"}
        )
    }
    assert ids == {"cmpl-c-2"}


def test_generate_takes_sglangs_rid(server, auth):
    url = f"{server.url}/generate"
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 2}}
    resp = httpx.post(url, json={**body, "rid": "g-1"}, headers=auth)
    assert resp.json()["meta_info"]["id"] == "g-1" and resp.headers["x-request-id"] == "g-1"
    resp = httpx.post(url, json={**body, "rid": "g-1"}, headers={**auth, "X-Request-Id": "g-2"})
    assert resp.json()["meta_info"]["id"] == "g-2"
    with httpx.stream("POST", url, json={**body, "stream": True, "rid": "g-3"}, headers=auth) as streamed:
        assert streamed.headers["x-request-id"] == "g-3"
        events = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: {")]
    assert events and {e["meta_info"]["id"] for e in events} == {"g-3"}


@pytest.mark.parametrize(
    ("extra_body", "extra_headers", "param"),
    [
        ({"request_id": ""}, {}, "request_id"),
        ({"request_id": "x" * 257}, {}, "request_id"),
        ({"request_id": 7}, {}, "request_id"),
        ({}, {"X-Request-Id": "x" * 257}, "X-Request-Id"),
        # the id comes back in the X-Request-Id header, which cannot carry these: a control
        # character was echoed into an invalid header, edge spaces dropped the connection
        ({"request_id": "a\x01b"}, {}, "request_id"),
        ({"request_id": "a\x7f"}, {}, "request_id"),
        ({"request_id": "a\nb"}, {}, "request_id"),
        ({"request_id": " a"}, {}, "request_id"),
        ({"request_id": "a\x01b", "stream": True}, {}, "request_id"),
    ],
)
def test_bad_ids_are_a_400_naming_them(client, model_name, extra_body, extra_headers, param):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=model_name, messages=ASK, max_tokens=2, extra_body=extra_body, extra_headers=extra_headers
        )
    assert refused.value.body["param"] == param, refused.value.body
    assert len(refused.value.body["message"]) < 300


def _raw_post(server, path: str, body: dict, header: bytes) -> tuple[bytes, dict]:
    """POST ``body`` with an ``X-Request-Id`` header of raw bytes (HTTP clients refuse to send a
    control character; h11 lets one in): the status line and header block, and the JSON body (or
    the first SSE event's)."""
    where = urlparse(server.url)
    data = json.dumps(body).encode()
    request = (
        (
            f"POST {path} HTTP/1.1\r\nHost: {where.netloc}\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\nConnection: close\r\n"
        ).encode()
        + b"X-Request-Id: "
        + header
        + b"\r\n\r\n"
        + data
    )
    with socket.create_connection((where.hostname, where.port), timeout=60) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, rest = answer.partition(b"\r\n\r\n")
    if b"chunked" in head.lower():
        rest = rest[rest.index(b"data: ") + 6 :].split(b"\n", 1)[0]
    return head, json.loads(rest)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": "", "messages": ASK, "max_tokens": 2, "request_id": "body-id"}),
        ("/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 2}, "rid": "body-id"}),
    ],
)
def test_a_header_with_control_characters_is_a_400(server, model_name, path, body, stream):
    """Such a header was echoed as it came, an invalid response header (RFC 9110: a field value is
    visible ASCII, obs-text, spaces and tabs); the 400 names the header and the character."""
    body = {**body, "stream": stream} | ({"model": model_name} if "model" in body else {})
    for header, at in [(b"ab\x01cd", "character 2 is U+0001"), (b"ab\x7f", "character 2 is U+007F")]:
        head, answer = _raw_post(server, path, body, header)
        assert head.startswith(b"HTTP/1.1 400"), (head, answer)
        error = answer["error"]
        assert error["param"] == "X-Request-Id", error
        assert error["message"].startswith(f"X-Request-Id: {at}, a control character"), error
        assert "printable" in error["message"] and header not in head
    # a tab inside and Latin-1's obs-text are a header's text: echoed
    head, answer = _raw_post(server, path, body, b"a\tb\xe9")
    assert head.startswith(b"HTTP/1.1 200") and b"\r\nx-request-id: a\tb\xe9\r\n" in head.lower(), head
    given = answer["id"] if path != "/generate" else answer["meta_info"]["id"]
    assert given.endswith("a\tb\u00e9"), answer


@pytest.mark.parametrize("stream", [False, True])
def test_an_id_past_latin1_goes_in_the_header_as_its_utf8_bytes(server, auth, model_name, stream):
    """A body's request_id or rid of any text is taken (vLLM's are); one Latin-1 cannot hold was a
    500 (Starlette encodes a header's value as Latin-1): its header carries its UTF-8 bytes."""
    for path, body, answer_id in [
        (
            "/v1/chat/completions",
            {"model": model_name, "messages": ASK, "max_tokens": 2, "request_id": "日本-1"},
            "chatcmpl-日本-1",
        ),
        ("/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 2}, "rid": "日本-1"}, "日本-1"),
    ]:
        with httpx.stream(
            "POST", f"{server.url}{path}", json={**body, "stream": stream}, headers=auth
        ) as resp:
            assert resp.status_code == 200, resp.read()
            raw = dict(resp.headers.raw)
            text = resp.read().decode()
        assert raw[b"x-request-id"] == "日本-1".encode(), raw
        first = json.loads(text[6:].split("\n", 1)[0]) if stream else json.loads(text)
        assert (first["id"] if path != "/generate" else first["meta_info"]["id"]) == answer_id


@pytest.mark.parametrize("stream", [False, True])
def test_generates_rid_with_a_control_character_is_a_400(server, auth, stream):
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 2}, "rid": "g\x1b[0m", "stream": stream}
    resp = httpx.post(f"{server.url}/generate", json=body, headers=auth)
    assert resp.status_code == 400 and "x-request-id" not in resp.headers, resp.text
    error = resp.json()["error"]
    assert error["param"] == "rid" and "character 1 is U+001B, a control character" in error["message"], error
