"""Refuse request bodies the API cannot take before they are read into memory: over
``--max-body-bytes`` (413), or compressed (415: FastAPI read a gzip body as text and answered
"There was an error parsing the body")."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from minisgl_core.server.errors import route_error_body

Scope = dict[str, Any]


class BodyGate:
    """ASGI middleware: a Content-Encoding other than identity is refused at once, and so is a
    declared Content-Length over the bound; a body without one (chunked) is read here up to the
    bound, refused past it, or replayed to the app."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _refuse(self, path: str) -> JSONResponse:
        message = f"the request body is larger than this server's limit of {self.max_bytes} bytes"
        return JSONResponse(route_error_body(path, 413, message, None, "body_too_large"), status_code=413)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        encoding = headers.get(b"content-encoding", b"").strip().lower()
        if encoding not in (b"", b"identity"):
            await _refuse_encoding(encoding.decode("latin-1"), scope["path"])(scope, receive, send)
            return
        declared = headers.get(b"content-length")
        if declared is not None:
            if declared.isdigit() and int(declared) > self.max_bytes:
                await self._refuse(scope["path"])(scope, receive, send)
                return
            await self.app(scope, receive, send)  # the HTTP server enforces the declared length
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._refuse(scope["path"])(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # from here on: the disconnect, whenever it comes

        await self.app(scope, replay, send)


def _refuse_encoding(encoding: str, path: str) -> JSONResponse:
    message = (
        f"compressed request bodies are not supported (Content-Encoding: {encoding[:40]}): "
        "send the body uncompressed, without a Content-Encoding header"
    )
    # RFC 9110 15.5.16: a 415 for a content coding says which codings are accepted
    return JSONResponse(
        route_error_body(path, 415, message, None, "unsupported_content_encoding"),
        status_code=415,
        headers={"Accept-Encoding": "identity"},
    )
