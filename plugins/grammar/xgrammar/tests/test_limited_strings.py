"""Strings with ``minLength``/``maxLength``: xgrammar (0.2.9) writes their characters as one class
with no JSON escape, which allows raw control characters, which JSON forbids. The backend writes
the class without them (:func:`~minisgl_plugin_xgrammar.patterns.strict_limited_strings`); a
string of at most one character takes one JSON escape too. Longer ones take no escape (no quote,
backslash or line break in such a string, a cross-backend probe found llguidance's valid
``"\\ta"`` refused): a repeated character-or-escape rule, written for that from 3b3bdd5, made
xgrammar fill a 49k-token mask in 16-22 ms a token instead of 0.2-0.3 (2026-12-01)."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import xgrammar as xgr
from minisgl_plugin_xgrammar.patterns import _LIMITED_STRING_CHARACTERS
from xgrammar.testing import _is_grammar_accept_string

from minisgl_core.api import GrammarSpec
from minisgl_core.testing.grammar_suite import walk


def test_xgrammar_takes_no_escape_in_a_limited_string():
    """The witness: xgrammar's own grammar refuses a quote's escape there."""
    grammar = xgr.Grammar.from_json_schema(json.dumps({"type": "string", "maxLength": 4}), strict_mode=True)
    assert _LIMITED_STRING_CHARACTERS in str(grammar)
    assert not _is_grammar_accept_string(grammar, '"a\\"b"'), "xgrammar takes escapes now: drop the rewrite"


@pytest.mark.parametrize(
    ("text", "taken"),
    [
        ('"ab"', True),
        ('"éabc"', True),
        ('"éabcd"', False),  # five
        ('"abcde"', False),
        ('"a\tb"', False),  # a raw tab: not JSON
        ('"a\x01"', False),  # a raw control character
        ('"a\\"b"', False),  # an escape (no character rule with escapes: its masks were slow)
        ('"\\x"', False),  # no such escape
    ],
)
def test_a_limited_string_takes_plain_characters_and_counts_them(backend, text, taken, takes):
    assert takes("json_schema", {"type": "string", "maxLength": 4}, text) is taken
    if taken:
        assert len(json.loads(text)) <= 4


def test_min_length_counts_characters(backend, takes):
    schema = {"type": "object", "properties": {"d": {"type": "string", "minLength": 2, "maxLength": 3}},
              "required": ["d"], "additionalProperties": False}  # fmt: skip
    assert takes("json_schema", schema, '{"d":"éx"}') and takes("json_schema", schema, '{"d":"ຐxy"}')
    assert not takes("json_schema", schema, '{"d":"é"}') and not takes("json_schema", schema, '{"d":"abcd"}')


def test_a_repeated_character_rule_is_one_class(backend):
    """The structure that keeps the masks fast: each limited string's repeated character rule is a
    single class, no alternation with escapes (16-22 ms a token over 49k tokens, 2026-12-01)."""
    for schema in [{"type": "string", "maxLength": 100}, {"type": "string", "minLength": 2}]:
        rules = [line for line in backend._compact_json(schema).splitlines() if "_characters ::=" in line]
        assert rules and all("|" not in rule and "\\\\0-" in rule for rule in rules), rules


def test_walks_through_limited_strings_validate(backend):
    """Random walks end in JSON ``jsonschema`` finds valid (lengths counted in characters)."""
    schema = {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 3}, "minItems": 1,
              "maxItems": 3}  # fmt: skip
    compiled = backend.compile(GrammarSpec("json_schema", json.dumps(schema)))
    rng = random.Random(0)
    stop = backend.stop_token_ids[0]
    for _ in range(40):
        tokens = walk(backend.matcher(compiled), len(backend.tokenizer), stop, rng, max_steps=200)
        jsonschema.validate(json.loads(backend.tokenizer.decode([t for t in tokens if t != stop])), schema)


def _tagged(schema: dict) -> dict:
    return {"type": "structural_tag", "format": {"type": "tag", "begin": "<f>", "end": "</f>",
            "content": {"type": "json_schema", "json_schema": schema}}}  # fmt: skip


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "maxLength": 1},
        {"type": "string", "minLength": 1, "maxLength": 1},
        {"type": "object", "properties": {"d": {"type": "string", "maxLength": 1}}, "required": ["d"]},
    ],
)
def test_a_one_character_string_takes_one_escape_and_no_control_character(backend, schema, takes):
    """A string of at most one character has no character rule: xgrammar writes the class in place
    (the witness below), which took a raw control character and no escape, in a tag's JSON too (a
    cross-backend probe found llguidance's valid ``"\\u001a"`` refused, 2026-12-01)."""
    printed = str(xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=True))
    assert _LIMITED_STRING_CHARACTERS in printed and "_characters ::=" not in printed
    wrap = (lambda s: '{"d":' + s + "}") if schema["type"] == "object" else (lambda s: s)
    for text, taken in [('"a"', True), ('"\\n"', True), ('"\\""', True), ('"\\u001a"', True),
                        ('"\\u00e9"', True), ('"ab"', False), ('"\\na"', False), ('"\x01"', False)]:  # fmt: skip
        assert takes("json_schema", schema, wrap(text)) is taken, text
        assert takes("structural_tag", _tagged(schema), "<f>" + wrap(text) + "</f>") is taken, text
