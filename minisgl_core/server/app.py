"""The FastAPI application: the routes, the error format, the API key, CORS, and the state's lifetime."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from minisgl_core.server.api_options import ApiOptions, ApiTokenizer
from minisgl_core.server.body_limit import BodyGate
from minisgl_core.server.errors import (
    APIError,
    install_error_handlers,
    is_anthropic_path,
    route_error_body,
)
from minisgl_core.server.head_requests import HeadAsGet
from minisgl_core.server.messages_api import messages_router
from minisgl_core.server.native_routes import PUBLIC_PATHS, health_router, info_router, native_router
from minisgl_core.server.openapi import build_schema
from minisgl_core.server.responses_api import responses_router
from minisgl_core.server.routes import make_router
from minisgl_core.server.sagemaker import sagemaker_router
from minisgl_core.server.state import ServerState
from minisgl_core.server.tokenize_routes import tokenize_router

_NO_KEY = "invalid or missing API key (send 'Authorization: Bearer <key>')"
#: Anthropic's clients send the key in its own header (/v1/messages takes either)
_NO_ANTHROPIC_KEY = "invalid or missing API key (send 'x-api-key: <key>' or 'Authorization: Bearer <key>')"


def _key_matches(authorization: str, expected: bytes) -> bool:
    # "Bearer KEY", the scheme in any case (RFC 9110: auth schemes are case-insensitive)
    scheme, _, given = authorization.partition(" ")
    return (scheme.lower() == "bearer") & secrets.compare_digest(given.encode(), expected)


def _authorized(path: str, authorization: str, x_api_key: str | None, expected: bytes) -> bool:
    """The key in ``Authorization: Bearer``, or on Anthropic's routes in ``x-api-key``."""
    if _key_matches(authorization, expected):
        return True
    return (
        x_api_key is not None
        and is_anthropic_path(path)
        and secrets.compare_digest(x_api_key.encode(), expected)
    )


def _refusal(path: str) -> JSONResponse:
    message = _NO_ANTHROPIC_KEY if is_anthropic_path(path) else _NO_KEY
    return JSONResponse(route_error_body(path, 401, message, None, "invalid_api_key"), status_code=401)


def require_api_key(api_key: str) -> Callable[[Request], None]:
    expected = api_key.encode()

    def check(request: Request) -> None:
        headers = request.headers
        if not _authorized(
            request.url.path, headers.get("authorization", ""), headers.get("x-api-key"), expected
        ):
            message = _NO_ANTHROPIC_KEY if is_anthropic_path(request.url.path) else _NO_KEY
            raise APIError(401, message, code="invalid_api_key")

    return check


class ApiKeyGate:
    """ASGI middleware: a request without the key gets its 401 before its body is read or checked
    (as vLLM's): an unauthenticated client got "malformed JSON body", the 415 of a compressed body
    or the 413 of a large one, that is, the server parsed what anyone sent. ``public`` paths
    (/health, /ping) and CORS preflights (OPTIONS, which browsers send without the key) pass; the routes'
    own ``require_api_key`` stays (the OpenAPI schema documents it)."""

    def __init__(
        self, app: Any, api_key: str, public: frozenset[str], on_refused: Callable[[], None]
    ) -> None:
        self.app = app
        self.expected = api_key.encode()
        self.public = public
        self.on_refused = on_refused

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or scope["path"] in self.public:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        x_api_key = headers.get(b"x-api-key")
        given = x_api_key.decode("latin-1") if x_api_key is not None else None
        if _authorized(scope["path"], authorization, given, self.expected):
            await self.app(scope, receive, send)
            return
        self.on_refused()
        await _refusal(scope["path"])(scope, receive, send)


class CountOpenRequests:
    """ASGI middleware: the HTTP requests between their headers and the end of their answer
    (``ServerState.open_requests``). A shutdown's drain waits for them too: a request whose body
    was still arriving when SIGTERM came on an idle server was reset when the process exited,
    with no answer; its body read, it now gets the draining server's 503."""

    def __init__(self, app: Any, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.state.open_requests += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.open_requests -= 1


def create_app(
    state: ServerState,
    api_key: str | None = None,
    options: ApiOptions | None = None,
    info: dict[str, Any] | None = None,
) -> FastAPI:
    """The app over ``state``; ``info`` is scheduler rank 0's ready report (for /get_server_info)."""
    options = options or ApiOptions()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.start()
        try:
            yield
        finally:
            await state.stop()

    # /openapi.json is served below, behind the API key like the API it describes; no /docs pages.
    app = FastAPI(title="minisgl", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    def count_error(status: int) -> None:
        state.metrics.rejected += 1

    install_error_handlers(app, count_error)
    tokenizer = ApiTokenizer(state.model.path, options.chat_template)
    app.include_router(health_router(state))
    protected = [Depends(require_api_key(api_key))] if api_key else []
    app.include_router(make_router(state, options, tokenizer), dependencies=protected)
    app.include_router(responses_router(state, options, tokenizer), dependencies=protected)
    app.include_router(messages_router(state, options, tokenizer), dependencies=protected)
    app.include_router(native_router(state), dependencies=protected)
    app.include_router(info_router(state, info or {}), dependencies=protected)
    app.include_router(sagemaker_router(), dependencies=protected)
    # outermost last: HEAD seen as GET, CORS headers on every answer (a 401 or 413 too), the key,
    # then the body's size and coding
    app.add_middleware(BodyGate, max_bytes=state.limits.max_body_bytes)
    if api_key:
        app.add_middleware(
            ApiKeyGate, api_key=api_key, public=PUBLIC_PATHS, on_refused=lambda: count_error(401)
        )
    if options.allowed_origins:
        from minisgl_core.server.cors import OpenAICors

        app.add_middleware(OpenAICors, allowed_origins=options.allowed_origins)
    app.add_middleware(HeadAsGet)
    app.add_middleware(CountOpenRequests, state=state)
    app.include_router(tokenize_router(state, tokenizer, options), dependencies=protected)
    schema = build_schema(app, protected=bool(protected))
    app.openapi = lambda: schema  # type: ignore[method-assign]

    @app.get("/openapi.json", include_in_schema=False, dependencies=protected)
    async def openapi() -> dict[str, Any]:
        return schema

    return app
