"""Structural tags: free text with tagged regions held to JSON schemas (xgrammar's format, and
vLLM's older ``structures``/``triggers`` form). The schemas in a tag are checked and rewritten as
a ``json_schema`` grammar's are: xgrammar compiled them as given, so ``[1,1]`` passed
``uniqueItems`` and "2023-11-31" a ``date``."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr
from minisgl_plugin_xgrammar.backend import XGrammarBackend

from minisgl_core.api import GrammarError, GrammarSpec

STOP = "<|im_end|>"


@pytest.fixture(scope="module")
def backend(tmp_path_factory) -> XGrammarBackend:
    from transformers import AutoTokenizer

    from minisgl_core.demo.factories import train_tokenizer

    tok = AutoTokenizer.from_pretrained(str(train_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=400)))
    return XGrammarBackend(tok, vocab_size=len(tok), stop_token_ids=[tok.convert_tokens_to_ids(STOP)])


def _tag(schema: dict) -> dict:
    tag = {"begin": "<f>", "content": {"type": "json_schema", "json_schema": schema}, "end": "</f>"}
    return {
        "type": "structural_tag",
        "format": {"type": "triggered_tags", "triggers": ["<f>"], "tags": [tag]},
    }


def test_text_and_tagged_json(backend, takes):
    tag = _tag({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    assert takes("structural_tag", tag, 'I will call it. <f>{"n":3}</f> done')
    assert not takes("structural_tag", tag, 'I will call it. <f>{"n":"x"}</f>')


def test_vllms_older_form_is_read_as_triggered_tags(backend, takes):
    older = {"structures": [{"begin": "<f>", "schema": {"type": "array", "items": {"type": "integer"}}, "end": "</f>"}],
             "triggers": ["<f>"]}  # fmt: skip
    with pytest.raises(RuntimeError, match="format"):  # xgrammar's own reading of it
        xgr.Grammar.from_structural_tag(json.dumps(older))
    assert takes("structural_tag", older, "a <f>[1,2]</f> b")
    assert not takes("structural_tag", older, 'a <f>[1,"x"]</f>')


def test_a_keyword_xgrammar_would_not_enforce_in_a_tag_is_refused_naming_where(backend):
    unique = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    raw = xgr.GrammarCompiler(
        xgr.TokenizerInfo([bytes([b]) for b in range(256)] + [b""], stop_token_ids=[256])
    )
    matcher = xgr.GrammarMatcher(
        raw.compile_grammar(xgr.Grammar.from_structural_tag(json.dumps(_tag(unique))))
    )
    assert all(matcher.accept_token(b) for b in b"<f>[1,1]</f>"), "xgrammar now enforces uniqueItems in tags"
    with pytest.raises(
        GrammarError, match=r"the schema at /format/tags/0/content/json_schema: .*'uniqueItems' at #"
    ):
        backend.check(GrammarSpec("structural_tag", json.dumps(_tag(unique))))
    older = {"structures": [{"begin": "<f>", "schema": unique, "end": "</f>"}], "triggers": ["<f>"]}
    with pytest.raises(GrammarError, match=r"the schema at /structures/0/schema: "):
        backend.check(GrammarSpec("structural_tag", json.dumps(older)))


def test_formats_and_patterns_in_a_tag_are_written_as_for_a_schema(backend, takes):
    assert not takes("structural_tag", _tag({"type": "string", "format": "date"}), '<f>"2023-11-31"</f>')
    assert takes("structural_tag", _tag({"type": "string", "format": "date"}), '<f>"2024-02-29"</f>')
    pattern = _tag({"type": "string", "pattern": "^a(x5+)?$"})
    assert not takes("structural_tag", pattern, '<f>"a5"</f>') and takes(
        "structural_tag", pattern, '<f>"ax5"</f>'
    )


def test_a_tag_schema_without_type_holds_to_its_keywords(backend, takes):
    """Written one schema per type as a ``json_schema`` grammar's is: xgrammar dropped them."""
    few = _tag({"maxItems": 2, "maxLength": 2})
    for text, taken in [("[1,2]", True), ('{"a":[1,2,3]}', True), ("[1,2,3]", False), ('"abc"', False)]:
        assert takes("structural_tag", few, f"<f>{text}</f>") is taken, text


