"""``$ref``s into what the rewrites move: a schema naming no type has its keywords moved into one
branch per type (nested ones into ``$defs``), a ``patternProperties`` name is rewritten, a moot
``propertyNames`` dropped. A ``$ref`` into them stopped resolving (xgrammar's "Cannot find field
'properties' in #/properties/a", a 400 for a valid schema); the schemas they point into now become
``$defs`` entries first (:mod:`~minisgl_plugin_xgrammar.schema_refs`), and what the matcher takes
is what ``jsonschema`` takes. A ``$ref`` the backend cannot keep is refused, never followed
elsewhere."""

from __future__ import annotations

import copy
import json
import random

import jsonschema
import pytest
from minisgl_plugin_xgrammar.schema_rewrites import rewrite_for_xgrammar
from minisgl_plugin_xgrammar.schema_walk import _walk

from minisgl_core.api import GrammarError, GrammarSpec

#: values of each type, objects with keys in the order the schemas below write them (xgrammar
#: writes properties in that order)
VALUES = [
    "null", "true", "3", '""', '"x"', '"xy"', "[]", "[1]", '["x"]', "[1,2]", "{}", '{"a":"x"}',
    '{"a":1}', '{"a":[1,2]}', '{"a":[1]}', '{"b":"x"}', '{"b":1}', '{"b":[1,2]}', '{"b":["x"]}',
    '{"a":"x","b":"y"}', '{"a":"x","b":1}', '{"a":{"y":"x"}}', '{"a":{"y":1}}', '{"a":{"b":"x"}}',
    '{"a":{"b":{"b":1}}}', '{"a":{"b":{"b":[]}}}', '{"c":"x"}', '{"c":1}',
]  # fmt: skip

