"""Amazon SageMaker's inference route, ``POST /invocations`` (its ``/ping`` is /health's handler,
``native_routes.health_router``), as vLLM's OpenAI server has it.

SageMaker sends every request to ``/invocations``; the body's keys say which route it is for
(:data:`TARGETS`, the first whose key is present and not null), and the app's router then runs
that route on the same request, its body replayed: the route's own API key dependency,
validation, errors, request id, metrics and stream are the answer, nothing is done twice here.
(vLLM tries its request types in order and takes the first that validates; choosing by key
instead lets a chat body with a bad field get the chat route's own 400, not "no route fits".)
The ASGI middlewares (API key, body size, CORS) ran once already, on ``/invocations``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel

from minisgl_core.server.errors import APIError, json_kind
from minisgl_core.server.responses_schema import ResponsesRequest
from minisgl_core.server.schemas import ChatCompletionRequest, CompletionRequest, GenerateRequest


@dataclass(frozen=True)
class Target:
    """A route ``/invocations`` forwards to: a body with one of ``keys`` (not null) goes there."""

    keys: tuple[str, ...]
    path: str
    body: type[BaseModel]


#: in order: the first that fits wins. ``input`` before ``text``: a Responses body's ``text`` is
#: its output format; a Responses ``prompt`` (a stored prompt, refused there) goes to completions
TARGETS = (
    Target(("messages",), "/v1/chat/completions", ChatCompletionRequest),
    Target(("prompt",), "/v1/completions", CompletionRequest),
    Target(("input",), "/v1/responses", ResponsesRequest),
    Target(("text", "input_ids"), "/generate", GenerateRequest),
)

EXPECTED = "; ".join(f"{' or '.join(t.keys)} for {t.path}" for t in TARGETS)


def target_path(raw: bytes) -> str:
    """The path of the route ``raw`` (the request body) is for; a 400 naming the keys looked for
    when it is not a JSON object with one of them."""
    try:
        body: Any = json.loads(raw)
    except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError)
        got = "an empty body" if not raw.strip() else "a body that is not valid JSON"
    else:
        if isinstance(body, dict):
            for target in TARGETS:
                if any(body.get(key) is not None for key in target.keys):
                    return target.path
            got = "an object with none of them"
        else:
            got = json_kind(body)
    raise APIError(
        400,
        f"/invocations takes a JSON object and answers as the route its keys name ({EXPECTED}); got {got}",
    )


class Forwarded(Response):
    """The answer of the route at ``path`` to this request, whose body ``body`` was read already:
    the app's router runs that route with a copy of the request's scope (the path changed) and the
    body replayed, then the connection's own messages (the client's disconnect)."""

    def __init__(self, path: str, body: bytes) -> None:
        super().__init__()
        self.path = path
        self.request_body = body

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": self.request_body, "more_body": False}
            return await receive()

        routed = {**scope, "path": self.path, "raw_path": self.path.encode()}
        await scope["app"].router(routed, replay, send)


def _request_body() -> dict[str, Any]:
    """What the schema says /invocations takes: any body of the routes it forwards to."""
    refs = [{"$ref": f"#/components/schemas/{t.body.__name__}"} for t in TARGETS]
    return {"required": True, "content": {"application/json": {"schema": {"anyOf": refs}}}}


def sagemaker_router() -> APIRouter:
    router = APIRouter()

    @router.post("/invocations", openapi_extra={"requestBody": _request_body()})
    async def invocations(request: Request) -> Response:
        """SageMaker's inference route: the body goes to the route its keys name, as if sent
        there: ``messages`` to /v1/chat/completions, ``prompt`` to /v1/completions, ``input`` to
        /v1/responses, ``text`` or ``input_ids`` to /generate (the first present); any other
        body is a 400 naming them."""
        raw = await request.body()
        return Forwarded(target_path(raw), raw)

    return router
