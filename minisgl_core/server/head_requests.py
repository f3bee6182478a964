"""HEAD answered like GET without a body: load balancers and Kubernetes probes send HEAD."""

from __future__ import annotations

from typing import Any

Scope = dict[str, Any]


class HeadAsGet:
    """ASGI middleware: a HEAD request runs as the GET to the same path (same status, headers and
    Content-Length, the API key and errors included) and the response body is dropped. One rule
    for every route, so a GET route added later answers HEAD too; a POST-only route still says 405."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        # A copy: the HTTP server reads the method from its own scope to know no body follows.
        await self.app({**scope, "method": "GET"}, receive, headers_only)
