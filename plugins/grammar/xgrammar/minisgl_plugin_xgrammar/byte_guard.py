"""Bitmask rows that forbid the tokens no UTF-8 text (or no JSON text) holds, ANDed into what
xgrammar fills: :class:`ByteGuard`."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np
import torch

from minisgl_core.api import bitmask_width


class ByteGuard:
    """Tokens xgrammar 0.2 lets through that no text holds, forbidden in every matcher: byte pairs
    that are not UTF-8 (:data:`_NOT_UTF8`: its regex classes, ``.`` and ``[^...]``, took the
    overlong forms 0xE0 0x80-0x9F and 0xF0 0x80-0x8F, which decode to three or four U+FFFD and
    broke the pattern; surrogates, 0xED 0xA0-0xBF, in JSON strings) and, for JSON matchers
    (``control``), raw control characters (in strings with maxLength; compact JSON never needs
    one). Each token holding one is forbidden, and after a token that ends in one of those lead
    bytes, every token whose first byte may not follow it. Bitmask rows, ANDed into what xgrammar
    fills."""

    def __init__(self, decoded_vocab: Sequence[bytes], vocab_size: int, *, control: bool) -> None:
        self.decoded_vocab = decoded_vocab
        self.always = _bitmask_row(vocab_size, decoded_vocab, _json_unsafe if control else _not_utf8)
        #: lead byte -> the row forbidding the tokens that may not follow it
        self.after_lead = {
            lead: _bitmask_row(
                vocab_size, decoded_vocab, lambda raw, bad=bad: raw[:1] != b"" and raw[0] in bad
            )
            for lead, bad in _BAD_SECOND_BYTES.items()
        }
        #: the ids of the tokens that end in such a lead byte, with it (few: one lookup per token)
        self.lead_ids = {
            i: raw[-1] for i, raw in enumerate(decoded_vocab) if raw[-1:] and raw[-1] in _BAD_SECOND_BYTES
        }

    def apply(
        self, bitmask: torch.Tensor, rows: Sequence[int], after_lead: Sequence[tuple[int, int]]
    ) -> None:
        """AND the guard into ``bitmask[rows]`` (one vectorized AND for all of them, in place;
        a contiguous run of rows is ANDed as one block) and, for each ``(row, lead byte)`` of
        ``after_lead``, what may follow that byte."""
        if not rows:
            return
        words = bitmask.numpy()  # a view: the AND runs in numpy, in place, without torch's dispatch
        first, count = rows[0], len(rows)
        always = self.always.numpy()
        if rows[-1] - first + 1 == count and all(b - a == 1 for a, b in zip(rows, rows[1:])):
            block = words[first : first + count]
            np.bitwise_and(block, always, out=block)
        else:
            index = np.asarray(rows, dtype=np.int64)
            words[index] &= always
        for row, lead in after_lead:
            np.bitwise_and(words[row], self.after_lead[lead].numpy(), out=words[row])


#: lead byte -> the second bytes UTF-8 does not allow after it: overlong forms (0xE0, 0xF0), a
#: surrogate (0xED), past U+10FFFF (0xF4)
_BAD_SECOND_BYTES = {
    0xE0: frozenset(range(0x80, 0xA0)),
    0xED: frozenset(range(0xA0, 0xC0)),
    0xF0: frozenset(range(0x80, 0x90)),
    0xF4: frozenset(range(0x90, 0xC0)),
}


#: bytes or byte pairs no UTF-8 text holds: those of _BAD_SECOND_BYTES, and the bytes that never
#: appear (0xC0, 0xC1: overlong two-byte forms; 0xF5-0xFF)
_NOT_UTF8 = re.compile(
    rb"[\xc0\xc1\xf5-\xff]|"
    + b"|".join(
        re.escape(bytes([lead]))
        + b"["
        + re.escape(bytes([min(seconds)]))
        + b"-"
        + re.escape(bytes([max(seconds)]))
        + b"]"
        for lead, seconds in _BAD_SECOND_BYTES.items()
    )
)


def _not_utf8(raw: bytes) -> bool:
    return _NOT_UTF8.search(raw) is not None


def _json_unsafe(raw: bytes) -> bool:
    return any(b < 0x20 for b in raw) or _not_utf8(raw)


def _bitmask_row(
    vocab_size: int, decoded_vocab: Sequence[bytes], forbidden: Callable[[bytes], bool]
) -> torch.Tensor:
    """One bitmask row: set for every token but those ``forbidden`` says, and for the ids past the
    tokenizer's vocabulary (the grammar forbids those already)."""
    ok = torch.ones(bitmask_width(vocab_size) * 32, dtype=torch.bool)
    for token_id, raw in enumerate(decoded_vocab[:vocab_size]):
        if forbidden(raw):
            ok[token_id] = False
    words = ok.view(-1, 32).to(torch.int64) << torch.arange(32)
    packed = words.sum(dim=1)
    # as int32: bit 31 is the sign bit
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
