"""Tool parsers: turning a model's tool-call text into OpenAI ``tool_calls``.

A :class:`ToolParser` is made per choice of a chat request that offers tools. Given the model's
whole output, :meth:`ToolParser.parse` splits it into content and calls; streaming, it is fed the
text as it arrives (:meth:`ToolParser.feed`, then :meth:`ToolParser.finish`) and answers content
deltas and tool-call deltas (a call's ``arguments`` may come in several pieces). Text that only
looks like a call (malformed JSON, a missing name, a function the request did not offer) is left
as content, streamed or not.

:class:`StreamingToolParser` is the scaffold for writing one: a format implements one method,
:meth:`StreamingToolParser.advance`, and gets ``parse``, ``feed`` and ``finish`` from it, so a
stream and the whole answer cannot disagree (the ``mistral`` and ``pythonic`` plugins).
:class:`JsonToolCallParser` is one for the common family of formats whose calls are JSON objects
``{"name": ..., "arguments": {...}}`` with optional markers around them; a plugin for such a
format only sets its class attributes (see the ``hermes`` and ``llama3_json`` plugins).
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from minisgl_core.api.json_scan import ScanMemo, ScannedCall, marker_prefix_length, scan_tool_call


def new_tool_call_id() -> str:
    """An id in OpenAI's shape (``call_`` + 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    #: the arguments as JSON text (OpenAI sends a string, not an object)
    arguments: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of the call at ``index``: its first delta carries ``id`` and ``name``."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class ToolParseResult:
    content: str | None
    tool_calls: list[ToolCall]


@dataclass(frozen=True)
class ToolStreamDelta:
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


class ToolParser(ABC):
    """One choice's tool-call parser. Use an instance either for :meth:`parse` or for a stream.

    A parser whose format's markers are special tokens of the model's tokenizer (Mistral's
    ``[TOOL_CALLS]`` and ``[ARGS]``) sets :attr:`reads_special_tokens`: a request's default
    ``skip_special_tokens`` would take them out of the text it is given.
    """

    #: the parser needs special tokens in its text. The server then detokenizes the choices it
    #: parses (a chat request offering tools with ``tool_choice`` ``auto``) with special tokens kept,
    #: whatever ``skip_special_tokens`` says; when the request skips them (its default), the special
    #: tokens the parsers leave in ``content`` (and ``reasoning_content``) are taken out afterwards,
    #: so the answer reads as a skipped one would. ``versionadded``: API 2.4.
    reads_special_tokens: ClassVar[bool] = False

    def __init__(self, tools: Sequence[Mapping[str, Any]] = ()) -> None:
        #: the request's ``tools`` as sent (``{"type": "function", "function": {...}}``)
        self.tools = list(tools)

    @abstractmethod
    def parse(self, text: str) -> ToolParseResult:
        """Split the complete output into content (None when empty) and tool calls."""

    @abstractmethod
    def feed(self, text: str) -> ToolStreamDelta:
        """Take the next piece of output; return what can be sent now (text that may still turn
        out to be part of a call is held back)."""

    @abstractmethod
    def finish(self) -> ToolStreamDelta:
        """The output ended: return whatever was held back."""


def merge_tool_deltas(deltas: Sequence[ToolCallDelta]) -> list[ToolCall]:
    """The calls that a stream of deltas describes."""
    calls: dict[int, list[str]] = {}
    for d in deltas:
        entry = calls.setdefault(d.index, [d.id or "", d.name or "", ""])
        entry[2] += d.arguments
    return [ToolCall(i, n, a) for i, n, a in (calls[k] for k in sorted(calls))]


