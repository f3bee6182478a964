"""A JSON Schema ``pattern`` is searched for in the string (ECMA-262's ``search``), not matched
against the whole of it: ``{"pattern": "a"}`` allows "ba" and "abc". xgrammar matched the whole
string, in a string's ``pattern``, a ``propertyNames`` pattern and a ``patternProperties`` name
alike, so only "a" could be written. The backend gives each top-level alternative not anchored
by ``^``/``$`` any text around it (:func:`~minisgl_plugin_xgrammar.patterns.xgrammar_pattern`);
what the matcher takes is what ``jsonschema`` takes, with patterns read as ECMA-262 reads them."""

from __future__ import annotations

import itertools
import json

import jsonschema
import pytest
import xgrammar as xgr

from minisgl_core.api import GrammarError
from minisgl_core.testing.grammar_suite import ecma_validator

_BYTES = xgr.TokenizerInfo(
    [bytes([b]) for b in range(256)] + [b"</s>"], vocab_type=xgr.VocabType.RAW, stop_token_ids=[256]
)


def _xgrammar_takes(schema: dict, text: str) -> bool:
    grammar = xgr.Grammar.from_json_schema(
        json.dumps(schema), any_whitespace=False, separators=(",", ":"), strict_mode=True
    )
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(_BYTES, max_threads=1).compile_grammar(grammar))
    return all(matcher.accept_token(b) for b in text.encode()) and matcher.accept_token(256)


def test_xgrammar_still_matches_patterns_whole():
    """The witness: if this fails, xgrammar searches as JSON Schema does; drop the rewrite."""
    assert not _xgrammar_takes({"type": "string", "pattern": "a"}, '"ba"')
    assert not _xgrammar_takes({"type": "object", "propertyNames": {"pattern": "a"}}, '{"ba":1}')
    # and it ignores an anchor inside a pattern: "ab" passed a^b, which no string matches
    assert _xgrammar_takes({"type": "string", "pattern": "a^b"}, '"ab"')


#: patterns anchored at neither end, one end, both, per alternative, through a group
PATTERNS = ["a", "^a", "a$", "^a$", "^a|b", "(^a|b)$", "^(a|b)$", "(?:^b$)", "", '"', "ab|^b", "[$^]"]

#: every string of up to three characters over letters and what JSON must escape (no line feed:
#: Python's "$" matches before a final one, ECMA-262's does not)
VALUES = ["".join(chars) for n in range(4) for chars in itertools.product('ab"\\', repeat=n)]


def _schemas(pattern: str) -> list[dict]:
    schemas = [
        {"type": "string", "pattern": pattern},
        {"type": "object", "propertyNames": {"pattern": pattern}},
    ]
    if pattern:  # (jsonschema reads no name as matching patternProperties "" beside additionalProperties)
        schemas.append(
            {
                "type": "object",
                "patternProperties": {pattern: {"type": "integer"}},
                "additionalProperties": False,
            }
        )
    return schemas


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_matcher_takes_what_jsonschema_takes(takes, pattern):
    for schema in _schemas(pattern):
        validator = ecma_validator(schema)
        for value in VALUES:
            instance = value if schema["type"] == "string" else {value: 1}
            text = json.dumps(instance, separators=(",", ":"))
            assert takes("json_schema", schema, text) == validator.is_valid(instance), (schema, text)


def test_property_names_containing_the_pattern_are_written(takes):
    """The case reported: names holding an "a" anywhere, each valid as ``jsonschema`` reads it."""
    schema = {"type": "object", "propertyNames": {"pattern": "a"}}
    for text in ('{"ba":1}', '{"abc":1}', '{"a":1,"xa":2}'):
        assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
        assert takes("json_schema", schema, text), text
    assert not takes("json_schema", schema, '{"b":1}')


@pytest.mark.parametrize("pattern", ["a^b", "(^a)b", "a$b", "x(?:^a)"])
@pytest.mark.parametrize("where", range(3))
def test_an_anchor_inside_a_pattern_is_refused(takes, pattern, where):
    with pytest.raises(GrammarError, match="has '\\^' or '\\$' inside it"):
        takes("json_schema", _schemas(pattern)[where], '""')
