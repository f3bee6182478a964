"""Pythonic tool calls, as Llama 3.2 and Llama 4 write them: the whole answer is a Python list of
calls with keyword arguments,

    [get_weather(city="Paris", days=3), get_time()]

Llama 4 puts it between ``<|python_start|>`` and ``<|python_end|>`` (special tokens, gone when
special tokens are skipped; both optional). The values are Python literals (strings, numbers,
``True``/``False``/``None``, lists, tuples, dicts), read with :func:`ast.literal_eval`, never
evaluated, and sent as JSON arguments. Anything else is content, whole: text around the list, a
positional argument, a value that is not a literal or has no JSON form, a call to a function the
request did not offer, a list that the end of the output cuts off.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from minisgl_core.api import StreamingToolParser

START = "<|python_start|>"
END = "<|python_end|>"
_WHITESPACE = re.compile(r"\s*")
_IDENTIFIER = re.compile(r"[^\W\d]\w*")


class _NoJson(Exception):
    """A literal with no JSON form (a set, bytes, a complex number, infinity, a non-string key)."""


class PythonicToolParser(StreamingToolParser):
    """Streaming, an output that opens like a call list (``[name(``) is held until the end, when
    the whole list is read: its calls, or all of it as content (a call that was sent could not be
    taken back if the list turned out malformed). Any other output is streamed as it comes."""

    def __init__(self, tools: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__(tools)
        #: whether the output may still be a call list (it is held until then)
        self._maybe_calls = True

    def advance(self, final: bool) -> None:
        if self._maybe_calls:
            if not final and _opens_like_calls(self.buffer):
                return  # held
            self._maybe_calls = False
            calls = self._calls(self.buffer) if final and self.buffer else None
            if calls is not None:
                self.buffer = ""
                for name, arguments in calls:
                    self.emit_call(name, arguments)
                return
        text, self.buffer = self.buffer, ""
        self.emit_content(text)

    def _calls(self, text: str) -> list[tuple[str, str]] | None:
        """The calls (name, JSON arguments) of a whole output that is a call list, else None."""
        body = text.strip().removeprefix(START).removesuffix(END).strip()
        try:
            tree = ast.parse(body, mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        if not isinstance(tree, ast.List) or not tree.elts:
            return None
        calls = []
        for node in tree.elts:
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
                return None  # an attribute call (a.b()), a positional argument
            name = node.func.id
            if not self.offered(name):
                return None  # a function the request did not offer (OpenAI calls offered ones only)
            arguments: dict[str, Any] = {}
            for keyword in node.keywords:
                if keyword.arg is None or keyword.arg in arguments:
                    return None  # **kwargs, or a keyword given twice
                try:
                    arguments[keyword.arg] = _json_value(ast.literal_eval(keyword.value))
                except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError, _NoJson):
                    return None  # not a literal (a name, an expression), or no JSON form
            encoded = json.dumps(arguments, ensure_ascii=False)
            try:
                encoded.encode()
            except UnicodeEncodeError:  # a lone surrogate ("\ud800"): not text a response can carry
                return None
            calls.append((name, encoded))
        return calls


def _json_value(value: Any) -> Any:
    """A Python literal as JSON data: tuples become arrays; what JSON cannot say raises _NoJson."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):  # (1e999)
            raise _NoJson
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(item) for item in value]
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise _NoJson
        return {key: _json_value(item) for key, item in value.items()}
    raise _NoJson


def _opens_like_calls(text: str) -> bool:
    """Whether ``text`` is, or may still grow into, the opening of a call list: optional
    whitespace and ``<|python_start|>``, then ``[``, a name and ``(``."""
    at = _WHITESPACE.match(text).end()  # type: ignore[union-attr]
    if text.startswith(START, at):
        at = _WHITESPACE.match(text, at + len(START)).end()  # type: ignore[union-attr]
    elif START.startswith(text[at:]):
        return True  # (nothing yet, or the marker so far)
    if at == len(text):
        return True
    if text[at] != "[":
        return False
    at = _WHITESPACE.match(text, at + 1).end()  # type: ignore[union-attr]
    name = _IDENTIFIER.match(text, at)
    if name is None:
        return at == len(text)
    at = _WHITESPACE.match(text, name.end()).end()  # type: ignore[union-attr]
    return at == len(text) or text[at] == "("
