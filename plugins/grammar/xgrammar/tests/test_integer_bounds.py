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


@pytest.fixture(scope="module")
def backend(tmp_path_factory) -> XGrammarBackend:
    from transformers import AutoTokenizer

    from minisgl_core.demo.factories import train_tokenizer

    tok = AutoTokenizer.from_pretrained(str(train_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=400)))
    return XGrammarBackend(tok, vocab_size=len(tok), stop_token_ids=[2])


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
