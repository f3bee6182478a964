"""JSON-schema patterns are matched against the string's value, which llguidance writes as JSON
text (derivre's ``json_quote``): a class matching every control character (but the line feed,
maybe) took the escapes ``\\"`` and ``\\\\`` whatever it named, so ``^[^"]*$`` let a quote through
(a probe against ECMA-262's reading, 2026-12-01). The plugin leaves U+0000 out of such classes
(:func:`quotable_classes`); each character is then taken as ECMA-262 reads the pattern, but a NUL."""

from __future__ import annotations

import json

import pytest
from minisgl_plugin_llguidance.backend import LLGuidanceBackend, quotable_classes

from minisgl_core.api import GrammarSpec
from minisgl_core.testing.grammar_suite import ecma_reference

#: every character JSON must escape, and a few it need not
CHARACTERS = [chr(c) for c in range(0x20)] + ['"', "\\", "/", "a", "é", "\u2028"]


def _takes(backend: LLGuidanceBackend, pattern: str, value: str) -> bool:
    spec = GrammarSpec("json_schema", json.dumps({"type": "string", "pattern": pattern}))
    matcher = backend.matcher(backend.compile(spec))._matcher  # type: ignore[attr-defined]
    text = json.dumps(value, ensure_ascii=False)
    return bool(matcher.consume_tokens(backend._tokenizer.tokenize_str(text))) and matcher.is_accepting()


@pytest.mark.parametrize(
    "klass", ['[^"]', "[^\\\\]", '[^"\\\\]', '[^"\\n]', "[\\x00-\\x1f]", '[^"a]', '[^\\d"]']
)
def test_classes_of_every_control_character_take_what_they_name(backend, klass):
    pattern = f"^{klass}$"
    assert quotable_classes(pattern) != pattern
    reference = ecma_reference(pattern)
    wrong = [
        c for c in CHARACTERS if _takes(backend, pattern, c) != (bool(reference.fullmatch(c)) and c != "\x00")
    ]
    assert wrong == []


def test_llguidance_quotes_such_a_class_loosely(backend):
    """The witness: without the rewrite, llguidance's own grammar takes a quote for ``[^"]``. If
    this fails, llguidance quotes such classes right and :func:`quotable_classes` may go."""
    import llguidance
    from minisgl_plugin_llguidance.backend import _JSON_OPTIONS

    schema = json.dumps({"type": "string", "pattern": '^[^"]$'})
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
    matcher = llguidance.LLMatcher(backend._tokenizer, grammar, log_level=0)
    assert matcher.consume_tokens(backend._tokenizer.tokenize_str('"\\""')) and matcher.is_accepting()


@pytest.mark.parametrize(
    "klass", ["[^a]", "[a-z]", "[\\x00]", "[\\x01-\\x1f]", '[\\S"]', "[^\\S]", "[\\s\\d]"]
)
def test_other_classes_stay_as_written(klass):
    assert quotable_classes(f"^{klass}+$") == f"^{klass}+$"
