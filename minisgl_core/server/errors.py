"""Errors of the HTTP API, returned as OpenAI's body ``{"error": {message, type, param, code}}``; on
Anthropic's /v1/messages routes as its body ``{"type": "error", "error": {type, message}}``."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from minisgl_core.sampling import cut

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        #: extra response headers (Retry-After on a 429)
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)


def respell(message: str, names: dict[str, str]) -> str:
    """``message`` with each field of ``names`` (SamplingParams' name or admission's: ``max_tokens``,
    ``min_tokens``, ``prompt``) renamed as the request spelled it (``sampling_params.min_new_tokens``,
    ``prompt.1``): whole words only (sampling_params.max_new_tokens or min_tokens_x are other names)."""
    names = {old: new for old, new in names.items() if old != new}
    if not names:
        return message
    pattern = re.compile(r"(?<![\w.])(the )?(" + "|".join(map(re.escape, names)) + r")(?!\w)")
    return pattern.sub(lambda m: _field_words(m.group(1), names[m.group(2)]), message)


def _field_words(article: str | None, name: str) -> str:
    """A field's name in a message: "shorten prompt.1", not "shorten the prompt.1" (an element of
    a list is named by its path alone); "the" stays before a plain name ("the text")."""
    return name if article is None or re.search(r"\.\d+$", name) else article + name


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "internal_server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


#: Anthropic's error types by status (its SDK raises by status: a 400 is BadRequestError)
ANTHROPIC_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}
#: the paths whose errors are Anthropic's shape (``messages_api``): /v1/messages and below
ANTHROPIC_PATH = "/v1/messages"


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error body, ``{"type": "error", "error": {"type", "message"}}``."""
    kind = ANTHROPIC_ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def is_anthropic_path(path: str) -> bool:
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