#: schemas with a ``$ref`` into what a rewrite moves, each valid JSON Schema
MOVED = [
    # into the keywords of a root naming no type
    {"properties": {"a": {"type": "string"}, "b": {"$ref": "#/properties/a"}}},
    {"items": {"type": "integer"}, "properties": {"b": {"$ref": "#/items"}}},
    {"properties": {"a": {"properties": {"y": {"type": "string"}}}, "b": {"$ref": "#/properties/a/properties/y"}}},
    {"properties": {"a": {"x-sub": {"type": "string"}}, "b": {"$ref": "#/properties/a/x-sub"}}},
    {"properties": {"a/b": {"type": "string"}, "c": {"$ref": "#/properties/a~1b"}}},
    {"properties": {"a b": {"type": "string"}, "c": {"$ref": "#/properties/a%20b"}}},
    # recursion through a schema that moves
    {"properties": {"a": {"properties": {"b": {"$ref": "#/properties/a"}}}}},
    {"type": "object", "properties": {"a": {"properties": {"b": {"$ref": "#/properties/a"}}}}},
    # into a nested schema naming no type, or a definition naming none
    {"type": "object", "properties": {"a": {"items": {"type": "integer"}}, "b": {"$ref": "#/properties/a/items"}}},
    {"type": "object", "properties": {"a": {"items": True, "maxItems": 1}, "b": {"$ref": "#/properties/a/items"}}},
    {
        "$defs": {"x": {"properties": {"y": {"type": "string"}}, "maxItems": 1}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/x"}, "b": {"$ref": "#/$defs/x/properties/y"}},
    },
    {
        "type": "object",
        "properties": {"a": {"$defs": {"s": {"maxLength": 1}}, "items": {"$ref": "#/properties/a/$defs/s"}}},
    },
    # through allOf and anyOf
    {"allOf": [{"properties": {"a": {"items": {"type": "string"}}, "b": {"$ref": "#/allOf/0/properties/a/items"}}}]},
    {"anyOf": [{"properties": {"a": {"type": "string"}, "b": {"$ref": "#/anyOf/0/properties/a"}}}, {"type": "null"}]},
    # into the branch of a type whose limits leave no value of it (dropped)
    {"minItems": 2, "maxItems": 1, "items": {"type": "string"}, "properties": {"b": {"$ref": "#/items"}}},
    # into a rewritten patternProperties name, and a dropped propertyNames
    {"type": "object", "patternProperties": {"c": {"type": "string"}}, "properties": {"b": {"$ref": "#/patternProperties/c"}}},
    {
        "type": "object",
        "additionalProperties": False,
        "propertyNames": {"type": "string", "maxLength": 1},
        "properties": {"a": {"$ref": "#/propertyNames"}},
    },
]  # fmt: skip

#: ``$ref``s to schemas under keywords no schema names, which xgrammar follows: they are checked
#: and rewritten as the others (``{"maxItems": 1}`` under ``x-defs`` took ``[1,2]``)
ELSEWHERE = [
    {"type": "object", "x-defs": {"few": {"maxItems": 1}}, "properties": {"b": {"$ref": "#/x-defs/few"}}},
    {
        "components": {
            "schemas": {"A": {"items": {"$ref": "#/components/schemas/S"}}, "S": {"maxLength": 1}}
        },
        "properties": {"b": {"$ref": "#/components/schemas/A"}},
    },
]

#: ``$ref``s the rewrites never moved: the root, and the root's definitions
KEPT = [
    {"properties": {"a": {"type": "string"}, "b": {"$ref": "#"}}},
    {"$defs": {"n": {"properties": {"b": {"$ref": "#/$defs/n"}}, "maxItems": 1}}, "$ref": "#/$defs/n"},
    {"definitions": {"s": {"maxLength": 1}}, "properties": {"a": {"$ref": "#/definitions/s"}}},
]


def _valid(schema: dict, text: str) -> bool:
    """Whether ``jsonschema`` takes ``text`` for ``schema`` read as strict mode reads it (no key
    outside ``properties`` unless ``additionalProperties`` allows it)."""
    strict = copy.deepcopy(schema)
    for sub, _, _ in _walk(strict):
        if "properties" in sub:
            sub.setdefault("additionalProperties", False)
    return jsonschema.Draft202012Validator(strict).is_valid(json.loads(text))


@pytest.mark.parametrize("schema", MOVED + ELSEWHERE + KEPT, ids=json.dumps)
def test_a_ref_into_what_a_rewrite_moves_keeps_its_schema(takes, schema):
    jsonschema.Draft202012Validator.check_schema(schema)
    for text in VALUES:
        assert takes("json_schema", schema, text) == _valid(schema, text), text


@pytest.mark.parametrize("schema", KEPT, ids=json.dumps)
def test_refs_to_the_root_and_its_definitions_are_left_as_written(schema):
    """(Those to the branches of a schema naming no type, ``minisgl_types_N``, are the rewrite's.)"""
    written = copy.deepcopy(schema)
    rewrite_for_xgrammar(written)
    refs = [sub["$ref"] for sub, _, _ in _walk(written) if "$ref" in sub]
    assert sorted(ref for ref in refs if "minisgl_types" not in ref) == sorted(
        sub["$ref"] for sub, _, _ in _walk(schema) if "$ref" in sub
    )
    assert not any(name.startswith("minisgl_ref") for name in written.get("$defs", {}))


def test_a_schema_a_ref_points_into_becomes_a_definition():
    schema = {"properties": {"a": {"type": "string"}, "b": {"$ref": "#/properties/a"}}}
    rewrite_for_xgrammar(schema)
    assert schema["$defs"] == {"minisgl_ref_0": {"type": "string"}}
    assert schema["anyOf"][0] == {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/minisgl_ref_0"}, "b": {"$ref": "#/$defs/minisgl_ref_0"}},
    }


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
        {"type": "object", "properties": {"a": {"maxItems": 1}, "b": {"$ref": "#/properties/a/maxItems"}}},
        # no such definition until the rewrite adds it: it had pointed at a's branches
        {
            "properties": {
                "a": {"properties": {"b": {"maxItems": 1}}},
                "c": {"$ref": "#/$defs/minisgl_types_0"},
            }
        },
    ],
    ids=json.dumps,
)
def test_a_ref_to_no_schema_is_refused_naming_it(backend, schema):
    with pytest.raises(
        GrammarError, match=r"'\$ref' '#/[^']*' points at no schema in this one at #/properties/"
    ):
        backend.check(GrammarSpec("json_schema", json.dumps(schema)))


def test_a_schema_under_an_unknown_keyword_is_checked_where_it_is(backend):
    schema = {
        "type": "object",
        "components": {"schemas": {"A": {"type": "array", "uniqueItems": True}}},
        "properties": {"b": {"$ref": "#/components/schemas/A"}},
    }
    with pytest.raises(GrammarError, match="cannot enforce 'uniqueItems' at #/components/schemas/A"):
        backend.check(GrammarSpec("json_schema", json.dumps(schema)))


