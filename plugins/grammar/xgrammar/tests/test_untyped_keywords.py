"""A schema that names no ``type`` but holds keywords of some: JSON Schema applies each keyword to
the values of its type and lets any other value pass (``{"maxItems": 2}`` is any value but an
array of three). xgrammar read such a schema as any value with the keywords dropped (``[1,2,3]``
passed ``{"maxItems": 2}``, 3 ``{"minimum": 5}``), or as an object alone beside ``properties``
(5 refused). The backend writes it as an ``anyOf`` of one schema per type
(:func:`~minisgl_plugin_xgrammar.schema_rewrites.one_schema_per_type`); what the matcher takes is
then what ``jsonschema`` takes, in every place a schema can be (as strict mode reads a schema: an
object beside ``properties`` has no other key unless ``additionalProperties`` says so)."""

from __future__ import annotations

import copy
import json
import random

import jsonschema
import pytest
import xgrammar as xgr
from minisgl_plugin_xgrammar.schema_rewrites import one_schema_per_type
from minisgl_plugin_xgrammar.schema_walk import _walk

from minisgl_core.api import GrammarError, GrammarSpec

_BYTES = xgr.TokenizerInfo(
    [bytes([b]) for b in range(256)] + [b"</s>"], vocab_type=xgr.VocabType.RAW, stop_token_ids=[256]
)

#: a value of each type, and values that the keywords below hold to or break
VALUES = [
    "null", "true", "0", "3", "7", "-2", "2.5", '""', '"a"', '"aa"', '"abcd"', '"2024-02-30"',
    '"2024-02-28"', "[]", "[1]", "[1,2,3]", '["a"]', '["abcd"]', "[[1,2,3]]", "{}", '{"a":1}',
    '{"a":"abcd"}', '{"a":[1,2,3]}', '{"a":7}', '{"b":null}', '{"a":1,"b":2}', '{"b":"abcd"}',
]  # fmt: skip

#: schemas naming no type, at the root and in each place a schema can be
CASES = [
    {"maxItems": 2},
    {"minItems": 2},
    {"minimum": 5},
    {"maximum": 2.5, "exclusiveMinimum": 0},
    {"maxLength": 3},
    {"minLength": 2, "maxLength": 3},
    {"pattern": "^a+$"},
    {"format": "date"},
    {"minProperties": 1},
    {"maxProperties": 1},
    {"properties": {"a": {"type": "integer"}}},
    {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "null"}},
    {"items": {"type": "integer"}},
    {"items": {"maxItems": 2}},
    {"maxItems": 2, "maxLength": 3, "minimum": 5, "maxProperties": 1},
    {"title": "many", "description": "keywords of each type", "minItems": 1, "minLength": 1, "maximum": 3},
    {"type": "object", "properties": {"a": {"maxLength": 3}, "b": {"minimum": 5}}},
    {"type": "object", "additionalProperties": {"maxItems": 2}},
    {"type": "array", "items": {"minimum": 5}},
    {"type": "array", "prefixItems": [{"maxLength": 3}], "items": {"maxItems": 2}},
    {"anyOf": [{"maxLength": 3}, {"type": "integer"}]},
    {"$defs": {"short": {"maxLength": 3}}, "type": "array", "items": {"$ref": "#/$defs/short"}},
    {"$defs": {"few": {"maxItems": 1}}, "$ref": "#/$defs/few"},
    {"$defs": {"few": {"maxItems": 1}}, "minimum": 5, "properties": {"a": {"$ref": "#/$defs/few"}}},
    {"properties": {"a": {"properties": {"a": {"minimum": 5}}}}},
]  # fmt: skip


def _valid(schema: dict, text: str) -> bool:
    """Whether ``jsonschema`` takes ``text`` for ``schema`` read as the backend's strict mode reads
    it (no key outside ``properties`` unless ``additionalProperties`` allows it), formats checked."""
    strict = copy.deepcopy(schema)
    for sub, _, _ in _walk(strict):
        if "properties" in sub:
            sub.setdefault("additionalProperties", False)
    validator = jsonschema.Draft202012Validator(
        strict, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    return validator.is_valid(json.loads(text))


def _xgrammar_takes(schema: dict, text: str) -> bool:
    grammar = xgr.Grammar.from_json_schema(
        json.dumps(schema), any_whitespace=False, separators=(",", ":"), strict_mode=True
    )
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(_BYTES, max_threads=1).compile_grammar(grammar))
    return all(matcher.accept_token(b) for b in text.encode()) and matcher.accept_token(256)


def test_xgrammar_still_reads_a_schema_without_type_its_own_way():
    """The witness: if this fails, xgrammar reads such schemas as JSON Schema does; drop the rewrite."""
    assert _xgrammar_takes({"maxItems": 2}, "[1,2,3]")
    assert _xgrammar_takes({"minimum": 5}, "3")
    assert _xgrammar_takes({"maxLength": 3}, '"abcd"')
    assert not _xgrammar_takes({"properties": {"a": {"type": "integer"}}}, "5")


