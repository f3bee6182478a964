"""xgrammar 0.2 lets raw control characters and UTF-8-encoded surrogates into JSON strings; the
plugin's JSON matchers forbid them (checked on single-byte tokens of a byte-level tokenizer)."""

from __future__ import annotations

import pytest
import torch
from minisgl_plugin_xgrammar.backend import XGrammarBackend

from minisgl_core.api import GrammarSpec, allocate_token_bitmask, allowed_tokens


@pytest.fixture(scope="module")
def backend(tmp_path_factory) -> XGrammarBackend:
    from transformers import AutoTokenizer

    from minisgl_core.demo.factories import train_tokenizer

    tok = AutoTokenizer.from_pretrained(str(train_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=400)))
    return XGrammarBackend(tok, vocab_size=len(tok), stop_token_ids=[2])


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


def test_other_grammars_are_not_guarded(backend, byte):
    assert allowed_after(backend, GrammarSpec("regex", "a[\\x00-\\x1f]"), [byte[ord("a")]])[byte[0x05]]
