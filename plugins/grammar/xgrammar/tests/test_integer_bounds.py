"""An integer's fractional bounds: valid JSON Schema (llguidance takes them), which xgrammar refuses
("Integer constraint must be a whole number", a 400 for ``{"type": "integer", "minimum": 2.5}``).
The plugin rewrites each to the whole bound allowing the same integers, and draft 4's boolean
``exclusiveMinimum``/``exclusiveMaximum`` to the number form. A bound past 64-bit integers is
refused by name (10**400 and 1e400 got an empty message from xgrammar). Each grammar is checked
against ``jsonschema`` on every integer of a range: it takes exactly the valid ones."""

from __future__ import annotations

import json

import jsonschema
import pytest
import xgrammar as xgr
from minisgl_plugin_xgrammar.backend import XGrammarBackend

from minisgl_core.api import GrammarError, GrammarSpec


def _takes(backend: XGrammarBackend, schema: object, text: str) -> bool:
    """Whether the backend's grammar for ``schema`` takes ``text`` (fed as single-byte tokens)."""
    byte = {raw[0]: i for i, raw in enumerate(backend._json_guard.decoded_vocab) if len(raw) == 1}
    matcher = backend.matcher(backend.compile(GrammarSpec("json_schema", json.dumps(schema))))
    return all(matcher.accept_token(byte[b]) for b in text.encode()) and (
        matcher.accept_token(2) or matcher.is_terminated()
    )


#: integer schemas with bounds xgrammar refuses as they are written
FRACTIONAL = [
    {"type": "integer", "minimum": 2.5},
    {"type": "integer", "maximum": 2.5},
    {"type": "integer", "exclusiveMinimum": 2.5},
    {"type": "integer", "exclusiveMaximum": 2.5},
    {"type": "integer", "minimum": -2.5, "maximum": 3.9},
    {"type": "integer", "exclusiveMinimum": -2.5, "exclusiveMaximum": 2.0001},
    {"type": ["integer", "null"], "minimum": 0.1, "exclusiveMaximum": 4.5},
    # draft 4: a boolean says whether the bound beside it is exclusive
    {"type": "integer", "minimum": 2, "exclusiveMinimum": True},
    {"type": "integer", "maximum": 2.5, "exclusiveMaximum": True},
    {"type": "integer", "minimum": -1, "exclusiveMinimum": False, "maximum": 3, "exclusiveMaximum": False},
    {"type": "number", "minimum": 2, "exclusiveMinimum": True},
]


@pytest.mark.parametrize("schema", FRACTIONAL)
def test_an_integers_fractional_bounds_allow_exactly_the_integers_they_say(backend, schema):
    with pytest.raises(RuntimeError, match="whole number|must be a number"):  # xgrammar itself
        xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=True)
    draft4 = any(isinstance(value, bool) for value in schema.values())
    validator = jsonschema.Draft4Validator if draft4 else jsonschema.Draft202012Validator
    for n in range(-8, 9):
        valid = validator(schema).is_valid(n)
        assert _takes(backend, schema, str(n)) is valid, f"{n} for {schema}: jsonschema says {valid}"
    if schema["type"] == "number":
        assert _takes(backend, schema, "2.5") and not _takes(backend, schema, "2")


def test_whole_bounds_and_nested_schemas_compile_as_written(backend):
    assert _takes(backend, {"type": "integer", "minimum": 3.0}, "3")
    assert not _takes(backend, {"type": "integer", "minimum": 3.0}, "2")
    assert _takes(backend, {"type": "number", "minimum": 2.5}, "2.6")
    nested = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 9.99}}, "required": ["n"]}
    assert _takes(backend, nested, '{"n":9}') and not _takes(backend, nested, '{"n":10}')


#: bounds no 64-bit integer can hold: (schema as JSON text, what the refusal names)
TOO_LARGE = [
    (
        '{"type": "integer", "minimum": 1e400}',
        "'minimum' inf (or a number past a 64-bit float, such as 1e400)",
    ),
    ('{"type": "integer", "maximum": -1e400}', "'maximum' -inf"),
    (json.dumps({"type": "integer", "maximum": 10**400}), "'maximum' 100000000000... (401 digits) is beyond"),
    (json.dumps({"type": "integer", "exclusiveMinimum": 2**63}), "'exclusiveMinimum' 9223372036854775808 is"),
    ('{"type": "integer", "minimum": 1e20}', "'minimum' 1e+20 is beyond the 64-bit integers"),
    ('{"type": "integer", "minimum": 1e400, "exclusiveMinimum": true}', "'minimum' inf"),
]


@pytest.mark.parametrize(("schema", "says"), TOO_LARGE)
@pytest.mark.parametrize("how", ["check", "compile"])
def test_a_bound_past_64_bit_integers_is_refused_by_name(backend, schema, says, how):
    with pytest.raises(GrammarError) as refused:
        getattr(backend, how)(GrammarSpec("json_schema", schema))
    assert str(refused.value).startswith("json_schema: ") and says in str(refused.value), refused.value
    assert "at #" in str(refused.value)


def test_the_64_bit_limits_themselves_are_taken(backend):
    assert _takes(backend, {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}, "0")


