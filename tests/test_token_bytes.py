"""A token's own bytes (logprobs' ``bytes`` for tokens that are part of a character) and the
longest text one token stands for (the server's early prompt-size bound), on the real default
model's tokenizer and on byte-fallback vocabulary entries."""

from __future__ import annotations

import random

import pytest

from minisgl_core.tokenizer.detokenize import raw_token_bytes
from minisgl_core.tokenizer.load import load_tokenizer, longest_token_chars


@pytest.fixture(scope="module")
def smollm(default_model_dir):
    return load_tokenizer(default_model_dir)


def test_byte_level_tokens_give_their_bytes(smollm):
    text = "😀 héllo — 日本語 ok"
    ids = smollm(text)["input_ids"]
    assert any("\ufffd" in smollm.decode([i]) for i in ids)  # some tokens are parts of characters
    assert b"".join(raw_token_bytes(smollm, i) for i in ids).decode("utf-8") == text
    for i in ids:
        whole = smollm.decode([i])
        if "\ufffd" not in whole:
            assert raw_token_bytes(smollm, i) == whole.encode("utf-8")


class _Fallback:
    """A SentencePiece-style vocabulary: bytes as ``<0xNN>`` entries, words with ``▁``."""

    pieces = {1: "<0xF0>", 2: "<0x9F>", 3: "▁hello", 4: "<0xZZ>"}

    def convert_ids_to_tokens(self, token_id):
        return self.pieces[token_id]


def test_byte_fallback_entries_give_their_byte():
    tok = _Fallback()
    assert raw_token_bytes(tok, 1) == b"\xf0" and raw_token_bytes(tok, 2) == b"\x9f"
    assert raw_token_bytes(tok, 3) is None  # not a byte spelling: its text's UTF-8 stands
    assert raw_token_bytes(tok, 4) is None
    assert raw_token_bytes(object(), 1) is None


def test_no_text_has_fewer_tokens_than_its_length_over_the_longest_entry(smollm):
    longest = longest_token_chars(smollm)
    assert longest == max(len(smollm.decode([i])) for i in range(len(smollm)))  # byte-level: 1 char a byte
    rng = random.Random(0)
    runs = ["-" * 200, " " * 300, "=" * 129, "\n" * 90, "ab" * 50, "😀" * 20]
    for _ in range(50):
        text = "".join(rng.choice(runs) for _ in range(rng.randrange(1, 6)))
        assert len(smollm(text)["input_ids"]) * longest >= len(text)


def test_an_output_cut_inside_a_character_ends_without_a_replacement_character(smollm):
    """max_tokens reached after the first bytes of a multi-byte character: the stream never sent
    them (incomplete UTF-8 is held back) and the final text drops them too, as vLLM's; whole
    characters, and a U+FFFD the model wrote itself, stay."""
    from minisgl_core.tokenizer.detokenize import IncrementalDetokenizer, ends_inside_character, final_text

    text = "東京は日本語 😀"
    ids = smollm(text)["input_ids"]
    cuts = [n for n in range(1, len(ids) + 1) if smollm.decode(ids[:n]).endswith("\ufffd")]
    assert cuts  # the tokenizer splits some of these characters across tokens
    for n in range(1, len(ids) + 1):
        head = ids[:n]
        whole = b"".join(raw_token_bytes(smollm, i) for i in head).decode("utf-8", errors="ignore")
        assert ends_inside_character(smollm, head) == (n in cuts)
        assert final_text(smollm, head, None) == whole
        detok = IncrementalDetokenizer(smollm, [])
        streamed = "".join(detok.add([i]) for i in head[:-1]) + detok.add(head[-1:], finished=True)
        assert streamed == whole
    written = smollm("a\ufffd")["input_ids"]  # the character U+FFFD itself, in whole
    assert smollm.decode(written).endswith("\ufffd") and not ends_inside_character(smollm, written)
    assert final_text(smollm, written, None) == "a\ufffd"
