"""Fuzzing the live server: whatever a client sends, no 5xx, the server stays alive, and every
error comes in OpenAI's shape (Anthropic's on /v1/messages).

Two sources of requests, both bounded to run in CI on two cores in about a minute:

- schemathesis, from the server's own OpenAPI schema (generated from the FastAPI app here: the
  same schema the server publishes at /openapi.json, see test_openapi.py), valid and invalid
  bodies for every route, each answer checked against the schema too: its status is one the
  route documents, its body (an error's, each SSE event) matches what is documented for it, and
  a body the schema calls invalid is refused (this is what catches pydantic's lax mode reading
  ``true`` as 1);
- hypothesis strategies for sampling parameters, prompts and chat messages with the values that
  used to hurt: integers past 64 bits, lone surrogates, NaN, tiny temperatures, penalties with
  stops.

Generated outputs are kept short: a body's max_tokens is capped at a few tokens (its out-of-range
values are kept, they are what the fuzzing is for).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core import NOT_SET

from minisgl_core.server.app import create_app
from minisgl_core.server.state import ModelInfo, ServerState

#: the most tokens a fuzzed request may generate (per choice)
MAX_FUZZ_TOKENS = 3
MAX_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_new_tokens", "max_output_tokens")
#: per phase and route for schemathesis (about 700 requests in all), per test for hypothesis
FUZZ_SETTINGS = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,  # the same examples on every CI run: a failure is reproducible
    suppress_health_check=list(HealthCheck),
)


def openapi_schema() -> dict[str, Any]:
    """The OpenAPI schema of the server's FastAPI app (the state is never started)."""
    info = ModelInfo(name="m", path="m", max_context_len=2048, kv_capacity_tokens=16384, vocab_size=1024)
    return create_app(ServerState(endpoints=None, model=info)).openapi()


SCHEMA = schemathesis.openapi.from_dict(openapi_schema())
#: what the answers must agree with the schema on (no 5xx is assert_well_formed's, which allows
#: the 504 a fuzzed tiny ``timeout`` asks for)
SCHEMA_CHECKS = [
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


def bound_output(body: Any) -> Any:
    """Cap how many tokens a generated body asks for; leave everything else (bad values too) alone."""
    if isinstance(body, dict):
        for key in MAX_TOKEN_FIELDS:
            if key in body and body[key] is None:  # null means unset: the whole context
                del body[key]
            value = body.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 2**20:
                body[key] = min(value, MAX_FUZZ_TOKENS)
        if not any(key in body for key in MAX_TOKEN_FIELDS) and ("prompt" in body or "messages" in body):
            body["max_tokens"] = MAX_FUZZ_TOKENS
        if not any(key in body for key in MAX_TOKEN_FIELDS) and "input" in body:  # /v1/responses
            body["max_output_tokens"] = MAX_FUZZ_TOKENS
        params = body.get("sampling_params")
        if isinstance(params, dict):
            bound_output(params)
            params.setdefault("max_new_tokens", MAX_FUZZ_TOKENS)
        elif params is None and ("text" in body or "input_ids" in body):
            body["sampling_params"] = {"max_new_tokens": MAX_FUZZ_TOKENS}
        n = body.get("n")
        if isinstance(n, int) and 1 <= n <= 64:
            body["n"] = min(n, 2)
    return body


def assert_well_formed(response: Any) -> None:
    """No 5xx (but the 504 a request's own ``timeout`` asks for when it runs out); an error is
    OpenAI's ``{"error": {message, type, param, code}}``."""
    status = response.status_code
    if "/v1/messages" in str(response.request.url):
        assert_anthropic_well_formed(response)
        return
    if status == 504:  # a fuzzed tiny `timeout`: the deadline the client set, not a server fault
        assert response.json()["error"]["code"] == "request_timeout", response.text[:2000]
        return
    assert status < 500, response.text[:2000]
    if status >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str) and error["message"]
        assert error["param"] is None or isinstance(error["param"], str)
    elif "text/event-stream" in str(response.headers.get("content-type", "")):
        # (schemathesis' responses list each header's values; httpx's give a string)
        # (SSE ends lines with \n only: str.splitlines would also split at a U+0085 in the text)
        events = [line[len("data: ") :] for line in response.text.split("\n") if line.startswith("data: ")]
        if events and events[-1].startswith('{"type": "response.'):  # /v1/responses: no [DONE]
            last = json.loads(events[-1])
            assert last["type"] in ("response.completed", "response.incomplete", "response.failed"), last
            errors = [json.loads(e) for e in events if e.startswith('{"type": "error"')]
            # only a fuzzed tiny `timeout` running out ends a stream with an error
            assert all(e["code"] == "request_timeout" for e in errors), errors
            return
        assert events and events[-1] == "[DONE]", response.text[-2000:]
        for event in events[:-1]:
            error = json.loads(event).get("error")
            # only a fuzzed tiny `timeout` running out ends a stream with an error, as the 504's
            assert error is None or error["code"] == "request_timeout", event


