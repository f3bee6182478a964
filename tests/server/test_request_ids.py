"""A client's id for its request: vLLM's ``request_id`` on chat and completions (the answer's id is
``chatcmpl-<id>`` / ``cmpl-<id>``), SGLang's ``rid`` on /generate (``meta_info.id``), and the
``X-Request-Id`` header, which wins over either as in vLLM; every answer carries an
``X-Request-Id`` header (the client's id, else the answer's own), streamed or not."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

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
    ],
)
def test_bad_ids_are_a_400_naming_them(client, model_name, extra_body, extra_headers, param):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=model_name, messages=ASK, max_tokens=2, extra_body=extra_body, extra_headers=extra_headers
        )
    assert refused.value.body["param"] == param, refused.value.body
    assert len(refused.value.body["message"]) < 300
