"""xgrammar 0.2 lets raw control characters and UTF-8-encoded surrogates into JSON strings, and
overlong UTF-8 forms into what its regex classes match (``.``, ``[^...]``: 0xE0 0x80-0x9F, 0xF0
0x80-0x8F, three or four U+FFFD once decoded); the plugin's matchers forbid what is not UTF-8, its
JSON matchers the control characters too (checked on single-byte tokens of a byte-level
tokenizer)."""

from __future__ import annotations

import pytest
import torch

from minisgl_core.api import GrammarSpec, allocate_token_bitmask, allowed_tokens


@pytest.fixture(scope="module")
def byte(backend) -> dict[int, int]:
    """Byte value -> the id of the token that is that single byte (xgrammar's own view)."""
    vocab = backend._json_guard.decoded_vocab
    return {raw[0]: token_id for token_id, raw in enumerate(vocab) if len(raw) == 1}


def allowed_after(backend, spec: GrammarSpec, prefix: list[int]) -> torch.Tensor:
    matcher = backend.matcher(backend.compile(spec))
    for token in prefix:
        assert matcher.accept_token(token)
    mask = allocate_token_bitmask(1, backend.vocab_size)
    matcher.fill_bitmask(mask, 0)
    return allowed_tokens(mask[0], backend.vocab_size)


@pytest.mark.parametrize("schema", ['{"type": "string"}', '{"type": "string", "maxLength": 5}'])
def test_json_strings_take_no_control_bytes_or_surrogates(backend, byte, schema):
    spec = GrammarSpec("json_schema", schema)
    in_string = allowed_after(backend, spec, [byte[ord('"')]])
    assert in_string[byte[ord("a")]] and not in_string[byte[0x05]] and not in_string[byte[0x0A]]
    after_ed = allowed_after(backend, spec, [byte[ord('"')], byte[0xED]])
    assert after_ed[byte[0x9F]], "U+D000..U+D7FF (Hangul) must stay possible"
    assert not after_ed[byte[0xA0]] and not after_ed[byte[0xBF]], "a surrogate must not be"


def test_other_grammars_take_control_bytes(backend, byte):
    assert allowed_after(backend, GrammarSpec("regex", "a[\\x00-\\x1f]"), [byte[ord("a")]])[byte[0x05]]


#: (grammar, the tokens before the character the class matches)
ANY_CHARACTER = [
    (GrammarSpec("json_schema", '{"type": "string", "pattern": "^.$"}'), '"'),
    (GrammarSpec("json_schema", '{"type": "string", "pattern": "^[^a]$"}'), '"'),
    (GrammarSpec("regex", "[^\\x00-\\x7f]"), ""),
    (GrammarSpec("ebnf", "root ::= [^a]"), ""),
]


@pytest.mark.parametrize(("spec", "before"), ANY_CHARACTER, ids=["dot", "negated", "regex", "ebnf"])
def test_classes_of_any_character_take_no_overlong_or_other_non_utf8_form(backend, byte, spec, before):
    """A random-schema probe found 1% of walks through ``"pattern": "^.$"`` ending in an overlong
    three- or four-byte form (3-4 U+FFFD decoded, so the pattern broken)."""
    prefix = [byte[ord(c)] for c in before]
    first = allowed_after(backend, spec, prefix)
    assert first[byte[0xC3]] and first[byte[0xE0]] and first[byte[0xF0]]
    assert not any(first[byte[b]] for b in (0xC0, 0xC1, 0xF5, 0xFF) if b in byte)
    after = {lead: allowed_after(backend, spec, [*prefix, byte[lead]]) for lead in (0xE0, 0xF0, 0xED, 0xF4)}
    assert not after[0xE0][byte[0x80]] and not after[0xE0][byte[0x9F]] and after[0xE0][byte[0xA0]]
    assert not after[0xF0][byte[0x8F]] and after[0xF0][byte[0x90]] and after[0xF0][byte[0xBF]]
    assert after[0xED][byte[0x9F]] and not after[0xED][byte[0xA0]]
    assert after[0xF4][byte[0x8F]] and not after[0xF4][byte[0x90]]
