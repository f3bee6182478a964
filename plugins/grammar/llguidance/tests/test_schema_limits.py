"""The JSON schemas xgrammar compiles into a grammar that passes output breaking them (a required
name outside ``properties``, length limits beside ``pattern``/``format``/``enum``/``const``, an
empty ``anyOf``, hundreds of levels of nesting; the xgrammar plugin refuses or rewrites them):
llguidance enforces or refuses each itself. One the plugin refuses itself: ``minProperties`` that
a repeated key outside ``properties`` can meet (:func:`repeatable_key_counts`). If a new
llguidance starts passing one, a test here fails."""

from __future__ import annotations

import json
import time

import jsonschema
import pytest
from minisgl_plugin_llguidance.backend import LLGuidanceBackend, crashing_integers, rounded_integers

from minisgl_core.api import GrammarError, GrammarSpec

#: (schema, a text that breaks it): llguidance refuses the schema or rejects the text
BROKEN = [
    ({"type": "object", "required": ["a"]}, "{}"),
    ({"properties": {"b": {"type": "integer"}}, "required": ["a"]}, '{"b":123}'),
    ({"type": "object", "required": ["a"], "additionalProperties": False}, "{}"),
    ({"type": "object", "required": ["a"], "additionalProperties": {"type": "integer"}}, '{"b":1}'),
    ({"type": "string", "pattern": "^[a-z]+$", "minLength": 5}, '"json"'),
    ({"type": "string", "pattern": "^[a-z]+$", "maxLength": 2}, '"json"'),
    ({"type": "string", "format": "date", "minLength": 12}, '"2020-01-01"'),
    ({"type": "string", "enum": ["aa", "bbbb"], "minLength": 3}, '"aa"'),
    ({"type": "string", "enum": ["aa", "bbbb"], "maxLength": 3}, '"bbbb"'),
    ({"type": "string", "const": "aa", "minLength": 3}, '"aa"'),
    ({"anyOf": []}, '""'),
    ({"oneOf": []}, '""'),
    # keys outside "properties" may repeat, and {"k":0,"k":1} parses as one property (a probe;
    # the plugin refuses these two, llguidance refuses the others of the kind itself)
    ({"type": "object", "patternProperties": {"^k$": {"type": "integer"}}, "additionalProperties": False,
      "minProperties": 2}, '{"k":0,"k":1}'),
    ({"type": "object", "minProperties": 2}, '{"x":1,"x":2}'),
    ({"type": "object", "properties": {"a": {"type": "object", "minProperties": 3}}}, '{"a":{"x":1,"x":2,"x":3}}'),
    # keywords of a type beside no "type": xgrammar drops them (the plugin writes one schema per type)
    ({"maxItems": 2}, "[1,2,3]"),
    ({"minimum": 5}, "3"),
    ({"maxLength": 3}, '"abcd"'),
    ({"type": "object", "properties": {"a": {"minProperties": 1}}}, '{"a":{}}'),
    # a oneOf whose branches overlap: xgrammar compiles it as anyOf (the plugin refuses it)
    ({"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                {"type": "object", "properties": {"b": {"type": "integer"}}}]}, '{"a":1}'),
    # property names allowing values other than strings: xgrammar wrote them as names (not JSON)
    ({"type": "object", "propertyNames": {"anyOf": [{"type": "number"}, {"maxLength": 2}]}}, "{1:1}"),
    ({"type": "object", "propertyNames": {"type": ["string", "null"], "maxLength": 2}}, "{null:1}"),
    ({"type": "object", "propertyNames": {"enum": [1, "a"]}}, "{1:1}"),
    ({"type": "object", "propertyNames": {"const": 5}}, "{5:1}"),
]  # fmt: skip


def _takes(backend: LLGuidanceBackend, schema: dict, text: str) -> bool:
    matcher = backend.matcher(backend.compile(GrammarSpec("json_schema", json.dumps(schema))))._matcher  # type: ignore[attr-defined]
    return bool(matcher.consume_tokens(backend._tokenizer.tokenize_str(text))) and matcher.is_accepting()


@pytest.mark.parametrize(("schema", "text"), BROKEN)
def test_llguidance_refuses_or_enforces_what_xgrammar_passes(backend, schema, text):
    try:
        assert not _takes(backend, schema, text), f"llguidance passes {text} for {schema}"
    except GrammarError:
        pass  # refused: "Unsatisfiable schema", a 400


def test_llguidance_keeps_what_the_limits_allow(backend):
    assert _takes(backend, {"type": "object", "required": ["a"]}, '{"a":1}')
    assert _takes(backend, {"type": "string", "enum": ["aa", "bbbb"], "minLength": 3}, '"bbbb"')
    assert _takes(backend, {"type": "string", "pattern": "^[a-z]+$", "minLength": 5}, '"jsonjson"')
    assert _takes(backend, {"maxItems": 2}, '"abc"') and _takes(backend, {"minimum": 5}, "[3]")
    # a oneOf of disjoint branches, as the xgrammar plugin takes it too
    assert _takes(backend, {"oneOf": [{"type": "string"}, {"type": "integer"}]}, "12")
    tagged = {
        "type": "object",
        "properties": {"k": {"const": "x"}, "n": {"type": "integer"}},
        "required": ["k"],
    }
    other = {"type": "object", "properties": {"k": {"const": "y"}}, "required": ["k"]}
    assert _takes(backend, {"oneOf": [tagged, other]}, '{"k":"x","n":1}')
    # minProperties no repeated key can meet: one property, or no more than the required names;
    # and a schema-like value in an enum is data
    assert _takes(backend, {"type": "object", "minProperties": 1}, '{"x":1}')
    pinned = {"type": "object", "required": ["a", "b"], "minProperties": 2}
    assert _takes(backend, pinned, '{"a":1,"b":2}')
    data = {"enum": [{"type": "object", "minProperties": 5}]}
    assert _takes(backend, data, '{"type":"object","minProperties":5}')


def test_llguidance_refuses_a_deeply_nested_schema_at_once(backend):
    schema: dict = {"type": "string"}
    for _ in range(450):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    started = time.perf_counter()
    with pytest.raises(GrammarError, match="recursion limit"):
        backend.compile(GrammarSpec("json_schema", json.dumps(schema)))
    assert time.perf_counter() - started < 2.0  # (loose for a busy CI machine)


@pytest.mark.parametrize(
    "schema",
    [
        json.dumps({"type": "integer", "multipleOf": 10**400}),
        json.dumps({"type": "integer", "minimum": 10**400}),
        '{"type": "integer", "minimum": 1e400}',
    ],
)
def test_a_number_past_a_64_bit_float_is_refused_with_words(backend, schema):
    """xgrammar raised RuntimeError('') for these (a 400 reading "invalid json_schema grammar: ");
    llguidance says where its JSON reader gave up."""
    with pytest.raises(GrammarError, match=r"^invalid json_schema grammar: number out of range at line 1"):
        backend.compile(GrammarSpec("json_schema", schema))


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"const": -(2**63)}, "-9223372036854775808 at #/const"),
        ({"type": "integer", "enum": [1, -(2**63) + 512]}, "-9223372036854775296 at #/enum/1"),
        ({"anyOf": [{"type": "string"}, {"const": {"id": [None, -(2**63) + 1]}}]}, "at #/anyOf/1/const/id/1"),
    ],
)
def test_an_integer_llguidance_crashes_on_is_refused(backend, schema, where):
    """llguidance 1.9 died of a segmentation fault compiling these (a random-schema walk): without
    the refusal this test takes the test process down with it."""
    assert where in crashing_integers(schema)[0]
    with pytest.raises(GrammarError, match="cannot compile") as refused:
        backend.check(GrammarSpec("json_schema", json.dumps(schema)))
    assert where in str(refused.value)


