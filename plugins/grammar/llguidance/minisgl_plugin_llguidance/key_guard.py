"""Object keys written as JSON writes them: bitmask rows that forbid, inside a key, an escape of a
character JSON need not escape (:class:`KeyGuard`), ANDed into what llguidance fills.

llguidance writes a key that ``additionalProperties`` (or ``patternProperties``) allows as any
JSON string but the names it knows, compared as written: ``{"\\u0061ge": "old"}`` passed
``{"properties": {"age": {"type": "integer"}}}`` and parses to ``{"age": "old"}``. In a key the
guard allows only the escapes JSON requires, each in the one spelling ``json.dumps`` (and
llguidance, which writes the names so) gives it: ``\\"``, ``\\\\``, ``\\b``, ``\\f``, ``\\n``,
``\\r``, ``\\t`` and ``\\u00XX`` (lower-case) for the other control characters. A key is then
written one way only, the way llguidance writes the names it compares it with; every key string
stays possible.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

from minisgl_core.api import bitmask_width

_OUT, _STRING, _ESCAPE, _HEX = range(4)
#: the escapes a key may hold after its backslash (``u`` opens a ``\\u00XX``)
_KEY_ESCAPES = frozenset(b'"\\bfnrtu')
#: the control characters with a short escape, which ``\\u00XX`` may not spell in a key
_SHORT = frozenset(b"89acd")
_LOWER_HEX = frozenset(b"0123456789abcdef")
_HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")
#: containers of the stack that a key of the cache remembers (a token pops fewer)
_STACK_KEPT = 32
#: states whose rows are kept
_CACHE_ROWS = 256


class KeyState:
    """Where one matcher's output stands for the guard: inside a string or not, inside a key, in
    an escape, and the containers open (``{`` or ``[``)."""

    __slots__ = ("expect_key", "hex", "in_key", "mode", "stack")

    def __init__(self) -> None:
        self.mode = _OUT
        self.in_key = False
        self.expect_key = False
        self.hex = b""
        self.stack: list[int] = []

    def copy(self) -> KeyState:
        other = KeyState()
        other.mode, other.in_key, other.expect_key, other.hex = (
            self.mode,
            self.in_key,
            self.expect_key,
            self.hex,
        )
        other.stack = self.stack[-_STACK_KEPT:]
        return other

    def key(self) -> tuple:
        return (self.mode, self.in_key, self.expect_key, self.hex, tuple(self.stack[-_STACK_KEPT:]))

    def feed(self, data: bytes) -> bool:
        """Advance over ``data``; False (state undefined) at an escape a key may not hold."""
        for byte in data:
            mode = self.mode
            if mode == _STRING:
                if byte == 0x22:
                    self.mode, self.in_key = _OUT, False
                elif byte == 0x5C:
                    self.mode = _ESCAPE
            elif mode == _OUT:
                if byte == 0x22:
                    self.mode, self.in_key = _STRING, self.expect_key
                    self.expect_key = False
                elif byte in b"{[":
                    self.stack.append(byte)
                    self.expect_key = byte == 0x7B
                elif byte in b"}]":
                    if self.stack:
                        self.stack.pop()
                    self.expect_key = False
                elif byte == 0x2C:
                    self.expect_key = bool(self.stack) and self.stack[-1] == 0x7B
                elif byte == 0x3A:
                    self.expect_key = False
            elif mode == _ESCAPE:
                if self.in_key and byte not in _KEY_ESCAPES:
                    return False
                self.mode, self.hex = (_HEX, b"") if byte == 0x75 else (_STRING, b"")
            else:  # _HEX
                if self.in_key and not _canonical_hex(self.hex, byte):
                    return False
                self.hex += bytes([byte])
                if len(self.hex) == 4:
                    self.mode = _STRING
        return True


def _canonical_hex(before: bytes, byte: int) -> bool:
    """Whether ``byte`` may follow ``\\u`` and ``before`` in a key: ``00``, then ``0`` or ``1``,
    then a lower-case hex digit, not one of a character with a short escape (``\\u000a``)."""
    place = len(before)
    if place < 2:
        return byte == 0x30
    if place == 2:
        return byte in b"01"
    return byte in _LOWER_HEX and not (before[2] == 0x30 and byte in _SHORT)


class KeyGuard:
    """The rows a backend ANDs into the bitmasks of its JSON-schema matchers: for a
    :class:`KeyState`, every token allowed but those that would write an escape into a key that
    JSON does not require there. Built from the tokens' bytes; rows cached per state."""

    def __init__(self, token_bytes: Sequence[bytes], vocab_size: int) -> None:
        self.token_bytes = token_bytes
        self.vocab_size = vocab_size
        self.width = bitmask_width(vocab_size)
        #: tokens holding a backslash: the only ones that can begin an escape
        self.backslash = [i for i, raw in enumerate(token_bytes) if 0x5C in raw]
        self._rows: OrderedDict[tuple, torch.Tensor | None] = OrderedDict()
        #: (mode, hex) inside a key -> the tokens without a backslash that end its escape wrong
        self._continuations: dict[tuple[int, bytes], list[int]] = {}

    def allows(self, state: KeyState, token_id: int) -> bool:
        raw = self.token_bytes[token_id] if 0 <= token_id < len(self.token_bytes) else b""
        return state.copy().feed(raw)

    def row(self, state: KeyState) -> torch.Tensor | None:
        """The int32 words to AND into a bitmask row at ``state``; None where nothing is forbidden."""
        key = state.key()
        if key in self._rows:
            self._rows.move_to_end(key)
            return self._rows[key]
        forbidden = [i for i in self.backslash if not state.copy().feed(self.token_bytes[i])]
        if state.in_key and state.mode in (_ESCAPE, _HEX):
            forbidden += self._continuation(state.mode, state.hex)
        row = None
        if forbidden:
            ok = torch.ones(self.width * 32, dtype=torch.bool)
            ok[forbidden] = False
            packed = (ok.view(-1, 32).to(torch.int64) << torch.arange(32)).sum(dim=1)
            row = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)  # bit 31: the sign
        self._rows[key] = row
        while len(self._rows) > _CACHE_ROWS:
            self._rows.popitem(last=False)
        return row

    def _continuation(self, mode: int, hex_so_far: bytes) -> list[int]:
        found = self._continuations.get((mode, hex_so_far))
        if found is None:
            start = KeyState()
            start.mode, start.in_key, start.hex = mode, True, hex_so_far
            found = [
                i
                for i, raw in enumerate(self.token_bytes)
                if raw and 0x5C not in raw and not start.copy().feed(raw[:5])
            ]
            self._continuations[(mode, hex_so_far)] = found
        return found

    def apply(self, bitmask: torch.Tensor, row: int, state: KeyState) -> None:
        words = self.row(state)
        if words is not None:
            bitmask[row] &= words