#: integer bounds that leave no integer, and how the refusal shows them
NO_INTEGER = [
    ({"type": "integer", "minimum": 2.5, "maximum": 2.7}, "(minimum 2.5, maximum 2.7)"),
    ({"type": "integer", "minimum": 5, "maximum": 1}, "(minimum 5, maximum 1)"),
    (
        {"type": "integer", "exclusiveMinimum": 2, "exclusiveMaximum": 3},
        "(exclusiveMinimum 2, exclusiveMaximum 3)",
    ),
    ({"type": "integer", "minimum": 3, "exclusiveMaximum": 3.0}, "(minimum 3, exclusiveMaximum 3.0)"),
    (
        {"type": "integer", "minimum": 2, "exclusiveMinimum": True, "maximum": 3, "exclusiveMaximum": True},
        "(minimum 2, maximum 3)",
    ),
]


@pytest.mark.parametrize(("schema", "shown"), NO_INTEGER)
@pytest.mark.parametrize("how", ["check", "compile"])
def test_bounds_no_integer_meets_are_refused_in_the_users_terms(backend, schema, shown, how):
    """minimum 2.5 with maximum 2.7: rewritten to 3 and 2, xgrammar refused it as "minimum greater
    than maximum", bounds the user never wrote. Now the refusal quotes the schema's own bounds (and
    ``jsonschema`` agrees that no integer is valid)."""
    draft4 = any(isinstance(value, bool) for value in schema.values())
    validator = jsonschema.Draft4Validator if draft4 else jsonschema.Draft202012Validator
    assert not any(validator(schema).is_valid(n) for n in range(-10, 11))
    nested = {"type": "object", "properties": {"n": schema}}
    with pytest.raises(GrammarError) as refused:
        getattr(backend, how)(GrammarSpec("json_schema", json.dumps(nested)))
    message = str(refused.value)
    assert message.startswith("json_schema: part of the schema accepts no value"), message
    assert f"integer bounds that no integer meets {shown} at #/properties/n" in message, message


def test_a_type_list_of_integer_and_number_takes_a_fractional_bound_as_a_number(backend):
    """["integer", "number"] means any number; xgrammar held its integer branch to integer rules and
    refused a fractional bound ("whole number"). The list is read as "number"."""
    schema = {"type": ["integer", "number"], "minimum": 2.5, "maximum": 4.5}
    for text, valid in [
        ("3", True),
        ("2.5", True),
        ("4.25", True),
        ("2", False),
        ("5", False),
        ("4.75", False),
    ]:
        assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(text)) is valid
        assert _takes(backend, schema, text) is valid, text


@pytest.mark.parametrize("bounds", [{"minimum": 2.5, "maximum": 2.7}, {"exclusiveMinimum": 1, "maximum": 1}])
def test_integer_or_null_whose_bounds_no_integer_meets_takes_null(backend, bounds):
    """The bounds bind the integers only: the schema still takes null (and nothing else)."""
    schema = {"type": ["integer", "null"], **bounds}
    for text in ["null", "1", "2", "3"]:
        valid = jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
        assert valid is (text == "null")
        assert _takes(backend, schema, text) is valid, text


@pytest.mark.parametrize(
    ("schema", "text", "says"),
    [
        ({"type": "number", "minimum": 2**53 + 1}, "9007199254740992", "'minimum' 9007199254740993 is an integer"),
        ({"minimum": 2**53 + 1}, "9007199254740992", "at #"),
        ({"type": ["number", "null"], "maximum": -(2**53) - 1}, "-9007199254740992", "at #"),
        ({"properties": {"a": {"type": "number", "minimum": 10**20 + 1}}}, '{"a":100000000000000000000}', "at #/properties/a"),
    ],
)  # fmt: skip
def test_a_numbers_bound_a_float_does_not_hold_is_refused(backend, schema, text, says):
    """xgrammar reads a number's bounds as 64-bit floats: each text here passed (2**53 for minimum
    2**53+1, a random-schema walk). An integer's bounds are exact, so only a number's are refused."""
    assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
    with pytest.raises(GrammarError, match="a 64-bit float does not hold exactly") as refused:
        backend.check(GrammarSpec("json_schema", json.dumps(schema)))
    assert says in str(refused.value)
    exact = {"type": "integer", "minimum": 2**53 + 1}
    assert _takes(backend, exact, "9007199254740993") and not _takes(backend, exact, "9007199254740992")


@pytest.mark.parametrize(
    ("schema", "text", "says"),
    [
        ({"type": "number", "exclusiveMaximum": 20659077510.9}, "20659077510.9", "'exclusiveMaximum' 20659077510.9 at #, which"),
        ({"type": "number", "exclusiveMinimum": 887960813819214.4}, "887960813819214.4", "as 887960813819214.375000"),
        ({"properties": {"a": {"type": ["number", "null"], "exclusiveMinimum": -110407783891.09007}}},
         '{"a":-110407783891.09007}', "at #/properties/a"),
    ],
)  # fmt: skip
def test_an_exclusive_bound_whose_6_decimals_are_beyond_it_is_refused(backend, schema, text, says):
    """xgrammar writes a number's range with the bound's 6 decimals (``%.6f``), which for a large
    float are another decimal, beyond it: the bound itself (``text``) passed (a probe after a
    random-schema walk)."""
    assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
    with pytest.raises(GrammarError, match="the bound itself would pass") as refused:
        backend.check(GrammarSpec("json_schema", json.dumps(schema)))
    assert says in str(refused.value)


def test_an_exclusive_bound_xgrammar_writes_exactly_is_kept(backend):
    schema = {"type": "number", "exclusiveMinimum": 0.3, "exclusiveMaximum": 2.0000005}
    assert _takes(backend, schema, "0.5") and not _takes(backend, schema, "0.3")
