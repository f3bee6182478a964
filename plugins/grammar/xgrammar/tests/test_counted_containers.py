"""An array or object schema that counts its items or properties without describing them: xgrammar's
strict mode reads a missing ``items`` as "no item past ``prefixItems``" and a missing
``additionalProperties`` as false, so ``{"type": "array", "maxItems": 3}`` took ``[]`` alone and
``{"type": "object", "minProperties": 1}`` was refused as "additional properties aren't allowed",
which the schema allows. The backend gives such schemas ``items: {}`` or ``additionalProperties:
{}`` (:func:`~minisgl_plugin_xgrammar.schema_rewrites.open_counted_containers`); every text the
matcher takes then keeps to the schema (checked with ``jsonschema``)."""

from __future__ import annotations

import json

import jsonschema
import pytest
import xgrammar as xgr

from minisgl_core.api import GrammarError, GrammarSpec

_BYTES = xgr.TokenizerInfo(
    [bytes([b]) for b in range(256)] + [b"</s>"], vocab_type=xgr.VocabType.RAW, stop_token_ids=[256]
)

CASES = [
    ({"type": "array", "maxItems": 3}, ["[1]", '[1,"a",null]'], ["[1,2,3,4]"]),
    ({"type": "array", "minItems": 1}, ["[1]", "[1,2]"], ["[]"]),
    ({"type": "array", "minItems": 1, "maxItems": 2}, ["[{}]", "[1,2]"], ["[]", "[1,2,3]"]),
    ({"type": ["array", "null"], "maxItems": 2}, ["[true]", "null"], ["[1,2,3]"]),
    (
        {"type": "array", "prefixItems": [{"type": "integer"}], "minItems": 2},
        ["[1,2]", '[1,"b",{}]'],
        ["[1]", '["a",2]'],
    ),
    ({"type": "object", "minProperties": 1}, ['{"a":1}', '{"a":1,"b":[]}'], ["{}"]),
    ({"type": "object", "maxProperties": 2}, ["{}", '{"a":1,"b":2}'], ['{"a":1,"b":2,"c":3}']),
    # strict mode reads unevaluatedItems as the items past prefixItems: not opened with items: {}
    # (which took ["a","b"] for minItems 2 beside unevaluatedItems integer; a random-schema walk)
    (
        {"type": "array", "minItems": 2, "unevaluatedItems": {"type": "integer"}},
        ["[1,2]"],
        ['["a","b"]', "[1]"],
    ),
    (
        {"type": "array", "maxItems": 2, "unevaluatedItems": {"type": "integer"}},
        ["[]", "[1,2]"],
        ['["a"]', "[1,2,3]"],
    ),
    (
        {
            "type": "array",
            "prefixItems": [{"type": "string"}],
            "minItems": 2,
            "unevaluatedItems": {"type": "integer"},
        },
        ['["a",1]', '["a",1,2]'],
        ['["a","b"]', '["a"]'],
    ),
    ({"minItems": 1, "unevaluatedItems": {"type": "boolean"}}, ["[true]", '"s"'], ['["a"]', "[]"]),
]


def _xgrammar_takes(schema: dict, text: str) -> bool:
    grammar = xgr.Grammar.from_json_schema(
        json.dumps(schema), any_whitespace=False, separators=(",", ":"), strict_mode=True
    )
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(_BYTES, max_threads=1).compile_grammar(grammar))
    return all(matcher.accept_token(b) for b in text.encode()) and matcher.accept_token(256)


def test_xgrammar_still_reads_counted_containers_as_empty():
    """The witness: if this fails, xgrammar reads them as JSON Schema does; drop the rewrite."""
    assert not _xgrammar_takes({"type": "array", "maxItems": 3}, "[1]")
    with pytest.raises(RuntimeError, match="additional properties aren't allowed"):
        _xgrammar_takes({"type": "object", "minProperties": 1}, '{"a":1}')


@pytest.mark.parametrize(("schema", "valid", "invalid"), CASES)
def test_counted_containers_take_what_the_schema_allows(takes, schema, valid, invalid):
    for text in valid:
        jsonschema.validate(json.loads(text), schema)
        assert takes("json_schema", schema, text), text
    for text in invalid:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(json.loads(text), schema)
        assert not takes("json_schema", schema, text), text


def test_a_tuple_with_no_count_past_it_stays_closed(takes):
    """Strict mode closes ``prefixItems`` as it closes ``properties``: valid output, not every value."""
    schema = {"type": "array", "prefixItems": [{"type": "integer"}], "maxItems": 3}
    assert takes("json_schema", schema, "[1]") and not takes("json_schema", schema, "[1,2]")


def test_more_than_one_property_counted_with_none_named_is_refused_for_what_it_is(backend):
    """Opened, ``minProperties: 2`` could be met by one key written twice: refused as that, not
    as "additional properties aren't allowed"."""
    with pytest.raises(GrammarError) as refused:
        backend.check(GrammarSpec("json_schema", json.dumps({"type": "object", "minProperties": 2})))
    assert "'minProperties' with keys outside 'properties' at #" in str(refused.value)
    assert "aren't allowed" not in str(refused.value)