def assert_anthropic_well_formed(response: Any) -> None:
    """/v1/messages answers in Anthropic's shape: an error ``{"type": "error", "error": {type,
    message}}``; a stream of its events, the last ``message_stop`` (a fuzzed body sets no timeout:
    no error event)."""
    assert response.status_code < 500, response.text[:2000]
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"type", "error"} and body["type"] == "error", body
        assert set(body["error"]) == {"type", "message"} and body["error"]["message"], body
    elif "text/event-stream" in str(response.headers.get("content-type", "")):
        events = [line[len("data: ") :] for line in response.text.split("\n") if line.startswith("data: ")]
        assert [json.loads(e)["type"] for e in events[:1] + events[-1:]] == ["message_start", "message_stop"]


def assert_alive(url: str) -> None:
    health = httpx.get(f"{url}/health", timeout=30)
    assert health.status_code == 200 and health.json()["status"] == "ok", health.text


# ------------------------------------------------------------------------ schemathesis


@SCHEMA.parametrize()
@FUZZ_SETTINGS
def test_schema_fuzz_gets_no_server_error(case, server, auth):
    # (a count generates nothing: no max_output_tokens, no max_tokens)
    if case.path not in ("/v1/responses/input_tokens", "/v1/messages/count_tokens"):
        case.body = bound_output(case.body)
    response = case.call(base_url=server.url, headers=auth, timeout=120)
    assert_well_formed(response)
    checks = SCHEMA_CHECKS
    if (case.body is None or case.body is NOT_SET) and _body_optional(case):
        # schemathesis' negative phase sends such a route no body, or a JSON null, as
        # "schema-violating" (its mutation of an optional, nullable body failed: "Invalid
        # component: positive test case"), and calls the 200 a failure: /pause_generation's body
        # is optional and may be null (``anyOf: [{$ref}, {type: null}]``), so both are valid
        checks = [check for check in SCHEMA_CHECKS if check is not negative_data_rejection]
    case.validate_response(response, checks=checks)


def _body_optional(case: Any) -> bool:
    """Whether ``case``'s route takes no body or a JSON null as its body."""
    body = case.operation.definition.raw.get("requestBody") or {}
    schema = body.get("content", {}).get("application/json", {}).get("schema", {})
    return not body.get("required") and {"type": "null"} in schema.get("anyOf", [])


# ------------------------------------------------------------------------ hypothesis

EDGE_INTS = [0, -1, 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 2**80]
integers = st.one_of(st.integers(-3, 40), st.sampled_from(EDGE_INTS), st.integers(-(2**70), 2**70))
#: mostly sensible values, the edges now and then
small_or_edge = st.one_of(st.integers(-1, 40), st.integers(-1, 40), integers)
numbers = st.one_of(
    st.floats(0, 1),
    st.floats(0, 1),
    st.sampled_from([0.0, 1e-320, 5e-3, 0.7, 1.0, 2.0, -0.5, 3.0]),
    st.floats(allow_nan=True, allow_infinity=True),
    integers,
)
#: text with the characters that used to break things: lone surrogates, controls, emoji
texts = st.text(
    st.one_of(st.characters(codec="utf-8"), st.characters(categories=["Cs"]), st.sampled_from(" \n\x00é😀")),
    max_size=12,
)
junk = st.one_of(st.none(), st.booleans(), texts, st.lists(integers, max_size=3), st.just({}))


def maybe(strategy: st.SearchStrategy) -> st.SearchStrategy:
    """The strategy, or now and then (1 in 10) a value of the wrong type: rarely, so that most
    bodies get past the schema and reach the range checks, the tokenizer and the scheduler."""
    return st.one_of(*[strategy] * 9, junk)


sampling_fields = st.fixed_dictionaries(
    {"max_tokens": st.one_of(*[st.integers(1, MAX_FUZZ_TOKENS)] * 4, integers, junk)},
    optional={
        "temperature": maybe(numbers),
        "top_p": maybe(numbers),
        "top_k": maybe(small_or_edge),
        "min_p": maybe(numbers),
        "seed": maybe(small_or_edge),
        "presence_penalty": maybe(numbers),
        "frequency_penalty": maybe(numbers),
        "stop": maybe(st.one_of(texts, st.lists(texts, max_size=3))),
        "stop_token_ids": maybe(st.lists(small_or_edge, max_size=3)),
        "n": maybe(st.one_of(st.integers(1, 2), integers)),
        "ignore_eos": maybe(st.booleans()),
        "stream": maybe(st.booleans()),
        "stream_options": maybe(st.fixed_dictionaries({}, optional={"include_usage": maybe(st.booleans())})),
    },
)
prompts = st.one_of(texts, texts, st.lists(small_or_edge, max_size=4), st.lists(texts, max_size=3), junk)
messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": maybe(st.sampled_from(["system", "developer", "user", "assistant", "wizard"])),
            "content": maybe(
                st.one_of(
                    texts,
                    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}), max_size=2),
                )
            ),
        }
    ),
    max_size=3,
)


