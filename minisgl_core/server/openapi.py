"""The OpenAPI schema the server publishes at /openapi.json, telling the truth about its errors.

FastAPI documents a 422 with its own body for every route that validates input; this server
answers such input with a 400 in OpenAI's error shape (``errors.py``), and has more answers of its
own (413 or 415 before a body is read, 429 when full, 504 past a request's ``timeout``...). The
schema here replaces FastAPI's 422 with what each route can really answer, all with the one error
body (Anthropic's on its /v1/messages routes), so clients and schema-driven fuzzers (schemathesis) can check responses against it.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from minisgl_core.server.errors import ANTHROPIC_ERROR_TYPES, ERROR_TYPES, is_anthropic_path
from minisgl_core.server.native_routes import PUBLIC_PATHS

#: OpenAI's error body, as ``errors.error_body`` writes it
ERROR_SCHEMA: dict[str, Any] = {
    "title": "ErrorResponse",
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "additionalProperties": False,
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string", "enum": sorted(set(ERROR_TYPES.values()))},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}

#: Anthropic's error body, as ``errors.anthropic_error_body`` writes it (/v1/messages)
ANTHROPIC_ERROR_SCHEMA: dict[str, Any] = {
    "title": "AnthropicErrorResponse",
    "type": "object",
    "required": ["type", "error"],
    "additionalProperties": False,
    "properties": {
        "type": {"type": "string", "const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "additionalProperties": False,
            "properties": {
                "type": {
                    "type": "string",
                    "enum": sorted({*ANTHROPIC_ERROR_TYPES.values(), "invalid_request_error", "api_error"}),
                },
                "message": {"type": "string"},
            },
        },
    },
}

#: one server-sent event of a stream: ``data`` is a JSON chunk, an error chunk, or ``[DONE]``
SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}},
}

#: what each error status means, as the schema describes it
ERROR_MEANINGS = {
    400: "Invalid request: the error's param names the field",
    401: "Missing or wrong API key",
    404: "Unknown model",
    413: "Request body over --max-body-bytes",
    415: "Compressed request body (a Content-Encoding other than identity)",
    429: "The server's queue is full; retry after the Retry-After header's seconds",
    500: "The engine failed while answering",
    503: "A worker process failed or the engine is shutting down",
    504: "The request ran past its timeout",
}

#: routes that run the engine: they stream (SSE) on request and answer every engine-side error
#: (SageMaker's /invocations answers as one of the others)
GENERATING = {
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/generate",
    "/invocations",
}
#: routes that take a ``model`` they may not serve
NAMING_A_MODEL = {
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/responses/input_tokens",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/invocations",
    "/v1/models/{model_id}",
    "/tokenize",
    "/detokenize",
}
#: routes that read, delete or cancel a stored response: 404 for an id not stored; a GET may be a
#: 400 (its input items' page: limit, order, after; the response asked with stream), and a cancel
#: is one (minisgl runs no background responses)
STORED = {
    "/v1/responses/{response_id}",
    "/v1/responses/{response_id}/input_items",
    "/v1/responses/{response_id}/cancel",
}
#: routes that answer with the error body on an unhealthy engine (no OpenAI body: {status, error})
HEALTH = {"/health", "/health_generate", "/ping"}
#: routes whose JSON answer is an object or, for several prompts or samples, a list of them
ANSWERS_A_LIST = {"/generate", "/invocations"}
BATCH_OR_ONE = {"anyOf": [{"type": "object"}, {"type": "array", "items": {"type": "object"}}]}
#: routes that ask the scheduler to empty the prefix cache: refused while busy, and like the
#: pause and continue routes a 503 when the server cannot serve (a busy one answers late)
FLUSHING = {"/flush_cache", "/reset_prefix_cache"}
PAUSING = {"/pause_generation", "/continue_generation"}
#: routes that load new weights: a 400 when none can be taken (the old ones serve on), a 503 when
#: the server cannot serve
UPDATING_WEIGHTS = {"/update_weights_from_disk"}


def error_statuses(path: str, method: str, protected: bool) -> list[int]:
    """The error statuses ``method path`` can answer, sorted."""
    statuses: set[int] = set()
    if method == "post":
        # (SageMaker's POST /ping reads no body: only the body's gate can refuse it)
        statuses |= {413, 415} if path == "/ping" else {400, 413, 415}
    if protected and path not in PUBLIC_PATHS:
        statuses.add(401)
    if path in NAMING_A_MODEL or path in STORED:
        statuses.add(404)
    if path in STORED and method == "get":
        statuses.add(400)
    if path in GENERATING:
        statuses |= {429, 500, 503, 504}
    if path in FLUSHING:
        statuses |= {400, 503}
    if path in PAUSING:
        statuses.add(503)
    if path in UPDATING_WEIGHTS:
        statuses |= {400, 503}
    return sorted(statuses)


def build_schema(app: FastAPI, protected: bool) -> dict[str, Any]:
    """``app``'s OpenAPI schema with each route's real error answers instead of FastAPI's 422."""
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    for model in components.values():
        _nullable_optionals(model)
    components["ErrorResponse"] = ERROR_SCHEMA
    components["AnthropicErrorResponse"] = ANTHROPIC_ERROR_SCHEMA
    openai_error_ref = {"$ref": "#/components/schemas/ErrorResponse"}
    # SGLang's answer beside OpenAI's error: {"success": false, "message", "num_paused_requests"}
    components["WeightUpdateFailure"] = {
        **ERROR_SCHEMA,
        "title": "WeightUpdateFailure",
        "required": ["error", "success", "message", "num_paused_requests"],
        "properties": {
            **ERROR_SCHEMA["properties"],
            "success": {"type": "boolean", "const": False},
            "message": {"type": "string"},
            "num_paused_requests": {"type": "integer"},
        },
    }
    for path, operations in schema.get("paths", {}).items():
        # (Anthropic's routes answer errors in its shape)
        error_ref = (
            {"$ref": "#/components/schemas/AnthropicErrorResponse"}
            if is_anthropic_path(path)
            else openai_error_ref
        )
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            for status in error_statuses(path, method, protected):
                content = {"application/json": {"schema": error_ref}}
                if path in UPDATING_WEIGHTS and status == 400:
                    # (a body refused before the update: OpenAI's error alone)
                    failure = {"$ref": "#/components/schemas/WeightUpdateFailure"}
                    content = {"application/json": {"schema": {"anyOf": [error_ref, failure]}}}
                meaning = "No stored response of that id" if path in STORED and status == 404 else None
                responses[str(status)] = {
                    "description": meaning or ERROR_MEANINGS[status],
                    "content": content,
                }
            if path in HEALTH:
                responses["503"] = {
                    "description": "The engine is not making progress",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                }
            if path in GENERATING:
                ok = responses.setdefault("200", {"description": "Successful Response"})
                # /generate answers a list for a batch or n > 1 (SGLang's), and /invocations
                # answers as /generate for a body with its keys
                answer = BATCH_OR_ONE if path in ANSWERS_A_LIST else {"type": "object"}
                ok["content"] = {
                    "application/json": {"schema": answer},
                    "text/event-stream": {"schema": SSE_EVENT},
                }
    return schema


def _nullable_optionals(model: dict[str, Any]) -> None:
    """A field sent as null counts as not sent (``schemas.StrictModel``): say so for every optional
    property, so that a client or fuzzer reading the schema expects null to be accepted; and for
    fields the body does not have, which are refused unless null (``additionalProperties`` is
    ``{"type": "null"}`` rather than false: a randomised fuzz run sent ``{"": null}`` and called the
    200 a schema violation)."""
    if model.get("additionalProperties") is False:
        model["additionalProperties"] = {"type": "null"}
    required = set(model.get("required", ()))
    for name, prop in model.get("properties", {}).items():
        if name in required or _allows_null(prop):
            continue
        outer = {k: prop.pop(k) for k in ("title", "default", "description") if k in prop}
        model["properties"][name] = {**outer, "anyOf": [prop, {"type": "null"}]}


def _allows_null(prop: dict[str, Any]) -> bool:
    return prop.get("type") == "null" or any(_allows_null(p) for p in prop.get("anyOf", ()))
