"""Reading a tool call's JSON object while it is still being generated.

:func:`scan_tool_call` looks at text that starts with a call object such as
``{"name": "get_weather", "arguments": {"city": "Paris"}}`` and says how far it got: the name
once its string is complete, the raw text of the arguments value so far (a prefix of its final
text), and whether the object is complete, still partial
or can no longer become a call. It re-reads from the start on every call: tool calls are short.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

ScanStatus = Literal["complete", "partial", "invalid"]
_WHITESPACE = " \t\n\r"
_SCALAR_CHARS = set("-+0123456789.eEtruefalsn")
_CLOSING = {"{": "}", "[": "]"}


@dataclass(frozen=True)
class ScannedCall:
    status: ScanStatus
    #: the function name, once its JSON string is complete
    name: str | None = None
    #: the arguments value's raw text so far ("" before it starts); the whole value when complete
    arguments: str = ""
    #: the index just past the object's closing brace (complete only)
    end: int = 0


class _Partial(Exception):
    """The text ended before the value did."""


class _Invalid(Exception):
    """The text cannot be the start of a tool-call object."""


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WHITESPACE:
        i += 1
    if i == len(text):
        raise _Partial
    return i


def _string_end(text: str, i: int) -> int:
    """Index past the JSON string starting at ``text[i] == '"'``."""
    j = i + 1
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        if c < " ":  # control characters must be escaped inside JSON strings
            raise _Invalid
        j += 1
    raise _Partial


def _value_end(text: str, i: int) -> int:
    """Index past the JSON value starting at ``text[i]``; only its bracket structure is checked
    here, the finished value is checked with ``json.loads`` by the caller."""
    c = text[i]
    if c == '"':
        return _string_end(text, i)
    if c in _CLOSING:
        stack = [_CLOSING[c]]
        j = i + 1
        while j < len(text):
            c = text[j]
            if c == '"':
                j = _string_end(text, j)
                continue
            if c in _CLOSING:
                stack.append(_CLOSING[c])
            elif c in "}]":
                if c != stack.pop():
                    raise _Invalid
                if not stack:
                    return j + 1
            j += 1
        raise _Partial
    if c not in _SCALAR_CHARS:
        raise _Invalid
    j = i
    while j < len(text) and text[j] in _SCALAR_CHARS:
        j += 1
    if j == len(text):  # a number may go on
        raise _Partial
    return j


def _load(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        raise _Invalid from None


def scan_tool_call(
    text: str, start: int = 0, arguments_keys: tuple[str, ...] = ("arguments",)
) -> ScannedCall:
    """Read the call object at ``text[start:]`` (leading whitespace allowed): ``{"name": <string>,
    <one of arguments_keys>: <object>}``, keys in any order, other keys ignored. A complete call
    with no arguments key has arguments ``"{}"``."""
    name: str | None = None
    arguments = ""
    try:
        i = _skip_ws(text, start)
        if text[i] != "{":
            raise _Invalid
        i = _skip_ws(text, i + 1)
        while True:
            if text[i] != '"':
                raise _Invalid
            key_end = _string_end(text, i)
            key = _load(text[i:key_end])
            i = _skip_ws(text, key_end)
            if text[i] != ":":
                raise _Invalid
            value_start = _skip_ws(text, i + 1)
            if key == "name":
                if text[value_start] != '"':
                    raise _Invalid
                i = _string_end(text, value_start)
                name = _load(text[value_start:i])  # type: ignore[assignment]
            elif key in arguments_keys:
                if text[value_start] != "{":
                    raise _Invalid
                try:
                    i = _value_end(text, value_start)
                except _Partial:
                    arguments = text[value_start:]
                    raise
                arguments = text[value_start:i]
                if not isinstance(_load(arguments), dict):
                    raise _Invalid
            else:
                i = _value_end(text, value_start)
            i = _skip_ws(text, i)
            if text[i] == "}":
                break
            if text[i] != ",":
                raise _Invalid
            i = _skip_ws(text, i + 1)
    except _Partial:
        return ScannedCall("partial", name, arguments)
    except _Invalid:
        return ScannedCall("invalid", name, arguments)
    if not name:
        return ScannedCall("invalid", name, arguments)
    return ScannedCall("complete", name, arguments or "{}", i + 1)


def marker_prefix_length(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that is a proper beginning of ``marker``: what a
    stream must hold back because the next piece may complete the marker."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