@pytest.mark.parametrize("schema", CASES, ids=json.dumps)
def test_the_matcher_takes_what_jsonschema_takes(takes, schema):
    for text in VALUES:
        assert takes("json_schema", schema, text) == _valid(schema, text), text


def _random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A schema naming no type, of keywords of several types (and nested schemas, some typed)."""
    keywords = [
        # (each lower limit at most each upper one: see test_limits_leaving_no_value_of_their_type_are_refused)
        ("minimum", lambda: rng.choice([0, 2.5])),
        ("maximum", lambda: rng.choice([2.5, 3, 7])),
        ("exclusiveMinimum", lambda: rng.choice([-2, 0])),
        ("minLength", lambda: rng.randint(0, 2)),
        ("maxLength", lambda: rng.randint(2, 4)),
        ("pattern", lambda: rng.choice(["^a*$", "^[ab]+$"])),
        ("minItems", lambda: rng.randint(0, 1)),
        ("maxItems", lambda: rng.randint(1, 3)),
        ("maxProperties", lambda: rng.randint(1, 2)),
    ]
    if depth < 2:
        keywords += [
            ("items", lambda: _random_schema(rng, depth + 1)),
            ("properties", lambda: {"a": _random_schema(rng, depth + 1), "b": {"type": "null"}}),
            (
                "additionalProperties",
                lambda: rng.choice([{"type": "integer"}, _random_schema(rng, depth + 1)]),
            ),
        ]
    schema = {key: value() for key, value in rng.sample(keywords, rng.randint(1, 4))}
    if "pattern" in schema:  # (length limits beside a pattern are refused: xgrammar drops them)
        for key in ("minLength", "maxLength"):
            schema.pop(key, None)
    if "properties" in schema and rng.random() < 0.5:
        schema["required"] = ["a"]
    return schema


def test_random_schemas_without_type_take_what_jsonschema_takes(takes):
    """60 random schemas of keywords of several types, nested in one another: each value the matcher
    takes is valid, and each valid one is taken."""
    rng = random.Random(20261207)
    for _ in range(60):
        schema = _random_schema(rng)
        for text in VALUES:
            assert takes("json_schema", schema, text) == _valid(schema, text), (schema, text)


def test_limits_leaving_no_value_of_a_named_type_are_refused(backend):
    """Beside its ``type``, limits that leave no value of it are xgrammar's to refuse (a 400 naming
    them): the answer could not be valid."""
    with pytest.raises(GrammarError, match="minItems is greater than maxItems"):
        backend.check(GrammarSpec("json_schema", json.dumps({"type": "array", "minItems": 2, "maxItems": 1})))


#: schemas naming no type whose limits leave no value of one type (or of several)
CONTRADICTIONS = [
    {"minItems": 2, "maxItems": 1},
    {"minLength": 3, "maxLength": 1},
    {"minimum": 5, "maximum": 1},
    {"exclusiveMinimum": 1, "maximum": 1},
    {"minimum": 1, "exclusiveMaximum": 1},
    {"minProperties": 1, "maxProperties": 0},
    {"minItems": 2, "maxItems": 1, "minLength": 3, "maxLength": 1, "minimum": 5, "maximum": 1},
    {"type": "object", "properties": {"a": {"minItems": 2, "maxItems": 1}}, "required": ["a"]},
]


@pytest.mark.parametrize("schema", CONTRADICTIONS, ids=json.dumps)
def test_limits_leaving_no_value_of_a_type_rule_out_that_type_alone(takes, schema):
    """Without a type, JSON Schema reads ``{"minItems": 2, "maxItems": 1}`` as any value but an
    array: the type the limits rule out drops out of the schema per type, the others stay (it was
    refused whole, as xgrammar's "minItems is greater than maxItems")."""
    for text in VALUES + ['{"a":[]}', '{"a":"x"}']:
        assert takes("json_schema", schema, text) == _valid(schema, text), text


def test_a_schema_without_type_always_keeps_a_type():
    """Boolean and null have no keywords of their own, so no limits rule every type out: the
    contradictions of every other type leave ``true``, ``false`` and ``null``."""
    schema = {
        "minItems": 2, "maxItems": 1, "minLength": 3, "maxLength": 1, "minimum": 5, "maximum": 1,
        "minProperties": 1, "maxProperties": 0,
    }  # fmt: skip
    assert one_schema_per_type(schema)
    assert schema == {"anyOf": [{"type": "boolean"}, {"type": "null"}]}


def test_nested_schemas_without_type_are_definitions():
    """Each nested schema without a type refers to its branches in ``$defs`` (xgrammar names rules
    by their path from the nearest definition; nested in place, 63 levels made names of 900
    characters and a grammar text growing with the square of the depth): the text grows with the
    depth, and no rule name with it."""
    from minisgl_plugin_xgrammar.schema_rewrites import rewrite_for_xgrammar

    def chain(depth: int) -> dict:
        schema: dict = {}
        for _ in range(depth - 1):
            schema = {"properties": {"a": schema}}
        rewrite_for_xgrammar(schema)
        return schema

    def grammar(depth: int) -> str:
        return str(
            xgr.Grammar.from_json_schema(
                json.dumps(chain(depth)), any_whitespace=False, separators=(",", ":"), strict_mode=True
            )
        )

    assert chain(3)["anyOf"][0]["properties"]["a"] == {"$ref": "#/$defs/minisgl_types_0"}
    assert max(len(line.split(" ::= ")[0]) for line in grammar(63).splitlines()) < 60
    assert len(grammar(63)) < 2.2 * len(grammar(32))


def test_a_schema_of_property_names_is_a_string_schema(takes):
    """A name is a string: the branches of a ``propertyNames`` get ``"type": "string"``, not one
    schema per type (xgrammar writes a name as whatever its schema allows: ``{1:1}`` passed)."""
    schema = {"type": "object", "propertyNames": {"anyOf": [{"maxLength": 2}, {"pattern": "^x+$"}]}}
    assert takes("json_schema", schema, '{"ab":1}') and takes("json_schema", schema, '{"xxx":1}')
    assert not takes("json_schema", schema, '{"abc":1}')
    assert not takes("json_schema", schema, "{1:1}")
    by_ref = {
        "$defs": {"short": {"maxLength": 2}},
        "type": "object",
        "propertyNames": {"$ref": "#/$defs/short"},
    }
    assert takes("json_schema", by_ref, '{"ab":1}')
    assert not takes("json_schema", by_ref, '{"abc":1}') and not takes("json_schema", by_ref, "{1:1}")


def test_what_typed_schemas_refuse_is_refused_without_type(backend):
    """Written per type, the object's keywords meet the object's checks: ``minProperties: 2``,
    which a repeated key could meet, is refused as it is beside ``"type": "object"``."""
    for schema in ({"minProperties": 2}, {"type": "object", "minProperties": 2}):
        with pytest.raises(GrammarError, match="'minProperties' with keys outside 'properties' at #"):
            backend.check(GrammarSpec("json_schema", json.dumps(schema)))


@pytest.mark.parametrize(
    "schema",
    [
        {},
        {"title": "t", "description": "any value", "default": 3, "examples": [1]},
        {"type": "string", "maxLength": 3},
        {"type": ["array", "null"], "maxItems": 2},
        {"enum": [1, "abcd"], "maxLength": 3},
        {"const": "ab", "maxLength": 3},
        {"anyOf": [{"type": "integer"}, {"type": "string"}]},
        {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"},
    ],
    ids=json.dumps,
)
def test_schemas_with_a_type_or_no_type_keywords_are_left_as_written(schema):
    written = copy.deepcopy(schema)
    assert not one_schema_per_type(written) and written == schema


def test_a_schema_without_type_is_written_one_schema_per_type():
    schema = {"$defs": {"n": {"type": "integer"}}, "title": "t", "maxItems": 2, "minimum": 1}
    assert one_schema_per_type(schema)
    assert schema == {
        "$defs": {"n": {"type": "integer"}},
        "title": "t",
        "anyOf": [
            {"type": "object"},
            {"type": "array", "maxItems": 2},
            {"type": "string"},
            {"type": "number", "minimum": 1},
            {"type": "boolean"},
            {"type": "null"},
        ],
    }


#: property-name schemas allowing values other than strings, which xgrammar wrote as names
#: (``{1:1}``, ``{null:1}``: not JSON)
NAMES_NOT_STRINGS = [
    {"anyOf": [{"type": "number"}, {"maxLength": 2}]},
    {"type": ["string", "null"], "maxLength": 2},
    {"enum": [1, "a"]},
    {"const": 5},
    {"$ref": "#/$defs/n"},
]
NAME_TEXTS = ["{}", '{"a":1}', '{"ab":1}', '{"abc":1}', "{1:1}", "{1.5:1}", "{5:1}", "{null:1}", "{true:1}"]


@pytest.mark.parametrize("names", NAMES_NOT_STRINGS, ids=json.dumps)
def test_property_names_allowing_other_values_than_strings_are_refused(takes, names):
    schema = {"type": "object", "propertyNames": names, "$defs": {"n": {"oneOf": [{"type": "integer"}]}}}
    with pytest.raises(GrammarError, match="allowing values other than strings"):
        takes("json_schema", schema, "{}")


@pytest.mark.parametrize(
    "names",
    [
        {"anyOf": [{"type": "string", "maxLength": 1}, {"maxLength": 2}]},
        {"enum": ["a", "ab"]},
        {"maxLength": 2},
    ],
    ids=json.dumps,
)
def test_property_names_of_strings_write_json_names_only(takes, names):
    """The names these allow are the strings of up to two characters; nothing else is written."""
    schema = {"type": "object", "propertyNames": names}
    assert [t for t in NAME_TEXTS if takes("json_schema", schema, t)] == ["{}", '{"a":1}', '{"ab":1}']
