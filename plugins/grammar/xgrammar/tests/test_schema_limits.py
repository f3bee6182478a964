"""JSON schemas xgrammar compiles into a grammar that answers wrongly, found by an API probe of
the server (each answered with finish "stop"): a schema part that accepts no value (``anyOf: []``
answered ""), length limits beside ``enum``/``const`` (``"aa"`` for ``minLength: 3``), and a schema
nested hundreds of levels deep (12 s of xgrammar's conversion in the tokenizer process, holding
every request's admission). Each is checked against xgrammar itself on a vocabulary of the 256
bytes, so a new xgrammar that handles one makes its test here fail."""

from __future__ import annotations

import json
import time

import pytest
import xgrammar as xgr
from minisgl_plugin_xgrammar.backend import XGrammarBackend
from minisgl_plugin_xgrammar.schema_walk import MAX_SCHEMA_DEPTH, too_deep

from minisgl_core.api import GrammarError, GrammarSpec

_BYTES = xgr.TokenizerInfo(
    [bytes([b]) for b in range(256)] + [b"</s>"], vocab_type=xgr.VocabType.RAW, stop_token_ids=[256]
)


def _takes(grammar: xgr.Grammar, text: str) -> bool:
    matcher = xgr.GrammarMatcher(
        xgr.GrammarCompiler(_BYTES, max_threads=1, cache_enabled=False).compile_grammar(grammar)
    )
    return all(matcher.accept_token(b) for b in text.encode()) and (matcher.accept_token(256) or matcher.is_terminated())  # fmt: skip


def _xgrammar_own(schema: dict) -> xgr.Grammar:
    """The grammar xgrammar makes of ``schema`` as the backend calls it, without our checks."""
    return xgr.Grammar.from_json_schema(
        json.dumps(schema), any_whitespace=False, separators=(",", ":"), strict_mode=True
    )


def _nested(depth: int) -> dict:
    """Objects in objects: ``depth`` schemas deep, the string innermost included."""
    schema: dict = {"type": "string"}
    for _ in range(depth - 1):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def _refusal(backend: XGrammarBackend, schema: dict, how: str = "check") -> str:
    with pytest.raises(GrammarError) as refused:
        getattr(backend, how)(GrammarSpec("json_schema", json.dumps(schema)))
    return str(refused.value)


# ------------------------------------------------------------------ a part that accepts no value

#: (schema, what the refusal names)
ACCEPTING_NOTHING = [
    ({"anyOf": []}, "'anyOf' of no schemas at #"),
    ({"oneOf": []}, "'oneOf' of no schemas at #"),
    ({"type": "object", "properties": {"a": {"anyOf": []}}}, "'anyOf' of no schemas at #/properties/a"),
    (
        {"type": "string", "enum": ["aa", "b"], "minLength": 3},
        "'enum' with no value 'minLength' 3 allows at #",
    ),
    ({"type": "string", "const": "aa", "minLength": 3}, "'const' that 'minLength' 3 rules out at #"),
    ({"const": "abcd", "maxLength": 3}, "'const' that 'maxLength' 3 rules out at #"),
    # xgrammar compiled it with no constraint: a string came back (a structured-output probe)
    ({"type": []}, "'type' of no types at #"),
    ({"type": "object", "properties": {"a": {"type": []}}}, "'type' of no types at #/properties/a"),
    # xgrammar compiles a const alone, dropping the enum beside it: "b" passed (a random-schema walk)
    ({"enum": ["a"], "const": "b"}, "'const' that the 'enum' beside it rules out at #"),
    ({"enum": [1, "a"], "const": True}, "'const' that the 'enum' beside it rules out at #"),
    (
        {"type": "object", "properties": {"a": {"type": "string", "enum": ['q"'], "const": "\\"}}},
        "'const' that the 'enum' beside it rules out at #/properties/a",
    ),
]


@pytest.mark.parametrize(("schema", "says"), ACCEPTING_NOTHING)
@pytest.mark.parametrize("how", ["check", "compile"])
def test_a_schema_part_accepting_no_value_is_refused_as_false_is(backend, schema, says, how):
    message = _refusal(backend, schema, how)
    assert message.startswith("json_schema: part of the schema accepts no value"), message
    assert says in message
    assert "cannot accept any value" in _refusal(backend, False, how)  # xgrammar's own for false


