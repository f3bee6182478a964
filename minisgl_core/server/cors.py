"""CORS (``--allowed-origins``) whose refused preflights answer as every other 4xx of the server."""

from __future__ import annotations

from typing import Any

from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.responses import Response

from minisgl_core.server.errors import error_body

#: the methods the API answers; a preflight for another is refused
ALLOWED_METHODS = ("GET", "HEAD", "POST", "OPTIONS")


class OpenAICors(CORSMiddleware):
    """Starlette's CORS, but a refused preflight (an origin not in ``--allowed-origins``, a method
    the API does not take) is a 400 in OpenAI's error shape naming what was refused and the fix;
    Starlette answered plain text ("Disallowed CORS origin"), which clients that parse every
    error as ``{"error": {...}}`` could not read. An allowed origin may send any header."""

    def __init__(self, app: Any, allowed_origins: tuple[str, ...]) -> None:
        # Any header (vLLM's rule): the OpenAI SDKs add their own (x-stainless-*, OpenAI-Organization),
        # and a preflight naming one was refused while only Authorization and Content-Type were
        # allowed. Credentials (cookies) are not used by this API.
        super().__init__(
            app, allow_origins=list(allowed_origins), allow_methods=list(ALLOWED_METHODS), allow_headers=["*"]
        )

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        refused = []
        origin = request_headers["origin"]
        if not self.is_allowed_origin(origin=origin):
            refused.append(
                f"origin {origin!r} is not allowed: start the server with it in --allowed-origins "
                "(comma-separated; '*' allows any)"
            )
        method = request_headers["access-control-request-method"]
        if method not in self.allow_methods:
            refused.append(f"method {method!r} is not allowed: the API takes {', '.join(ALLOWED_METHODS)}")
        if request_headers.get("access-control-request-private-network") is not None:
            refused.append("private network access is not allowed")
        message = "CORS preflight refused: " + "; ".join(refused or ["the request is not allowed"])
        # the CORS headers Starlette set (Vary: Origin, the allowed methods) stay
        headers = {
            name: value
            for name, value in response.headers.items()
            if name not in ("content-length", "content-type")
        }  # fmt: skip
        return JSONResponse(
            error_body(400, message, None, "cors_not_allowed"), status_code=400, headers=headers
        )