def post(url: str, auth: dict[str, str], path: str, body: dict[str, Any]) -> httpx.Response:
    # Encoded here: json.dumps escapes lone surrogates (httpx's encoder would refuse them) and
    # writes NaN, which the server's JSON parser accepts, so the range checks meet it.
    content = json.dumps(body)
    headers = {**auth, "Content-Type": "application/json"}
    return httpx.post(f"{url}{path}", content=content, headers=headers, timeout=120)


@given(fields=sampling_fields, prompt=prompts)
@FUZZ_SETTINGS
def test_completions_fuzz(server, auth, fields, prompt):
    body = bound_output({**fields, "prompt": prompt})
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        body["logprobs"] = 1
    assert_well_formed(post(server.url, auth, "/v1/completions", body))


@given(fields=sampling_fields, chat=messages, logprobs=maybe(st.booleans()), top=maybe(integers))
@FUZZ_SETTINGS
def test_chat_fuzz(server, auth, fields, chat, logprobs, top):
    body = bound_output({**fields, "messages": chat, "logprobs": logprobs, "top_logprobs": top})
    assert_well_formed(post(server.url, auth, "/v1/chat/completions", body))


#: JSON schemas of many shapes: nested objects and arrays, anyOf / oneOf / allOf / not, $ref (to
#: itself too), formats, bounds past 64 bits, characters outside the BMP. A longer random run of
#: this found two 500s: an integer the inter-process message could not carry, and a grammar that
#: allowed no next token part-way
schema_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.sampled_from([2**63, -(2**63) - 1, 10**30]),  # past 64 bits
    st.floats(allow_nan=False),
    texts,
)
schema_leaves = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["string", "integer", "number", "boolean", "object", "array", "null", "foo"]),
        "enum": st.lists(schema_scalars, max_size=3),
        "const": schema_scalars,
        "pattern": st.sampled_from(["^a+$", "[", "(a|b)*c{2,3}", "\\d{1,5}", ".*"]),
        "minLength": st.integers(-2, 20),
        "maxLength": st.integers(-2, 20),
        "minimum": schema_scalars,
        "maximum": schema_scalars,
        "format": st.sampled_from(["date-time", "email", "uuid", "ipv4", "date", "weird"]),
    },
)
json_schemas = st.recursive(
    schema_leaves,
    lambda inner: st.one_of(
        st.fixed_dictionaries(
            {
                "type": st.just("object"),
                "properties": st.dictionaries(st.text(max_size=4), inner, max_size=3),
            },
            optional={
                "required": st.lists(st.text(max_size=4), max_size=2),
                "additionalProperties": st.one_of(st.booleans(), inner),
            },
        ),
        st.fixed_dictionaries(
            {"type": st.just("array"), "items": inner},
            optional={"minItems": st.integers(-1, 4), "maxItems": st.integers(-1, 4)},
        ),
        st.fixed_dictionaries({"anyOf": st.lists(inner, max_size=3)}),
        st.fixed_dictionaries({"oneOf": st.lists(inner, max_size=2)}),
        st.fixed_dictionaries({"allOf": st.lists(inner, max_size=2)}),
        st.fixed_dictionaries({"not": inner}),
        st.fixed_dictionaries({"$ref": st.sampled_from(["#", "#/properties/a", "#/$defs/a", "http://x"])}),
    ),
    max_leaves=6,
)


@given(schema=json_schemas, where=st.sampled_from(["chat", "completions", "tool"]), stream=st.booleans())
@FUZZ_SETTINGS
def test_json_schema_fuzz(server, auth, schema, where, stream):
    """Any JSON schema as response_format (chat, completions) or as a forced tool's parameters:
    a 200, or a 4xx in OpenAI's shape; a stream may end with a request error, never an internal one."""
    body: dict[str, Any] = {"max_tokens": 6, "stream": stream}
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    if where == "completions":
        path, body = "/v1/completions", {**body, "prompt": "{", "response_format": fmt}
    else:
        path, body = "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": "json"}]}
        if where == "chat":
            body["response_format"] = fmt
        else:
            body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
            body["tool_choice"] = "required"
    resp = post(server.url, auth, path, body)
    assert resp.status_code < 500, resp.text[:2000]
    if resp.status_code >= 400:
        assert set(resp.json()["error"]) == {"message", "type", "param", "code"}, resp.text[:2000]
    elif stream:
        for line in resp.text.split("\n"):
            if line.startswith("data: {"):
                error = json.loads(line[len("data: ") :]).get("error")
                assert error is None or error["type"] != "internal_server_error", line[:2000]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/generate"])
def test_server_survived_the_fuzzing(server, auth, path):
    """Runs after the fuzz tests (file order): the server still answers a plain request."""
    assert_alive(server.url)
    body: dict[str, Any] = {"max_tokens": 2, "temperature": 0}
    if path == "/generate":
        body = {"text": "hi", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    elif "chat" in path:
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    resp = httpx.post(f"{server.url}{path}", json=body, headers=auth, timeout=60)
    assert resp.status_code == 200, resp.text