@pytest.mark.parametrize(
    ("schema", "taken", "refused"),
    [
        ({"enum": ["a", "c"], "const": "c"}, '"c"', '"a"'),
        ({"enum": [1, "a"], "const": 1.0}, "1", '"a"'),  # equal as JSON Schema compares them
        ({"enum": [[1.0], "a"], "const": [1]}, "[1]", '"a"'),
    ],
)
def test_a_const_in_the_enum_beside_it_is_the_value(takes, schema, taken, refused):
    assert takes("json_schema", schema, taken)
    assert not takes("json_schema", schema, refused)


def test_xgrammar_compiles_an_empty_any_of_without_a_word():
    """The server answered ``{"anyOf": []}`` with "" and finish "stop"; xgrammar itself refuses
    ``false`` and an empty ``enum``, so our refusal of an empty anyOf can go once it does too."""
    _xgrammar_own({"anyOf": []})
    _xgrammar_own({"oneOf": []})
    with pytest.raises(RuntimeError, match="must not be empty"):
        _xgrammar_own({"enum": []})


# ------------------------------------------------------------------ length limits beside enum and const

#: (schema, a text xgrammar passes though the limit rules it out, a text the limit allows)
LIMITED_CHOICES = [
    ({"type": "string", "enum": ["aa", "bbbb"], "minLength": 3}, '"aa"', '"bbbb"'),
    ({"enum": ["aa", "bbbb", 7], "maxLength": 3}, '"bbbb"', "7"),  # limits say nothing of a number
    ({"type": "string", "enum": ["aé", "abc"], "maxLength": 2}, '"abc"', '"aé"'),  # characters, not bytes
    ({"type": "string", "const": "abc", "minLength": 3, "maxLength": 3}, None, '"abc"'),
    (
        {"type": "object", "properties": {"k": {"enum": ["x", "yyy"], "minLength": 2}}, "required": ["k"]},
        '{"k":"x"}',
        '{"k":"yyy"}',
    ),
]


@pytest.mark.parametrize(("schema", "broken", "kept"), LIMITED_CHOICES)
def test_length_limits_beside_enum_are_applied_to_its_values(backend, schema, broken, kept):
    if broken is not None:
        assert _takes(_xgrammar_own(schema), broken), "xgrammar now applies lengths to enum values"
    ours = backend._grammar(GrammarSpec("json_schema", json.dumps(schema)))
    assert _takes(ours, kept)
    if broken is not None:
        assert not _takes(ours, broken)
    backend.compile(GrammarSpec("json_schema", json.dumps(schema)))


# ------------------------------------------------------------------ nesting depth


def test_a_schema_nested_deeper_than_the_limit_is_refused_fast_naming_the_limit(backend):
    """xgrammar's conversion of this schema took 12.5 s at 450 levels (0.05 s at 64): the
    tokenizer process admitted no request meanwhile. Refused before xgrammar sees it."""
    for how in ("check", "compile"):
        started = time.perf_counter()
        message = _refusal(backend, _nested(450), how)
        assert time.perf_counter() - started < 2.0  # (12 s when converted; loose for a busy CI machine)
        assert f"nested deeper than {MAX_SCHEMA_DEPTH} levels" in message, message
        assert "at #" + "/properties/a" * MAX_SCHEMA_DEPTH in message


def test_a_schema_at_the_limit_compiles(backend):
    schema = _nested(MAX_SCHEMA_DEPTH)
    assert too_deep(schema) is None
    assert too_deep(_nested(MAX_SCHEMA_DEPTH + 1)) == "#" + "/properties/a" * MAX_SCHEMA_DEPTH
    started = time.perf_counter()
    backend.compile(GrammarSpec("json_schema", json.dumps(schema)))
    assert time.perf_counter() - started < 5.0


