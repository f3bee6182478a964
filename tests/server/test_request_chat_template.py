"""A request's own ``chat_template`` (vLLM's field): refused (400 naming the flag) unless the server
was started with ``--trust-request-chat-template``; with it, the request's template renders its
messages, on /v1/chat/completions and /tokenize alike, and a template that does not compile or
fails while rendering is a 400 naming ``chat_template``, after which the server serves on."""

from __future__ import annotations

import httpx
import openai
import pytest

from .conftest import API_KEY, ENGINE_ARGS

#: renders the last message only, then a variable of chat_template_kwargs and a marker
TEMPLATE = "{{ messages[-1]['content'] }} [{{ tag }}]{% if add_generation_prompt %} ##END##{% endif %}"
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
RENDERED = "hello there [t1] ##END##"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def trusting(start_server, model_dir):
    return start_server(
        ["--model", str(model_dir), "--api-key", API_KEY, "--trust-request-chat-template", *ENGINE_ARGS]
    )


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def _chat(client: openai.OpenAI, **extra):
    return client.chat.completions.create(
        model=_model(client),
        messages=MESSAGES,
        max_tokens=1,
        temperature=0,
        extra_body={"return_token_ids": True, **extra},
    )


def _text_ids(server, text: str) -> list[int]:
    resp = httpx.post(
        f"{server.url}/tokenize", json={"prompt": text, "add_special_tokens": False}, headers=AUTH, timeout=60
    )
    assert resp.status_code == 200, resp.text
    return resp.json()["tokens"]


def test_the_requests_template_renders_its_messages(trusting):
    client = _client(trusting)
    expected = _text_ids(trusting, RENDERED)
    got = _chat(client, chat_template=TEMPLATE, chat_template_kwargs={"tag": "t1"})
    assert got.model_extra["prompt_token_ids"] == expected
    assert got.usage.prompt_tokens == len(expected)
    # the settings reach it: without the generation prompt, no marker
    cont = _chat(
        client, chat_template=TEMPLATE, chat_template_kwargs={"tag": "t1"}, add_generation_prompt=False
    )
    assert cont.model_extra["prompt_token_ids"] == _text_ids(trusting, "hello there [t1]")
    # without a template of its own, the model's renders it (not the last request's)
    plain = _chat(client)
    assert plain.model_extra["prompt_token_ids"] != expected
    # /tokenize renders the request's template alike
    resp = httpx.post(
        f"{trusting.url}/tokenize",
        json={"messages": MESSAGES, "chat_template": TEMPLATE, "chat_template_kwargs": {"tag": "t1"}},
        headers=AUTH,
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["tokens"] == expected


@pytest.mark.parametrize("route", ["chat", "/tokenize"])
def test_an_untrusting_server_refuses_it_naming_the_flag(server, route):
    if route == "chat":
        with pytest.raises(openai.BadRequestError) as refused:
            _chat(_client(server), chat_template=TEMPLATE)
        error = refused.value.body
    else:
        resp = httpx.post(
            f"{server.url}/tokenize", json={"messages": MESSAGES, "chat_template": TEMPLATE}, headers=AUTH
        )
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
    assert error["param"] == "chat_template" and error["code"] == "unsupported_field", error
    assert "--trust-request-chat-template" in error["message"], error
    assert error["type"] == "invalid_request_error"


def _refused(server, template: str) -> dict:
    with pytest.raises(openai.BadRequestError) as refused:
        _chat(_client(server), chat_template=template)
    error = refused.value.body
    assert error["param"] == "chat_template" and error["type"] == "invalid_request_error", error
    resp = httpx.post(
        f"{server.url}/tokenize", json={"messages": MESSAGES, "chat_template": template}, headers=AUTH
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "chat_template", resp.text
    # the same text on both routes (the API server compiles it, before the tokenizer worker)
    assert resp.json()["error"]["message"] == error["message"], (resp.text, error)
    return error


def _still_serving(server) -> None:
    assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
    got = _chat(_client(server), chat_template=TEMPLATE, chat_template_kwargs={"tag": "t1"})
    assert got.model_extra["prompt_token_ids"] == _text_ids(server, RENDERED)


def test_a_template_that_does_not_compile_is_a_400(trusting):
    error = _refused(trusting, "{% if messages %}unclosed")
    assert "does not compile" in error["message"], error
    _still_serving(trusting)


def test_a_template_raising_while_rendering_is_a_400_with_its_message(trusting):
    error = _refused(trusting, "{{ raise_exception('custom templates say no') }}")
    assert "custom templates say no" in error["message"], error
    # an undefined call fails while rendering too, in the tokenizer worker
    error = _refused(trusting, "{{ messages[0].content.nosuchmethod() }}")
    assert "could not render chat_template" in error["message"], error
    # streamed: the same 400, before any chunk
    resp = httpx.post(
        f"{trusting.url}/v1/chat/completions",
        json={"messages": MESSAGES, "stream": True, "chat_template": "{{ raise_exception('streamed no') }}"},
        headers=AUTH,
        timeout=60,
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "chat_template", resp.text
    assert "streamed no" in resp.json()["error"]["message"]
    _still_serving(trusting)


def test_an_empty_template_is_a_400(trusting):
    error = _refused(trusting, "  ")
    assert "empty" in error["message"], error