def route_error_body(
    path: str, status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The error body in the shape of the API ``path`` belongs to: Anthropic's for /v1/messages
    (which names the field in the message), OpenAI's for every other route."""
    if is_anthropic_path(path):
        return anthropic_error_body(status, message)
    return error_body(status, message, param, code)


def sse_error(message: str, status: int = 500, param: str | None = None, code: str | None = None) -> str:
    """An error in the middle of a stream: the status line is already sent, so it goes as an event
    (with the error type of ``status``, and the param and code a response of that status has)."""
    return f"data: {json.dumps(error_body(status, message, param, code))}\n\n"


#: fields other servers took that minisgl takes under another name (or a start-up option): an
#: unsupported-field 400 for one says what to send instead. vLLM's guided_* went in favour of
#: structured_outputs; SGLang's native names sent to an OpenAI route
RENAMED_FIELDS: dict[str, str] = {
    "guided_json": 'vLLM\'s older name: send structured_outputs {"json": <schema>}, or response_format '
    "json_schema",
    "guided_regex": 'vLLM\'s older name: send structured_outputs {"regex": <pattern>}',
    "guided_choice": 'vLLM\'s older name: send structured_outputs {"choice": [<strings>]}',
    "guided_grammar": 'vLLM\'s older name: send structured_outputs {"grammar": <EBNF>}',
    "guided_json_object": 'vLLM\'s older name: send structured_outputs {"json_object": true}, or '
    "response_format json_object",
    "guided_decoding_backend": "the grammar backend is chosen at start-up: serve --grammar-backend",
    "max_new_tokens": "SGLang's /generate name: send max_tokens (max_completion_tokens on chat)",
}


def validation_error(exc: RequestValidationError) -> APIError:
    """The first problem pydantic found, as a 400 naming the field."""
    errors = exc.errors()
    if not errors:
        return APIError(400, "invalid request body")
    # A union field reports one error per member; a member's own check (a lone surrogate, a range)
    # says more than "not a list" from the members the value was never meant to be.
    err = next((e for e in errors if not _is_type_mismatch(e)), None) or _closest_member(errors)
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    kind = err.get("type", "")
    if kind == "json_invalid":
        return APIError(400, f"malformed JSON body: {err.get('ctx', {}).get('error', err.get('msg'))}")
    if kind == "missing" and not loc:
        return APIError(400, "the request body must be a JSON object")
    # Unions report one error per member; the path of the first member type is noise.
    loc = [p for p in loc if not _is_union_member_tag(p)]
    param = ".".join(loc) or None
    cause = (err.get("ctx") or {}).get("error")
    blamed = getattr(cause, "field", None)
    # a whole-body check that blames a field, or a field's check that blames a part of it
    if blamed and (param is None or blamed.startswith(f"{param}.")):
        param = blamed
    if kind == "extra_forbidden":
        param = cut(param or "")  # a field's name is the client's too: 100,000 characters came back
        instead = RENAMED_FIELDS.get(param)
        fix = f"; {instead}" if instead else ""
        return APIError(
            400,
            f"unsupported field {param!r}: minisgl does not implement it{fix}",
            param,
            "unsupported_field",
        )
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind in ("int_type", "float_type", "bool_type", "string_type") and "input" in err:
        got = json_kind(err["input"])
        if kind == "float_type" and got == "an integer":  # only one past a double's range fails
            got = "an integer this large"
        msg += f", not {got}"  # "an integer, not a boolean": what was wrong
    # a check's own code (BodyError's: "unsupported_field" for a value minisgl does not implement);
    # else OpenAI's for a value of the wrong type or outside a field's choices (was null)
    code = getattr(cause, "code", None)
    if code is None and _is_type_mismatch(err):
        code = "invalid_value" if kind in ("literal_error", "union_tag_invalid") else "invalid_type"
    return APIError(400, f"{param}: {msg}" if param else msg, param, code)


def _not_utf8(exc: UnicodeDecodeError) -> str:
    """The body's first byte that is not UTF-8. The JSON decoder reads a body starting with a
    UTF-16/32 byte-order mark, or with NUL bytes, in that encoding, so ``exc`` may be its error
    there (``\\xff\\xfe{`` was "byte 0x7b at offset 2"): the offset is found again in UTF-8."""
    body = exc.object
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as utf8:
        return (
            f"the request body is not valid UTF-8 (byte 0x{body[utf8.start]:02x} at offset "
            f"{utf8.start}): send the JSON encoded as UTF-8"
        )
    return (
        f"the request body is not valid JSON: its NUL bytes read as {exc.encoding}, which it is not "
        "either: send the JSON encoded as UTF-8"
    )


def _closest_member(errors: list[Any]) -> Any:
    """The type mismatch to report: among the first field's errors, the one from the union member
    the value came closest to (fewest errors, then the deepest path), so that ``prompt: [true, 5]``
    is "prompt.0: not an integer" from list[int] rather than "not a string" from str."""
    field = errors[0].get("loc", ())[:2]
    candidates = [e for e in errors if e.get("loc", ())[:2] == field]
    per_member = Counter(_member(e) for e in candidates)
    return min(candidates, key=lambda e: (per_member[_member(e)], -len(e.get("loc", ()))))


def _member(err: Any) -> tuple[str, ...]:
    loc = tuple(str(p) for p in err.get("loc", ()))
    for i, part in enumerate(loc):
        if _is_union_member_tag(part):
            return loc[: i + 1]
    return loc


def json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number with a fraction" if math.isfinite(value) else "NaN or infinity"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "null" if value is None else type(value).__name__


#: the tags of the bodies' unions of models (chat's content parts; Responses' input items, their
#: parts and its tool_choice)
_UNION_TAGS = frozenset({
    "str", "int", "float", "bool", "TextPart", "RefusalPart", "MessageItem", "FunctionCallItem",
    "FunctionCallOutputItem", "ReasoningItem", "InputText", "Refusal", "FunctionChoice",
    "TextBlock", "ToolUseBlock", "ToolResultBlock", "ThinkingBlock",
})  # fmt: skip


def _is_union_member_tag(part: str) -> bool:
    # e.g. "str", "list[int]", "function-after[_utf8(), str]", "TextPart"; exact names, so that
    # fields such as "stream" or "stream_options" are kept
    return part in _UNION_TAGS or part.startswith(
        ("list[", "dict[", "function-", "literal[", "NamedToolChoice")
    )


def _is_type_mismatch(err: Any) -> bool:
    kind = str(err.get("type", ""))
    return (
        kind.endswith("_type") or kind.endswith("_parsing") or kind in ("literal_error", "union_tag_invalid")
    )


def install_error_handlers(app: FastAPI, on_error: Callable[[int], None] = lambda status: None) -> None:
    """Answer every error in OpenAI's format; ``on_error(status)`` is told about each (for metrics)."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        on_error(exc.status)
        body = route_error_body(request.url.path, exc.status, exc.message, exc.param, exc.code)
        return JSONResponse(body, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = validation_error(exc)
        if any(e.get("type") == "json_invalid" for e in exc.errors()[:1]):
            # a body that is not UTF-8 yet decoded (a UTF-16 byte-order mark: the decoder's
            # guess) is not "malformed JSON" but the wrong encoding (the body is cached: no read)
            try:
                (await request.body()).decode("utf-8")
            except UnicodeDecodeError as bad:
                err = APIError(400, _not_utf8(bad))
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if err.param is None and kind != "application/json" and not kind.endswith("+json"):
            # the body was not read as JSON at all: "Input should be a valid dictionary" said
            # nothing. None is refused too (FastAPI's strict default): a web page may send a body
            # without a type to a local server with no CORS preflight, as it may a text/plain one
            err = APIError(
                400,
                "the request body must be JSON sent as Content-Type: application/json, "
                + (f"not {kind}" if kind else "and the request has no Content-Type"),
            )
        on_error(err.status)
        body = route_error_body(request.url.path, err.status, err.message, err.param, err.code)
        return JSONResponse(body, status_code=err.status)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A bug, not the client's fault; still answered in OpenAI's shape (Starlette logs the traceback).
        on_error(500)
        message = f"internal error: {type(exc).__name__}: {exc}"[:500]
        return JSONResponse(route_error_body(request.url.path, 500, message), status_code=500)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        on_error(exc.status_code)
        if isinstance(exc.__cause__, UnicodeDecodeError):
            # FastAPI's "There was an error parsing the body": the JSON decoder met bytes that
            # are not UTF-8 (a compressed body sent without its Content-Encoding reads so too)
            body = route_error_body(request.url.path, 400, _not_utf8(exc.__cause__))
            return JSONResponse(body, status_code=400)
        if isinstance(exc.__cause__, RecursionError):  # the same message for a body nested too deep
            message = "malformed JSON body: nested deeper than the JSON decoder goes (about 1,000 levels)"
            return JSONResponse(route_error_body(request.url.path, 400, message), status_code=400)
        # exc.headers: a 405's Allow, which RFC 9110 requires; every GET route answers HEAD too
        # (HeadAsGet), which the router does not know
        headers = dict(exc.headers or {})
        allow = [m.strip() for m in headers.get("Allow", "").split(",") if m.strip()]
        if "GET" in allow and "HEAD" not in allow:
            headers["Allow"] = ", ".join([*allow, "HEAD"])
        body = route_error_body(request.url.path, exc.status_code, str(exc.detail))
        return JSONResponse(body, status_code=exc.status_code, headers=headers or None)