def test_the_integers_beside_those_are_not_refused_as_crashing():
    assert crashing_integers({"enum": [-(2**63) - 1, -(2**63) + 513, 2**63, -(2.0**63), True]}) == []


#: (schema, an integer llguidance took for it that the schema rules out, what the refusal names)
ROUNDED = [
    ({"const": 2**53 + 1}, "9007199254740992", "9007199254740993 at #/const (read as 9007199254740992)"),
    ({"enum": ["a", [2**53 + 1]]}, "[9007199254740992]", "at #/enum/1/0"),
    ({"type": "integer", "minimum": 2**53 + 1}, "9007199254740992", "9007199254740993 at #/minimum"),
    ({"type": "number", "minimum": 2**53 + 1}, "9007199254740992", "at #/minimum"),
    # past the 64-bit integers, written as the float's shortest digits (a random-schema walk)
    ({"enum": [[2**64, None]]}, "[18446744073709552000,null]", "18446744073709551616 at #/enum/0/0 (written as"),
]  # fmt: skip


@pytest.mark.parametrize(("schema", "text", "says"), ROUNDED)
def test_an_integer_a_float_does_not_hold_is_refused(backend, schema, text, says):
    assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
    with pytest.raises(GrammarError, match="past what the llguidance backend holds exactly") as refused:
        backend.check(GrammarSpec("json_schema", json.dumps(schema)))
    assert says in str(refused.value)


