"""Mistral tool calls, in the two forms Mistral's tokenizers (mistral-common) give them. Tokenizer
v3 (Mistral-7B-Instruct-v0.3, Mixtral-8x22B-Instruct, Mistral-Nemo) writes one JSON array:

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": ...}]

and tokenizer v11 and later (Mistral-Small-3.1 / 3.2, Magistral, Devstral) one marker per call, the
name outside the JSON (a ``[CALL_ID]id`` may sit between the name and ``[ARGS]``):

    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}

Text before ``[TOOL_CALLS]`` is content. ``[TOOL_CALLS]`` and ``[ARGS]`` are special tokens, gone from
the text when special tokens are skipped (a request's default): an answer that opens with the v3
array still reads as calls without its marker; the v11 form and a call after some text need the
request's ``skip_special_tokens: false``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from minisgl_core.api import JsonToolCallParser, ScannedCall, scan_tool_call

ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
#: a v11 call's function name (OpenAI's names are letters, digits, "_" and "-"; "." for good measure)
_NAME = re.compile(r"\s*([\w.\-]*)")
_DECODER = json.JSONDecoder()


class MistralToolParser(JsonToolCallParser):
    call_open = "[TOOL_CALLS]"
    # the output's start: the v3 array, after its marker or with the marker skipped
    lead_markers = ("[TOOL_CALLS]",)
    list_open = "["
    list_close = "]"
    separator = ","

    def __init__(self, tools: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__(tools)
        # calls may open the output (the array without its marker), or follow content after a marker
        self._mode = "lead"
        #: just past a [TOOL_CALLS] met in the text: the v3 array or a v11 call follows
        self._after_marker = False
        #: inside a v11 call (name[ARGS]{...})
        self._named = False

    def _plain(self, final: bool) -> bool:
        progressed = super()._plain(final)
        if self._mode == "call":  # (it found the marker)
            self._after_marker = True
        return progressed

    def _give_up(self) -> bool:
        self._after_marker = self._named = False
        return super()._give_up()

    def _call(self, final: bool) -> bool:
        if self._after_marker:
            rest = self._buffer.lstrip()
            if not rest and not final:
                return False
            self._after_marker = False
            if rest.startswith(self.list_open):  # v3: the array; its calls as from the output's start
                self._giveback += self._buffer[: len(self._buffer) - len(rest) + 1]
                self._buffer = rest[1:]
                return True
            # v11: a name; (a lone object, the v3 form without its brackets, is read as a call too)
            self._named = bool(rest) and rest[0] != "{"
        if self._named:
            return self._named_call(final)
        return super()._call(final)

    def _named_call(self, final: bool) -> bool:
        """``name[ARGS]{...}`` (or ``name[CALL_ID]id[ARGS]{...}``) after a [TOOL_CALLS]: held until
        its arguments are a whole JSON object; the name is complete once a marker follows it."""
        text = self._buffer
        match = _NAME.match(text)
        name, at = match.group(1), match.end()
        has_id = text.startswith(CALL_ID, at)
        if has_id:  # the id runs to the next marker
            at = text.find("[", at + len(CALL_ID))
            at = len(text) if at < 0 else at
        tail = text[at:]
        if not name:
            return self._not_a_call()
        if not tail.startswith(ARGS):
            still_coming = (
                at == len(text) or ARGS.startswith(tail) or (not has_id and CALL_ID.startswith(tail))
            )
            if not still_coming:
                return self._not_a_call()
            if not final:
                return False
            if not has_id:  # cut off before a marker ended its name: content
                return self._not_a_call()
        if not self._offered(name):
            return self._not_a_call()
        body = text[at + len(ARGS) :].lstrip() if tail.startswith(ARGS) else ""
        try:
            value, end = _DECODER.raw_decode(body)
        except ValueError:
            value, end = None, 0
        if end:
            if not isinstance(value, dict):
                return self._not_a_call()
            self._send(ScannedCall("complete", name, body[:end]))
            self._buffer, self._named, self._mode = body[end:], False, "text"
            return True
        # not a whole object yet: one that may still become one, or malformed (the scanner says)
        growing = scan_tool_call('{"name": "", "arguments": ' + body).status == "partial"
        if growing and not final:
            return False
        if growing:  # the output ends inside the call (max_tokens, a stop string): its arguments so far
            self._send(ScannedCall("partial", name, body))
            self._buffer = ""
            return self._give_up()
        return self._not_a_call()
