"""A key that ``additionalProperties`` allows, written with an escape JSON does not require:
xgrammar writes such keys as any string but the names in ``properties``, character by character,
and let an escape stand for a character, so ``{"a":1,"\\u0061":"x"}`` passed ``{"properties": {"a":
{"type": "integer"}}, "required": ["a"], "additionalProperties": {"type": "string"}}`` and parses
to ``{"a": "x"}``. The backend lets those keys hold only the escapes of characters JSON must escape
(:func:`~minisgl_plugin_xgrammar.patterns.plain_extra_keys`) and refuses what would still let a
name of ``properties`` through as an extra key: a name that needs an escape, and ``propertyNames``
beside them. Every text the matcher takes parses to an object the schema allows (``jsonschema``)."""

from __future__ import annotations

import json

import jsonschema
import pytest
import xgrammar as xgr

from minisgl_core.api import GrammarError, GrammarSpec

INTEGER, STRING = {"type": "integer"}, {"type": "string"}
EXTRA = {"type": "object", "properties": {"a": INTEGER}, "additionalProperties": STRING}
_BYTES = xgr.TokenizerInfo(
    [bytes([b]) for b in range(256)] + [b"</s>"], vocab_type=xgr.VocabType.RAW, stop_token_ids=[256]
)


def test_xgrammar_lets_an_escape_spell_a_name_as_an_extra_key():
    """The witness: if this fails, xgrammar reads extra keys' escapes itself; the rewrite may go."""
    schema = {**EXTRA, "required": ["a"]}
    grammar = xgr.Grammar.from_json_schema(
        json.dumps(schema), any_whitespace=False, separators=(",", ":"), strict_mode=True
    )
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(_BYTES, max_threads=1).compile_grammar(grammar))
    assert all(matcher.accept_token(b) for b in b'{"a":1,"\\u0061":"x"}') and matcher.accept_token(256)


@pytest.mark.parametrize(
    ("schema", "text"),
    [
        ({**EXTRA, "required": ["a"]}, '{"a":1,"\\u0061":"x"}'),
        (EXTRA, '{"\\u0061":"x"}'),
        ({**EXTRA, "additionalProperties": True}, '{"\\u0061":"x"}'),
        (
            {"type": "object", "properties": {"ab": INTEGER, "b": INTEGER}, "additionalProperties": STRING},
            '{"a\\u0062":"x"}',
        ),
        (EXTRA, '{"\\/":1,"\\u0061":"x"}'),
        ({"type": "array", "items": EXTRA}, '[{"a":1},{"\\u0061":"x"}]'),
    ],
)
def test_an_extra_key_spelled_as_a_declared_name_is_refused(takes, schema, text):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(text), schema)
    assert not takes("json_schema", schema, text)


@pytest.mark.parametrize(
    "text",
    ['{"a":1,"x\\"y":"q"}', '{"z\\\\":"w","t\\tu":"v","\\u001f":"c"}', '{"b":"\\u0061\\/"}', '{"\\n":"x"}'],
)
def test_extra_keys_that_need_an_escape_are_taken(takes, text):
    jsonschema.validate(json.loads(text), EXTRA)
    assert takes("json_schema", EXTRA, text)


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        (
            {"type": "object", "properties": {'a"b': INTEGER}, "additionalProperties": STRING},
            "the name 'a\"b' of 'properties', which JSON writes with an escape",
        ),
        (
            {**EXTRA, "propertyNames": {"pattern": "^[a-z]*$"}},
            "'propertyNames' beside 'properties' and 'additionalProperties' at #",
        ),
    ],
)
def test_what_still_lets_a_name_through_as_an_extra_key_is_refused(backend, schema, says):
    """``{"a\\"b":"x"}`` and ``{"a":"s"}`` passed these: the extra keys' schema for a declared name."""
    with pytest.raises(GrammarError, match="cannot enforce") as refused:
        backend.check(GrammarSpec("json_schema", json.dumps(schema)))
    assert says in str(refused.value)


def test_names_that_need_an_escape_stay_where_no_extra_key_is_allowed(takes):
    schema = {"type": "object", "properties": {'a"b': INTEGER}, "required": ['a"b']}
    assert takes("json_schema", schema, '{"a\\"b":1}')
    assert not takes("json_schema", schema, '{"a\\u0022b":"x"}')
