"""/openapi.json describes what the server really answers: a 400 in OpenAI's error shape where
FastAPI would document its 422, and every other error status a route can give, with the same body.
"""

from __future__ import annotations

from typing import Any

import httpx
import jsonschema
import pytest

from minisgl_core.server.app import create_app
from minisgl_core.server.state import ModelInfo, ServerState

GENERATING = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/generate")


def generated_schema(api_key: str | None = None) -> dict[str, Any]:
    info = ModelInfo(name="m", path="m", max_context_len=2048, kv_capacity_tokens=16384, vocab_size=1024)
    return create_app(ServerState(endpoints=None, model=info), api_key=api_key).openapi()


def operations(schema: dict[str, Any]):
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            yield path, method, operation


def error_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The ErrorResponse component, resolvable on its own."""
    return {**schema["components"]["schemas"]["ErrorResponse"], "components": schema["components"]}


def test_no_route_documents_fastapi_422():
    schema = generated_schema("k")
    assert all("422" not in op["responses"] for _, _, op in operations(schema))
    assert "HTTPValidationError" not in schema["components"]["schemas"]


def test_every_body_route_documents_its_400_in_its_apis_shape():
    schema = generated_schema()
    posts = [(path, op) for path, method, op in operations(schema) if method == "post"]
    assert {p for p, _ in posts} >= {*GENERATING, "/tokenize", "/detokenize"}
    for path, op in posts:
        # (SageMaker's POST /ping reads no body: it cannot be a 400)
        for status in ("413", "415") if path == "/ping" else ("400", "413", "415"):
            ref = op["responses"][status]["content"]["application/json"]["schema"]
            if (path, status) == ("/update_weights_from_disk", "400"):
                # OpenAI's error, with SGLang's answer beside it when the weights were not taken
                failure = {"$ref": "#/components/schemas/WeightUpdateFailure"}
                assert ref == {"anyOf": [{"$ref": "#/components/schemas/ErrorResponse"}, failure]}
                continue
            # (Anthropic's routes answer in its error shape)
            shape = "AnthropicErrorResponse" if path.startswith("/v1/messages") else "ErrorResponse"
            assert ref == {"$ref": f"#/components/schemas/{shape}"}, (path, status)
    for path in GENERATING:
        responses = schema["paths"][path]["post"]["responses"]
        assert {"429", "504"} <= set(responses), path
        assert "text/event-stream" in responses["200"]["content"], path


def test_401_is_documented_only_behind_an_api_key():
    open_schema, keyed = generated_schema(), generated_schema("k")
    assert all("401" not in op["responses"] for _, _, op in operations(open_schema))
    for path, _, op in operations(keyed):
        assert ("401" in op["responses"]) == (path not in ("/health", "/ping")), path


def test_openapi_json_is_served_behind_the_key(server, auth):
    assert httpx.get(f"{server.url}/openapi.json").status_code == 401
    resp = httpx.get(f"{server.url}/openapi.json", headers=auth)
    assert resp.status_code == 200
    assert resp.json() == generated_schema("any key")


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/completions", {"prompt": [True, 5]}, 400),
        ("/v1/chat/completions", {"messages": []}, 400),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "model": "x"}, 404),
        ("/generate", {"text": "hi", "sampling_params": {"top_k": 2**64}}, 400),
        ("/detokenize", {"tokens": "abc"}, 400),
    ],
)
def test_real_errors_match_the_documented_body(server, auth, path, body, status):
    schema = httpx.get(f"{server.url}/openapi.json", headers=auth).json()
    resp = httpx.post(f"{server.url}{path}", json=body, headers=auth)
    assert resp.status_code == status, resp.text
    assert str(status) in schema["paths"][path]["post"]["responses"]
    jsonschema.validate(resp.json(), error_schema(schema))


def test_optional_fields_are_documented_as_nullable(server, auth):
    """Null means "not set" for every optional field, and the schema says so: a client sending
    the nulls it reads there gets an answer, not a 400."""
    schema = generated_schema()
    props = schema["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"type": "null"} in props["presence_penalty"]["anyOf"]
    assert props["presence_penalty"]["default"] == 0.0
    assert not any(p.get("type") == "null" for p in props["messages"].get("anyOf", []))
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "presence_penalty": None}
    body |= {"stream": None, "n": None, "tools": None, "logprobs": None}
    resp = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=auth)
    assert resp.status_code == 200, resp.text
    # a field the body does not have: refused, unless null (which is "not set" there too)
    for name in ("ChatCompletionRequest", "GenerateRequest", "StreamOptions"):
        assert schema["components"]["schemas"][name]["additionalProperties"] == {"type": "null"}, name
    unknown = httpx.post(
        f"{server.url}/v1/chat/completions", json={**body, "": None, "foo": None}, headers=auth
    )
    assert unknown.status_code == 200, unknown.text
    refused = httpx.post(f"{server.url}/v1/chat/completions", json={**body, "foo": 1}, headers=auth)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "foo", refused.text


def test_the_stored_response_routes_document_their_404(server, auth):
    schema = generated_schema("k")
    for path, methods in (
        ("/v1/responses/{response_id}", ("get", "delete")),
        ("/v1/responses/{response_id}/input_items", ("get",)),
        ("/v1/responses/{response_id}/cancel", ("post",)),
    ):
        for method in methods:
            responses = schema["paths"][path][method]["responses"]
            assert {"401", "404"} <= set(responses), (path, method)
            assert responses["404"]["description"] == "No stored response of that id"
            # (GET: a page's limit, order or after, or stream, which no stored response answers;
            # POST: a cancel, for background responses)
            assert ("400" in responses) == (method in ("get", "post")), (path, method)
    for method in ("GET", "DELETE"):
        resp = httpx.request(method, f"{server.url}/v1/responses/resp_none", headers=auth)
        assert resp.status_code == 404
        jsonschema.validate(resp.json(), error_schema(schema))


@pytest.mark.parametrize("path", ["/generate", "/invocations"])
@pytest.mark.parametrize(
    "body",
    [
        {"text": "hi", "sampling_params": {"max_new_tokens": 2}},
        {"text": ["hi", "there"], "sampling_params": {"max_new_tokens": 2}},
        {"text": "hi", "sampling_params": {"max_new_tokens": 2, "n": 2}},
    ],
    ids=["one", "batch", "n2"],
)
def test_generate_answers_match_the_documented_200(server, auth, path, body):
    """/generate answers an object for one prompt and a list for a batch or n > 1; its schema
    says both (a batch's list was documented as an object, which a client checking answers
    against /openapi.json refused; found by fuzzing)."""
    schema = httpx.get(f"{server.url}/openapi.json", headers=auth).json()
    resp = httpx.post(f"{server.url}{path}", json=body, headers=auth, timeout=60)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert isinstance(answer, dict) == (body["text"] == "hi" and "n" not in body["sampling_params"])
    documented = schema["paths"][path]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    jsonschema.validate(answer, documented)
