r"""Patterns naming UTF-16 surrogates (``\ud83d\ude00``: how ECMA-262 and JSON write U+1F600).
llguidance's regex parser refuses a surrogate escape ("hexadecimal literal is not a Unicode scalar
value"), so a JSON schema pattern or regex grammar ECMA-262 reads as one emoji was a 400 here
while xgrammar answered it. Both backends now apply
:func:`minisgl_core.api.ecma_regex.paired_surrogates`: a pair is its character, a class loses
its surrogates, a lone one is refused in words."""

from __future__ import annotations

import json

import pytest
from minisgl_plugin_llguidance.backend import LLGuidanceBackend

from minisgl_core.api import GrammarError, GrammarSpec


def _takes(backend: LLGuidanceBackend, spec: GrammarSpec, text: str) -> bool:
    matcher = backend.matcher(backend.compile(spec))._matcher  # type: ignore[attr-defined]
    return bool(matcher.consume_tokens(backend._tokenizer.tokenize_str(text))) and matcher.is_accepting()


def test_llguidance_refuses_an_escaped_surrogate_pair_itself(backend):
    """The witness: without the rewrite llguidance refuses the pair ECMA-262 reads as U+1F600."""
    llg = backend._llg
    error = llg.LLMatcher.validate_grammar(
        llg.LLMatcher.grammar_from_regex("\\ud83d\\ude00"), backend._tokenizer
    )
    assert error, "llguidance now reads surrogate escapes: check paired_surrogates is still needed"


@pytest.mark.parametrize(
    "regex, takes, not_taken",
    [
        ("\\ud83d\\ude00", ["😀"], "a"),
        ("a\\uD83D\\uDE00+b", ["a😀b", "a😀😀b"], "ab"),
        ("[\\ud83d\\ude00-\\ud83d\\ude4f]{2}", ["😀🙏", "😃😄"], "😀a"),
        ("[a\\ud800]{3}", ["aaa"], "aa"),
        ("[\\u0000-\\uffff]{2}", ["\x01é", "\ud7ff\ue000"], "😀"),
        ("[\\d\\ud800-\\udbff]", ["5"], "a"),
        ("\\\\ud800", ["\\ud800"], "x"),  # an escaped backslash, then text
        ("[^\\ud800-\\udfff]", ["a", "😀", "\n"], "ab"),  # negated, only surrogates: any character
        ("[^a\\ud800]{2}", ["bc", "😀\ue000"], "ab"),
    ],
)
def test_regex_grammars_read_surrogate_pairs_as_their_characters(backend, regex, takes, not_taken):
    spec = GrammarSpec("regex", regex)
    for text in takes:
        assert _takes(backend, spec, text), (regex, text)
    assert not _takes(backend, spec, not_taken), (regex, not_taken)


def test_json_schema_patterns_read_surrogate_pairs_as_their_characters(backend):
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "pattern": "^\\ud83d\\ude00+$"}},
        "patternProperties": {"^k\\ud83d\\ude4f$": {"type": "integer"}},
        "additionalProperties": False,
    }
    spec = GrammarSpec("json_schema", json.dumps(schema))
    assert _takes(backend, spec, '{"s":"😀😀"}')
    assert _takes(backend, spec, '{"k🙏":1}')
    assert not _takes(backend, spec, '{"s":"a"}')


@pytest.mark.parametrize(
    "kind, value",
    [
        ("regex", "a\\ud800"),
        ("regex", "[\\ud800-\\udfff]+"),
        ("json_schema", json.dumps({"type": "string", "pattern": "^\\udfff$"})),
    ],
)
def test_a_lone_surrogate_is_refused_in_words(backend, kind, value):
    with pytest.raises(GrammarError, match="lone UTF-16 surrogate"):
        backend.compile(GrammarSpec(kind, value))
