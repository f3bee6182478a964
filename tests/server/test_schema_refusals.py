"""JSON schemas the default grammar backend (xgrammar) would have answered wrongly, found by an API
probe: each came back as JSON that breaks the schema with finish "stop", or held every request's
admission for seconds. Now a 400 naming the keyword and where (or the limit), before anything
streams; a length limit beside ``enum`` is applied to its values instead."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

USER = [{"role": "user", "content": "answer"}]


def _nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth - 1):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def _format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "probe", "schema": schema}}


#: (schema, what the 400 says)
REFUSED = [
    ({"type": "object", "required": ["a"]}, "cannot enforce 'required' 'a' (not in 'properties') at #"),
    (
        {"properties": {"b": {"type": "integer"}}, "required": ["a"]},
        "cannot enforce 'required' 'a' (not in 'properties') at #",
    ),
    ({"type": "string", "pattern": "^[a-z]+$", "minLength": 5}, "cannot enforce 'minLength' beside 'pattern' at #"),
    ({"type": "string", "format": "date", "minLength": 12}, "cannot enforce 'minLength' beside 'format' 'date'"),
    ({"type": "string", "enum": ["aa", "b"], "minLength": 3}, "accepts no value, as the schema false: 'enum'"),
    ({"anyOf": []}, "accepts no value, as the schema false: 'anyOf' of no schemas at #"),
    ({"oneOf": []}, "accepts no value, as the schema false: 'oneOf' of no schemas at #"),
    (_nested(450), "nested deeper than 64 levels at #/properties/a"),
]  # fmt: skip


@pytest.mark.parametrize(("schema", "says"), REFUSED)
@pytest.mark.parametrize("stream", [False, True])
def test_a_schema_the_backend_would_answer_wrongly_is_a_400_naming_why(
    client, model_name, schema, says, stream
):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=model_name, messages=USER, response_format=_format(schema), max_tokens=20, stream=stream
        )
    assert err.value.body["param"] == "response_format"
    assert says in err.value.body["message"], err.value.body


def test_a_deeply_nested_schema_is_refused_at_once(server, auth, model_name):
    """A 450-deep schema held the tokenizer process (and so every request's admission) 9-13 s."""
    body = {"model": model_name, "messages": USER, "max_tokens": 5, "response_format": _format(_nested(450))}
    started = time.perf_counter()
    resp = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=auth, timeout=60)
    assert resp.status_code == 400, resp.text
    assert time.perf_counter() - started < 3.0
    assert "nested deeper than 64 levels" in resp.json()["error"]["message"]


def test_a_moderately_nested_schema_is_answered(client, model_name):
    schema = _nested(20)
    resp = client.chat.completions.create(
        model=model_name, messages=USER, response_format=_format(schema), max_tokens=200, seed=1
    )
    choice = resp.choices[0]
    if choice.finish_reason == "stop":  # random weights: the answer may not end within max_tokens
        value = json.loads(choice.message.content)
        for _ in range(19):
            value = value["a"]
        assert isinstance(value, str)


def test_a_length_limit_beside_enum_keeps_only_the_values_it_allows(client, model_name):
    """``{"enum": ["aa", "bbbb"], "minLength": 3}`` was answered "aa"."""
    schema = {"type": "string", "enum": ["aa", "bbbb", "c"], "minLength": 3}
    resp = client.chat.completions.create(
        model=model_name, messages=USER, response_format=_format(schema), max_tokens=20, n=4, seed=2
    )
    assert [c.message.content for c in resp.choices] == ['"bbbb"'] * 4
    assert {c.finish_reason for c in resp.choices} == {"stop"}