class StreamingToolParser(ToolParser):
    """A tool parser written once, as a machine that reads its text as it streams in.

    A subclass implements :meth:`advance`: it consumes what it can of :attr:`buffer` (the text fed
    and not consumed yet) and reports what it found with :meth:`emit_content` and
    :meth:`emit_call`, leaving in the buffer whatever it must wait for. :meth:`feed` adds the text
    and calls ``advance(final=False)``; :meth:`finish` calls ``advance(final=True)``, where nothing
    more will come and the buffer should be used up (what it leaves there is content, never lost);
    :meth:`parse` is one feed and the finish, so the
    whole answer is what a stream gives, whatever its pieces.

    Whitespace next to calls is not content: :meth:`emit_content` holds a text's trailing
    whitespace until more content follows; :meth:`finish` drops it when the output made calls, and
    a format takes it with :meth:`take_held_whitespace` where a call begins (to give it back as
    content if the call turns out malformed). ``versionadded``: API 2.5.
    """

    def __init__(self, tools: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__(tools)
        #: the text fed and not consumed yet; :meth:`advance` takes what it reads off the front
        self.buffer = ""
        #: the names of the functions the request offered
        self.offered_names = frozenset(
            (t.get("function") or {}).get("name") for t in self.tools if isinstance(t, Mapping)
        )
        self._calls_sent = 0
        self._held_whitespace = ""
        self._out_content: list[str] = []
        self._out_calls: list[ToolCallDelta] = []

    @abstractmethod
    def advance(self, final: bool) -> None:
        """Read what can be read of :attr:`buffer`, reporting it with :meth:`emit_content` and
        :meth:`emit_call`. ``final``: the output ended; leave nothing in the buffer."""

    # ------------------------------------------------------------------ for advance

    @property
    def calls_sent(self) -> int:
        """How many calls were emitted so far (the next call's index)."""
        return self._calls_sent

    def offered(self, name: str) -> bool:
        """Whether the request offered a function of this name (any, when it gave no tools): a call
        to another is content (OpenAI calls offered functions only; a client would look it up in
        vain)."""
        return not self.tools or name in self.offered_names

    def emit_content(self, text: str) -> None:
        """Content, except that trailing whitespace is held until we know no call follows it."""
        text = self._held_whitespace + text
        kept = text.rstrip()
        self._out_content.append(kept)
        self._held_whitespace = text[len(kept) :]

    def take_held_whitespace(self) -> str:
        """The whitespace held back after the last content, no longer to be sent as content."""
        held, self._held_whitespace = self._held_whitespace, ""
        return held

    def emit_call(self, name: str, arguments: str) -> None:
        """Send a call whole in one delta: a new id, its name and its arguments (JSON text)."""
        self._out_calls.append(ToolCallDelta(self._calls_sent, new_tool_call_id(), name, arguments))
        self._calls_sent += 1

    # ------------------------------------------------------------------ the public face

    def parse(self, text: str) -> ToolParseResult:
        first, last = self.feed(text), self.finish()
        content = first.content + last.content
        return ToolParseResult(content or None, merge_tool_deltas(first.tool_calls + last.tool_calls))

    def feed(self, text: str) -> ToolStreamDelta:
        self.buffer += text
        self.advance(final=False)
        return self._take()

    def finish(self) -> ToolStreamDelta:
        self.advance(final=True)
        if self.buffer:  # what advance left at the end is content: no text of the output is lost
            self.emit_content(self.buffer)
            self.buffer = ""
        held = self.take_held_whitespace()
        if not self._calls_sent:  # whitespace next to calls is not content
            self._out_content.append(held)
        return self._take()

    def _take(self) -> ToolStreamDelta:
        out = ToolStreamDelta("".join(self._out_content), self._out_calls)
        self._out_content, self._out_calls = [], []
        return out


class JsonToolCallParser(StreamingToolParser):
    """Calls are JSON objects ``{"name": str, <arguments key>: object}``, each optionally between
    ``call_open`` and ``call_close``; with ``leading_only`` they count only at the start of the
    output (after ``lead_markers``, inside ``list_open``/``list_close``, joined by ``separator``).

    Whitespace next to a call is not content. Streaming, a call is held back until its object is
    complete and valid, then sent in one delta (id, name and arguments): a call that was sent
    cannot be taken back, and one that turns out malformed is content, as in the whole answer. A
    call that the end of the output cuts off (max_tokens, a stop string) is a call with its
    arguments so far once its name is complete, content before that; one whose text reaches
    ``call_close`` unfinished is malformed, not cut off, and so is one with other text between its
    object and ``call_close`` (the whole block is content). Whole and streamed alike.
    """

    call_open: str = ""
    call_close: str = ""
    separator: str = ""
    leading_only: bool = False
    lead_markers: tuple[str, ...] = ()
    list_open: str = ""
    list_close: str = ""
    arguments_keys: tuple[str, ...] = ("arguments",)

    def __init__(self, tools: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__(tools)
        self._mode = "lead" if self.leading_only else "text"
        #: text consumed before the current call's object, given back as content if it is malformed
        self._giveback = ""
        #: where the last scan of the current call stopped (each feed scans it again, longer)
        self._memo = ScanMemo()

    def advance(self, final: bool) -> None:
        step = {
            "lead": self._lead,
            "text": self._plain,
            "call": self._call,
            "after": self._after,
        }
        while step[self._mode](final):
            pass

    def _lead(self, final: bool) -> bool:
        """Start of a ``leading_only`` output: calls, or plain content for good."""
        rest = self.buffer.lstrip()
        for marker in self.lead_markers:
            if rest.startswith(marker):
                rest = rest[len(marker) :].lstrip()
            elif marker.startswith(rest) and not final:
                return False
        if self.list_open:
            if rest.startswith(self.list_open):
                rest = rest[len(self.list_open) :].lstrip()
            elif not (self.list_open.startswith(rest) and not final):
                return self._give_up()
        if not rest:
            return self._give_up() if final else False
        if rest[0] != "{":
            return self._give_up()
        self._giveback = self.buffer[: len(self.buffer) - len(rest)]
        self.buffer, self._mode = rest, "call"
        return True

    def _give_up(self) -> bool:
        """No (more) calls: the rest of the output is content."""
        self._mode = "text"
        return True

    def _plain(self, final: bool) -> bool:
        if self.leading_only or not self.call_open:
            self.emit_content(self.buffer)
            self.buffer = ""
            return False
        where = self.buffer.find(self.call_open)
        if where >= 0:
            self.emit_content(self.buffer[:where])
            # whitespace before a call is not content, unless the call turns out malformed
            self._giveback = self.take_held_whitespace() + self.call_open
            self.buffer, self._mode = self.buffer[where + len(self.call_open) :], "call"
            return True
        keep = 0 if final else marker_prefix_length(self.buffer, self.call_open)
        self.emit_content(self.buffer[: len(self.buffer) - keep])
        self.buffer = self.buffer[len(self.buffer) - keep :]
        return False

    def _call(self, final: bool) -> bool:
        if final and self.separator and self._giveback == self.separator and not self.buffer.strip():
            # a separator that ends the output ('...};') is the calls' punctuation, as vLLM reads it
            self.buffer = ""
            return self._give_up()
        scan = scan_tool_call(self.buffer, 0, self.arguments_keys, self._memo)
        # (judged on the whole object or the output's end: a later "name" key wins, as in parse)
        if scan.name is not None and (scan.status == "complete" or final) and not self.offered(scan.name):
            # a call to a function the request did not offer is not a tool call: content, as a
            # malformed one
            return self._not_a_call()
        if scan.status == "complete":
            if self.call_close:
                rest = self.buffer[scan.end :].lstrip()
                if not rest.startswith(self.call_close):
                    if not self.call_close.startswith(rest):
                        # ('{...}} junk</tool_call>' was a call, then '} junk</tool_call>' as content)
                        return self._not_a_call()
                    if not final:
                        return False  # held until its close marker: text before it makes it malformed
            self._send(scan)
            self.buffer, self._mode = self.buffer[scan.end :], "after"
            return True
        if scan.status == "partial" and not final:
            # held back: what was sent cannot be taken back if the call turns out malformed
            return False
        reached_close = bool(self.call_close) and _reaches_close(self.buffer, self.call_close)
        if scan.status == "partial" and scan.name is not None and not reached_close:
            # the output ends inside a call whose name is complete (max_tokens, a stop string): a
            # call with its arguments so far
            self._send(scan)
            self.buffer = ""
            return self._give_up()
        return self._not_a_call()

    def _not_a_call(self) -> bool:
        """The current call is malformed: its text, markers and all, is content."""
        self.emit_content(self._giveback)
        return self._give_up()

    def _after(self, final: bool) -> bool:
        """After a call: its close marker, then the next call or the rest as content."""
        rest = self.buffer.lstrip()
        for marker in (self.call_close, self.separator, self.list_close):
            if marker and marker.startswith(rest) and len(rest) < len(marker):
                if final:  # cut off inside a marker: there is nothing more to say
                    self.buffer = ""
                    return self._give_up()
                return False
        if self.call_close:
            if not rest.startswith(self.call_close):
                self.buffer = rest
                return self._give_up()
            self.buffer, self._mode = rest[len(self.call_close) :], "text"
            return True
        if self.separator and rest.startswith(self.separator):
            self._giveback = self.separator  # (content again if no call follows: "; hello")
            self.buffer, self._mode = rest[len(self.separator) :], "call"
            return True
        if self.list_close and rest.startswith(self.list_close):
            rest = rest[len(self.list_close) :]
        self.buffer = rest
        return self._give_up()

    def _send(self, scan: ScannedCall) -> None:
        """Send the current call, complete or cut off by the end of the output, in one delta."""
        arguments = scan.arguments
        if scan.status == "partial" and self.call_close:
            # cut off inside what may be the close marker: that is not arguments
            arguments = arguments[: len(arguments) - marker_prefix_length(arguments, self.call_close)]
        self.emit_call(scan.name, arguments)  # type: ignore[arg-type]


def _reaches_close(text: str, marker: str) -> bool:
    """Whether a call's ``text`` reaches its close ``marker``: one outside its JSON strings, or in a
    string the text ends inside (the model closed the call without closing the string). A close marker
    written in a finished string is an argument's value, not the call's end."""
    in_string = escaped = False
    opened = 0
    for i, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string, opened = True, i
        elif text.startswith(marker, i):
            return True
    return in_string and marker in text[opened:]
