"""The JSON-schema rules grammar backends share (``minisgl_core.api.grammar``), stated once: the
xgrammar and llguidance plugins each had their own copy of :func:`repeatable_key_count`."""

from __future__ import annotations

import json

import jsonschema
import pytest

from minisgl_core.api.grammar import repeatable_key_count

#: (schema, repeatable with keys outside 'properties' allowed by default, and with them refused)
CASES = [
    ({"type": "object", "minProperties": 2}, True, False),
    ({"type": "object", "minProperties": 2, "additionalProperties": {"type": "integer"}}, True, True),
    ({"type": "object", "minProperties": 2, "additionalProperties": False}, False, False),
    ({"type": "object", "minProperties": 2, "additionalProperties": False,
      "patternProperties": {"^k$": {}}}, True, True),
    ({"type": "object", "minProperties": 1}, False, False),  # one key cannot repeat into two
    ({"type": "object", "minProperties": 2, "required": ["a", "b"]}, False, False),
    ({"type": "object", "minProperties": 3, "required": ["a", "b", "a"]}, True, False),  # two names
    ({"type": "object", "minProperties": True}, False, False),  # not a count
    ({"type": "object", "minProperties": 2.0}, False, False),
    ("not a schema", False, False),
    (True, False, False),
]  # fmt: skip


@pytest.mark.parametrize(("schema", "by_default", "strict"), CASES)
def test_repeatable_key_count(schema, by_default, strict):
    assert repeatable_key_count(schema, additional_properties_default=True) is by_default
    assert repeatable_key_count(schema, additional_properties_default=False) is strict


def test_a_repeated_key_is_why():
    """The object a grammar counting keys as written passes: it parses with one property."""
    schema = {"type": "object", "minProperties": 2}
    assert repeatable_key_count(schema, additional_properties_default=True)
    assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads('{"k":0,"k":1}'))