def test_a_ref_into_a_value_is_refused(backend):
    """Read as a schema, a ``const``'s object would be rewritten as one (the value changed with it)."""
    schema = {
        "type": "object",
        "properties": {"a": {"const": {"maxItems": 1}}, "b": {"$ref": "#/properties/a/const"}},
    }
    with pytest.raises(
        GrammarError, match=r"'\$ref' '#/properties/a/const' points into the 'const' of a schema"
    ):
        backend.check(GrammarSpec("json_schema", json.dumps(schema)))


def test_a_ref_into_a_moved_keyword_outside_any_schema_is_refused(backend):
    """``#/properties`` is the map of properties, read as a schema of unknown keywords (any value);
    moved into the object's branch, it is not a schema of its own to make a definition of."""
    schema = {"properties": {"a": {"type": "string"}, "b": {"$ref": "#/properties"}}}
    with pytest.raises(GrammarError, match=r"'\$ref' '#/properties' at #/properties/b points into a part"):
        backend.check(GrammarSpec("json_schema", json.dumps(schema)))


def test_a_schema_without_type_for_both_names_and_values_is_refused(backend, takes):
    """For names, a schema naming no type is written as a string schema (xgrammar writes a name as
    whatever its schema allows); a value held to the same schema may be of any type, which that
    would refuse (``{"b":1}`` was)."""
    schema = {
        "type": "object",
        "propertyNames": {"maxLength": 1},
        "additionalProperties": {"$ref": "#/propertyNames"},
    }
    with pytest.raises(GrammarError, match="both a 'propertyNames' and a value's schema at #/propertyNames"):
        backend.check(GrammarSpec("json_schema", json.dumps(schema)))
    by_definition = {
        "$defs": {"s": {"maxLength": 1}},
        "type": "object",
        "propertyNames": {"$ref": "#/$defs/s"},
        "additionalProperties": {"$ref": "#/$defs/s"},
    }
    with pytest.raises(GrammarError, match="both a 'propertyNames' and a value's schema at #/\\$defs/s"):
        backend.check(GrammarSpec("json_schema", json.dumps(by_definition)))
    typed = copy.deepcopy(by_definition)
    typed["$defs"]["s"]["type"] = "string"
    assert takes("json_schema", typed, '{"b":"x"}') and not takes("json_schema", typed, '{"b":1}')


def test_a_structural_tag_names_the_schema_whose_ref_is_refused(backend):
    schema = {"properties": {"a": {"type": "string"}, "b": {"$ref": "#/properties"}}}
    tag = {"structures": [{"begin": "<f>", "schema": schema, "end": "</f>"}], "triggers": ["<f>"]}
    with pytest.raises(GrammarError, match=r"the schema at /structures/0/schema: '\$ref' '#/properties'"):
        backend.check(GrammarSpec("structural_tag", json.dumps(tag)))


def _random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A schema naming no type: keywords of several types, some holding further such schemas."""
    keywords = [
        ("minimum", lambda: rng.choice([0, 2.5])),
        ("maximum", lambda: rng.choice([3, 7])),
        ("maxLength", lambda: rng.randint(1, 3)),
        ("minItems", lambda: rng.randint(0, 1)),
        ("maxItems", lambda: rng.randint(1, 2)),
        ("maxProperties", lambda: rng.randint(1, 2)),
    ]
    if depth < 2:
        keywords += [
            ("items", lambda: _random_schema(rng, depth + 1)),
            ("properties", lambda: {"a": _random_schema(rng, depth + 1)}),
            ("additionalProperties", lambda: _random_schema(rng, depth + 1)),
        ]
    return {key: value() for key, value in rng.sample(keywords, rng.randint(1, 4))}


RANDOM_TEXTS = ["3", '"abcd"', "[1,2]", "{}", '{"a":"ab"}', '{"a":[1,2,3]}', '{"a":{"a":7}}']
RANDOM_TEXTS += [
    '{"z":3}',
    '{"z":"abcd"}',
    '{"z":[1,2,3]}',
    '{"z":{"a":7}}',
    '{"z":null}',
    '{"z":[]}',
    '{"z":"a"}',
]


def test_random_refs_into_schemas_without_type_take_what_jsonschema_takes(takes):
    """Random schemas naming no type, a property ``z`` of each holding others pointing at one of
    them (21 of the 40; each such ``$ref`` was a 400 before)."""
    rng = random.Random(20261206)
    for _ in range(40):
        schema = _random_schema(rng)
        inner = [path for _, path, _ in _walk(schema) if path != "#"]
        if not inner:
            continue
        schema.setdefault("properties", {})["z"] = {"$ref": rng.choice(inner)}
        for text in RANDOM_TEXTS:
            assert takes("json_schema", schema, text) == _valid(schema, text), (schema, text)
