"""Completions ``logprobs.text_offset`` of tokens that are parts of UTF-8 characters, counted over
one response or on across the chunks of a stream (no server: the logprob entries are built here
as the detokenizer writes them)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl_core.server import responses as r


def entries(pieces: list[bytes]) -> list[list[Any]]:
    """Logprob entries of tokens with these bytes: [text, logprob, top, id, rank], and the
    token's own bytes where its text is not whole characters (U+FFFD standing in)."""
    out = []
    for token_id, raw in enumerate(pieces):
        try:
            out.append([raw.decode("utf-8"), -0.5, [], token_id, 1])
        except UnicodeDecodeError:
            out.append([raw.decode("utf-8", "replace"), -0.5, [], token_id, 1, [[token_id, list(raw)]]])
    return out


def token_starts(pieces: list[bytes]) -> list[int]:
    """Where each token begins in the text: at the character it is part of."""
    starts, before = [], b""
    for raw in pieces:
        starts.append(len(before.decode("utf-8", "ignore")))  # (the text is valid UTF-8)
        before += raw
    return starts


#: "a😀 日本": 😀 in three tokens, 日 in two, as SmolLM2 spells them
PIECES = [b"a", b"\xf0\x9f", b"\x98", b"\x80", b" ", b"\xe6\x97", b"\xa5", "本".encode()]


def test_a_character_straddling_two_chunks_is_one_character():
    """A stream's chunk of several tokens counted its offsets afresh: with 😀's first token in one
    chunk, its later bytes in the next read as a character each, and every offset after them was
    one past the whole response's."""
    whole = r.TextOffsets()
    want = whole.advance(entries(PIECES))
    assert want == [0, 1, 1, 1, 2, 3, 3, 4] == token_starts(PIECES)
    assert r.completion_logprobs(entries(PIECES))["text_offset"] == want
    for cut in range(len(PIECES) + 1):
        chunked = r.TextOffsets()
        offsets = [
            *r.completion_logprobs(entries(PIECES)[:cut], chunked)["text_offset"],
            *r.completion_logprobs(entries(PIECES)[cut:], chunked)["text_offset"],
        ]
        assert offsets == want, cut
        assert chunked.at == whole.at == len("a😀 日本"), cut


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(min_size=1, max_size=12),
    token_cuts=st.lists(st.integers(min_value=1, max_value=60), max_size=12),
    chunk_cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=6),
)
def test_offsets_count_whole_characters_however_tokens_and_chunks_split_the_bytes(
    text, token_cuts, chunk_cuts
):
    raw = text.encode("utf-8")
    bounds = sorted({0, len(raw), *(c for c in token_cuts if c < len(raw))})
    pieces = [raw[a:b] for a, b in zip(bounds, bounds[1:])]
    items = entries(pieces)
    chunk_bounds = sorted({0, len(items), *(c for c in chunk_cuts if c < len(items))})
    counter = r.TextOffsets()
    offsets = [o for a, b in zip(chunk_bounds, chunk_bounds[1:]) for o in counter.advance(items[a:b])]
    assert offsets == token_starts(pieces)
    assert counter.at == len(text)