def test_json_in_a_tag_is_compact_and_walks_end_valid(backend, takes):
    """A tag's JSON is written as a ``json_schema`` grammar's, compact: xgrammar's own allows free
    whitespace, in which a random model ran to its token limit ("<f>{" then spaces)."""
    import random

    import jsonschema

    from minisgl_core.api import allocate_token_bitmask
    from minisgl_core.testing.grammar_suite import NESTED_SCHEMA, walk

    tag = _tag({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    assert takes("structural_tag", tag, '<f>{"n":3}</f>')
    assert not takes("structural_tag", tag, '<f>{ "n":3}</f>') and not takes(
        "structural_tag", tag, '<f>{"n": 3}</f>'
    )
    whole = {"type": "structural_tag", "format": _tag(NESTED_SCHEMA)["format"]["tags"][0]}
    compiled = backend.compile(GrammarSpec("structural_tag", json.dumps(whole)))
    stop = backend.stop_token_ids[0]
    rng = random.Random(7)
    assert allocate_token_bitmask(1, backend.vocab_size).shape[0] == 1
    for _ in range(10):
        tokens = walk(backend.matcher(compiled), backend.vocab_size, stop, rng, max_steps=400)
        text = backend.tokenizer.decode([t for t in tokens if t != stop])
        assert text.startswith("<f>") and text.endswith("</f>"), text
        jsonschema.validate(json.loads(text[3:-4]), NESTED_SCHEMA)


def test_no_raw_control_character_in_a_length_limited_string_of_a_tag(backend, takes):
    from minisgl_plugin_xgrammar.patterns import _LIMITED_STRING_CHARACTERS

    limited = {"type": "string", "maxLength": 3}
    printed = str(xgr.Grammar.from_json_schema(json.dumps(limited), any_whitespace=False, strict_mode=True))
    assert _LIMITED_STRING_CHARACTERS in printed, "xgrammar writes length-limited strings otherwise now"
    assert takes("structural_tag", _tag(limited), '<f>"ab"</f>')
    assert not takes("structural_tag", _tag(limited), '<f>"a\x00"</f>') and not takes(
        "structural_tag", _tag(limited), '<f>"\x1f"</f>'
    )


def test_a_tagged_pattern_takes_the_json_escapes_it_allows(backend, takes):
    """A tag's schema is compiled as a ``json_schema`` grammar's: a ``pattern`` allowing a quote
    beside plain characters takes its escape (xgrammar's JSON-string rule never did)."""
    tag = _tag(
        {"type": "object", "properties": {"q": {"type": "string", "pattern": '^[a"]+$'}}, "required": ["q"]}
    )
    assert takes("structural_tag", tag, 'say <f>{"q":"a\\"a"}</f> done')
    assert not takes("structural_tag", tag, 'say <f>{"q":"ab"}</f>')


@pytest.mark.parametrize("kind", ["regex", "structural_tag"])
def test_dot_takes_no_line_terminator(backend, kind, takes):
    """ECMA-262's ``.`` matches no line terminator; xgrammar's took all four (a probe against
    ECMA-262's reading of random regexes, 2026-12-01), in a regex grammar and a tag's regex."""
    regex = "a.+b"
    value = regex if kind == "regex" else {"type": "structural_tag", "format": {"type": "tag", "begin": "<f>",
                                           "content": {"type": "regex", "pattern": regex}, "end": "</f>"}}  # fmt: skip
    wrap = (lambda s: s) if kind == "regex" else (lambda s: f"<f>{s}</f>")
    for middle, taken in [("x", True), ("\t", True), ("\x85", True), ("é ຐ", True), ("\n", False),
                          ("x\r", False), ("\u2028", False), ("\u2029x", False)]:  # fmt: skip
        assert takes(kind, value, wrap(f"a{middle}b")) is taken, repr(middle)