def test_an_integer_a_float_holds_is_kept(backend):
    assert rounded_integers({"enum": [2**53, -(2**53), 2**60, 10**400, 1.5e300]}) == []
    assert _takes(backend, {"const": 2**60}, str(2**60))


#: (schema, the whole number llguidance took for it, what the refusal names)
NARROW = [
    ({"type": "number", "exclusiveMinimum": 1, "maximum": 1.5}, "1", "'exclusiveMinimum' 1 beside 'maximum' 1.5 at #"),
    ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 0.5}, "0", "'exclusiveMinimum' 0 beside"),
    ({"type": "number", "minimum": -0.5, "exclusiveMaximum": 0}, "-0", "'exclusiveMaximum' 0 beside 'minimum' -0.5"),
    ({"type": ["number", "null"], "minimum": -1.75, "exclusiveMaximum": -1}, "-1", "'exclusiveMaximum' -1"),
    ({"properties": {"a": {"type": "number", "exclusiveMinimum": 3, "exclusiveMaximum": 3.5}}}, '{"a":3}',
     "at #/properties/a"),
]  # fmt: skip


@pytest.mark.parametrize(("schema", "text", "says"), NARROW)
def test_an_exclusive_whole_bound_less_than_1_from_the_other_is_refused(backend, schema, text, says):
    assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
    with pytest.raises(GrammarError, match="is not enforced by llguidance") as refused:
        backend.check(GrammarSpec("json_schema", json.dumps(schema)))
    assert says in str(refused.value)


def test_ranges_llguidance_bounds_right_are_kept(backend):
    assert _takes(backend, {"type": "number", "exclusiveMinimum": 1, "maximum": 2}, "1.5")
    assert not _takes(backend, {"type": "number", "exclusiveMinimum": 1, "maximum": 2}, "1")
    assert _takes(backend, {"type": "number", "minimum": 1, "maximum": 1.5}, "1")
    assert _takes(backend, {"type": "number", "minimum": 1.2, "exclusiveMinimum": 1, "maximum": 1.5}, "1.3")


#: (schema, the other number llguidance took for it, what the refusal names)
LONG_FLOATS = [
    ({"const": 0.10653719911035897}, "0.10653719911035896", "0.10653719911035897 at #/const"),
    ({"enum": ["a", [None, 1000000000000000.5]]}, "[null,1000000000000000.4]", "1000000000000000.5 at #/enum/1/1"),
    ({"properties": {"a": {"const": 4420421153695070.0}}}, '{"a":4420421153695070.5}', "at #/properties/a/const"),
    # a bound: the number past it passed (a probe)
    ({"type": "number", "minimum": -93424338.98624991}, "-93424338.98624992", "-93424338.98624991 at #/minimum"),
    ({"type": "number", "minimum": 0.10653719911035897}, "0.10653719911035896", "at #/minimum"),
]  # fmt: skip


@pytest.mark.parametrize(("schema", "text", "says"), LONG_FLOATS)
def test_a_number_of_more_digits_than_llguidance_writes_is_refused(backend, schema, text, says):
    assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
    with pytest.raises(GrammarError, match="more significant digits than the llguidance backend") as refused:
        backend.check(GrammarSpec("json_schema", json.dumps(schema)))
    assert says in str(refused.value)


def test_numbers_of_12_digits_are_kept(backend):
    assert _takes(backend, {"enum": [0.1, 123456.789012, 1e-7, 2.5]}, "123456.789012")
    assert _takes(backend, {"const": 1e-7}, "0.0000001")
    assert _takes(backend, {"type": "number", "minimum": 0.123456789012}, "0.123456789012")
