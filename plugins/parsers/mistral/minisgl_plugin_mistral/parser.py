"""Mistral tool calls, in the two forms of mistral-common's tokenizers. Version 3
(Mistral-7B-Instruct-v0.3, Mixtral-8x22B-Instruct, Mistral-Nemo) writes one JSON array of calls
after the special token ``[TOOL_CALLS]``::

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": ...}]

version 11 and later (Mistral-Small-3.x, Magistral, Devstral) one marker per call, the name as
text, an optional call id, then the arguments object::

    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{}

Either may follow some content (``Let me check.[TOOL_CALLS]...``). The markers are special tokens,
so the parser asks the server for them (``reads_special_tokens``); a v3 array that opens the answer
is read without its marker too (text detokenized with special tokens skipped).

Whitespace next to calls is not content. Streaming, a call is held until its JSON is complete, then
sent in one delta: a call that was sent cannot be taken back, and one that turns out malformed (or
names a function the request did not offer) is content, markers and all, as in the whole answer. An
answer cut off inside a call whose name is complete is that call with its arguments so far.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from minisgl_core.api import ScanMemo, StreamingToolParser, marker_prefix_length, scan_tool_call

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_NAME = re.compile(r"[\w.\-]*")
_ID = re.compile(r"[\w\-]*")


def _not_json(constant: str) -> object:
    raise ValueError(f"{constant} is not JSON")


#: NaN and Infinity are Python's json extension, not JSON: arguments with them are malformed
_DECODER = json.JSONDecoder(parse_constant=_not_json)


class MistralToolParser(StreamingToolParser):
    reads_special_tokens = True

    def __init__(self, tools: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__(tools)
        self._mode = "start"
        #: text consumed before the current call, given back as content if it is malformed
        self._giveback = ""
        #: where the last scan of the current call stopped (each feed scans it again, longer)
        self._memo = ScanMemo()

    def advance(self, final: bool) -> None:
        steps = {
            "start": self._start,
            "text": self._text_mode,
            "marker": self._marker,
            "array": self._array_call,
            "array_after": self._array_after,
            "named": self._named_call,
            "after": self._after,
        }
        while steps[self._mode](final):
            pass

    def _to(self, mode: str, buffer: str) -> bool:
        self._mode, self.buffer = mode, buffer
        return True

    def _not_a_call(self) -> bool:
        """The current call is malformed: its text, markers and all, is content."""
        self.emit_content(self._giveback)
        self._giveback = ""
        self._mode = "text"
        return True

    def _start(self, final: bool) -> bool:
        """The answer's opening: a marker, a v3 array without its marker, or content."""
        rest = self.buffer.lstrip()
        if rest.startswith(TOOL_CALLS):
            self._giveback = self.buffer[: len(self.buffer) - len(rest)] + TOOL_CALLS
            return self._to("marker", rest[len(TOOL_CALLS) :])
        if not final and TOOL_CALLS.startswith(rest):
            return False  # (nothing yet, "[", or the marker so far)
        if rest.startswith("["):
            after = rest[1:].lstrip()
            if after.startswith("{"):
                self._giveback = self.buffer[: len(self.buffer) - len(after)]
                return self._to("array", after)
            if not after and not final:
                return False
        self._mode = "text"
        return True

    def _text_mode(self, final: bool) -> bool:
        where = self.buffer.find(TOOL_CALLS)
        if where >= 0:
            self.emit_content(self.buffer[:where])
            # whitespace before a call is not content, unless the call turns out malformed
            self._giveback = self.take_held_whitespace() + TOOL_CALLS
            return self._to("marker", self.buffer[where + len(TOOL_CALLS) :])
        keep = 0 if final else marker_prefix_length(self.buffer, TOOL_CALLS)
        self.emit_content(self.buffer[: len(self.buffer) - keep])
        self.buffer = self.buffer[len(self.buffer) - keep :]
        return False

    def _marker(self, final: bool) -> bool:
        """After ``[TOOL_CALLS]``: a v3 array, or a v11 call's name."""
        rest = self.buffer.lstrip()
        if not rest:
            return self._not_a_call() if final else False
        if not rest.startswith("["):
            self._mode = "named"
            return True
        after = rest[1:].lstrip()
        if after.startswith("{"):
            self._giveback += self.buffer[: len(self.buffer) - len(after)]
            return self._to("array", after)
        if not after and not final:
            return False
        return self._not_a_call()

    def _array_call(self, final: bool) -> bool:
        """A v3 call object, inside the array."""
        if final and self._giveback == "," and not self.buffer.strip():
            return self._to("text", "")  # the output ends after a separator: nothing more
        scan = scan_tool_call(self.buffer, memo=self._memo)
        if scan.name is not None and (scan.status == "complete" or final) and not self.offered(scan.name):
            return self._not_a_call()
        if scan.status == "complete":
            self.emit_call(scan.name, scan.arguments)  # type: ignore[arg-type]
            return self._to("array_after", self.buffer[scan.end :])
        if scan.status == "partial" and not final:
            return False
        if scan.status == "partial" and scan.name is not None:  # cut off: its arguments so far
            self.emit_call(scan.name, scan.arguments)
            return self._to("text", "")
        return self._not_a_call()

    def _array_after(self, final: bool) -> bool:
        rest = self.buffer.lstrip()
        if not rest:
            return self._to("text", "") if final else False
        if rest.startswith(","):
            self._giveback = ","  # (content again if no call follows)
            return self._to("array", rest[1:])
        if rest.startswith("]"):
            return self._to("after", rest[1:])
        return self._to("text", rest)

    def _named_call(self, final: bool) -> bool:
        """A v11 call: ``name[CALL_ID]id[ARGS]{...}`` (the call id optional, and not kept: the
        server's ids are OpenAI's shape)."""
        rest = self.buffer.lstrip()
        where = rest.find(ARGS)
        if where < 0:
            if not _head_may_grow(rest):
                return self._not_a_call()
            if not final:
                return False
            name, marked, _ = rest.partition(CALL_ID)
            if marked and _NAME.fullmatch(name) and name and self.offered(name):
                self.emit_call(name, "")  # cut off after its name: no arguments yet
                return self._to("text", "")
            return self._not_a_call()
        name, _, call_id = rest[:where].partition(CALL_ID)
        if not name or not _NAME.fullmatch(name) or not _ID.fullmatch(call_id) or not self.offered(name):
            return self._not_a_call()
        body = rest[where + len(ARGS) :].lstrip()
        if not body:
            if not final:
                return False
            self.emit_call(name, "")
            return self._to("text", "")
        if not body.startswith("{"):
            return self._not_a_call()
        # read as a call's arguments (resumed where the last piece's scan stopped): while the text
        # ends inside them, nothing more to do (decoding them again at every piece was quadratic)
        probe = scan_tool_call('{"name": "f", "arguments": ' + body, memo=self._memo)
        inside = probe.status == "partial" and probe.arguments == body and not body.endswith("}")
        if inside and not final:
            return False
        try:
            _, end = _DECODER.raw_decode(body)
        except (ValueError, RecursionError):  # unfinished, or not JSON at all
            if probe.status == "invalid":
                return self._not_a_call()
            if not final:
                return False
            self.emit_call(name, probe.arguments)  # cut off: its arguments so far
            return self._to("text", "")
        self.emit_call(name, body[:end])
        return self._to("after", body[end:])

    def _after(self, final: bool) -> bool:
        """After a v11 call or a v3 array: the next marker, or the rest as content."""
        rest = self.buffer.lstrip()
        if rest.startswith(TOOL_CALLS):
            self._giveback = TOOL_CALLS
            return self._to("marker", rest[len(TOOL_CALLS) :])
        if not final and TOOL_CALLS.startswith(rest):
            return False
        return self._to("text", rest)


def _head_may_grow(head: str) -> bool:
    """Whether ``head``, the text after a v11 marker with no ``[ARGS]`` yet, is or may still grow
    into ``name``, ``name[CALL_ID]id`` and the start of ``[ARGS]``."""
    tail = head[_NAME.match(head).end() :]  # type: ignore[union-attr]
    if tail.startswith(CALL_ID):
        tail = tail[len(CALL_ID) :]
        tail = tail[_ID.match(tail).end() :]  # type: ignore[union-attr]
        return ARGS.startswith(tail)
    return ARGS.startswith(tail) or CALL_ID.startswith(tail)
