"""The FastAPI application: the routes, the error format, the API key, CORS, and the state's lifetime."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request

from minisgl_core.server.api_options import ApiOptions, ApiTokenizer
from minisgl_core.server.body_limit import BodyGate
from minisgl_core.server.errors import APIError, install_error_handlers
from minisgl_core.server.head_requests import HeadAsGet
from minisgl_core.server.native_routes import health_router, info_router, native_router
from minisgl_core.server.openapi import build_schema
from minisgl_core.server.routes import make_router
from minisgl_core.server.state import ServerState
from minisgl_core.server.tokenize_routes import tokenize_router


def require_api_key(api_key: str) -> Callable[[Request], None]:
    expected = api_key.encode()

    def check(request: Request) -> None:
        # "Bearer KEY", the scheme in any case (RFC 9110: auth schemes are case-insensitive)
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if not (scheme.lower() == "bearer") & secrets.compare_digest(given.encode(), expected):
            raise APIError(
                401, "invalid or missing API key (send 'Authorization: Bearer <key>')", code="invalid_api_key"
            )

    return check


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
    if options.allowed_origins:
        from fastapi.middleware.cors import CORSMiddleware

        # Browsers send the key in Authorization, so that header must be allowed; credentials
        # (cookies) are not used by this API.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(options.allowed_origins),
            allow_methods=["GET", "HEAD", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type"],
        )
    tokenizer = ApiTokenizer(state.model.path, options.chat_template)
    app.include_router(health_router(state))
    protected = [Depends(require_api_key(api_key))] if api_key else []
    app.include_router(make_router(state, options, tokenizer), dependencies=protected)
    app.include_router(native_router(state), dependencies=protected)
    app.include_router(info_router(state, info or {}), dependencies=protected)
    app.add_middleware(BodyGate, max_bytes=state.limits.max_body_bytes)
    app.add_middleware(HeadAsGet)  # outermost: everything inside sees the GET
    app.include_router(tokenize_router(state, tokenizer), dependencies=protected)
    schema = build_schema(app, protected=bool(protected))
    app.openapi = lambda: schema  # type: ignore[method-assign]

    @app.get("/openapi.json", include_in_schema=False, dependencies=protected)
    async def openapi() -> dict[str, Any]:
        return schema

    return app