def test_depth_counts_every_kind_of_nesting():
    schema: dict = {"type": "string"}
    for i in range(MAX_SCHEMA_DEPTH):
        kind = i % 4
        if kind == 0:
            schema = {"type": "array", "items": schema}
        elif kind == 1:
            schema = {"anyOf": [{"type": "null"}, schema]}
        elif kind == 2:
            schema = {"type": "object", "additionalProperties": schema}
        else:
            schema = {"$defs": {"d": schema}, "type": "integer"}
    assert too_deep(schema) is not None
    assert too_deep(schema, limit=MAX_SCHEMA_DEPTH + 1) is None


@pytest.mark.parametrize("how", ["check", "compile"])
def test_a_ref_to_an_anchor_is_refused_naming_the_pointer_to_write(backend, how):
    """xgrammar resolves JSON pointers only: ``{"$ref": "#foo"}`` to an ``$anchor`` compiled with
    no constraint at all (a string answered a schema of integers 0-2; a structured-output probe)."""
    schema = {
        "$defs": {"s": {"$anchor": "foo", "type": "integer", "minimum": 0, "maximum": 2}},
        "$ref": "#foo",
    }
    assert _takes(_xgrammar_own(schema), '"text"'), "xgrammar now follows anchors"
    message = _refusal(backend, schema, how)
    assert "'$ref' '#foo' names an anchor" in message and "'#/$defs/Name'" in message, message
    pointer = {**schema, "$ref": "#/$defs/s"}
    backend.check(GrammarSpec("json_schema", json.dumps(pointer)))
    assert _takes(backend._grammar(GrammarSpec("json_schema", json.dumps(pointer))), "1")


# ------------------------------------------------------------------ optional properties


def _optional(count: int, prefix: str = "p") -> dict:
    return {"type": "object", "properties": {f"{prefix}{i}": {"type": "integer"} for i in range(count)}}


@pytest.mark.parametrize("how", ["check", "compile"])
def test_an_object_of_too_many_optional_properties_is_refused_fast(backend, how):
    """xgrammar's compile grows with the square of an object's optional properties: 57 s and
    1.8 GB for 4,000 on two cores (20,000 would need some 45 GB), and a compile past
    --grammar-compile-timeout cannot be stopped, so a few such requests held the scheduler's
    memory for minutes each. Refused before xgrammar sees them, naming the object and the fix."""
    started = time.perf_counter()
    message = _refusal(backend, {"type": "object", "properties": {"form": _optional(2001)}}, how)
    assert time.perf_counter() - started < 2.0
    assert "2,001 in the object at #/properties/form" in message, message
    assert "one object of 2,000" in message and "'required'" in message, message


def test_optional_properties_count_by_the_square_of_each_object(backend):
    """Four objects of 1,000 cost xgrammar what one of 2,000 does (20 s against 10-16 s): taken;
    four of 1,001 are refused. Required properties, and a definition referred to twice, count
    (xgrammar makes one rule of a definition) as they cost."""

    def objects(count: int) -> dict:
        properties = {f"o{k}": _optional(count, f"k{k}p") for k in range(4)}
        return {"type": "object", "properties": properties, "required": list(properties)}

    backend.check(GrammarSpec("json_schema", json.dumps(objects(1000))))
    more = objects(1001)
    message = _refusal(backend, more)
    assert "1,001 in the object at #/properties/o0 and 3 more object(s)" in message, message
    required = {**_optional(5000), "required": [f"p{i}" for i in range(5000)]}
    # CPU seconds, not wall: 1.2 s on an idle machine, but 7.8 s of wall time beside 3 busy loops
    # (near the bound) where its CPU time stayed 1.4 s; a chain of optional parts takes minutes
    started = time.process_time()
    backend.compile(GrammarSpec("json_schema", json.dumps(required)))  # no chain of optional parts
    assert time.process_time() - started < 10.0
    shared = {"$defs": {"form": _optional(2000)}, "type": "object", "required": ["a", "b"]}
    shared["properties"] = {"a": {"$ref": "#/$defs/form"}, "b": {"$ref": "#/$defs/form"}}
    backend.check(GrammarSpec("json_schema", json.dumps(shared)))
