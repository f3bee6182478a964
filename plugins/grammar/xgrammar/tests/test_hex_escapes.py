r"""Hex escapes xgrammar reads with every hex digit after ``\x``. Its printer writes a character
U+0080-U+00FF as ``\xNN``, and its EBNF parser takes ``"\xe90"`` (printed for "é0") as U+0E90: every
grammar the backend prints and parses again (a JSON schema with a ``pattern``, ``patternProperties``
or ``propertyNames``; every structural tag's JSON) generated its strings and names with such a
character before a hex digit wrong ("ຐ" for "é0", with "é0" refused), found by a cross-backend
probe (random schemas, each backend's valid walks fed to the other). Its regex parser does the same
with a pattern's own ``\x410`` (ECMA-262: "A0"), and in a class it wrote ``[\u00e9a]`` as
``[\xe9a]`` and read U+0E9A. The backend writes ``\u00NN``, and such a class member raw, instead
(:func:`~minisgl_plugin_xgrammar.patterns.unambiguous_hex`,
:func:`~minisgl_plugin_xgrammar.patterns.xgrammar_hex_escapes`)."""

from __future__ import annotations

import itertools
import json
import random
import re

import jsonschema
import pytest
import xgrammar as xgr
from minisgl_plugin_xgrammar.patterns import unambiguous_hex, xgrammar_hex_escapes
from xgrammar.testing import _is_grammar_accept_string

from minisgl_core.api import GrammarSpec
from minisgl_core.testing.grammar_suite import walk


def test_xgrammar_reads_every_hex_digit_after_x():
    """The witnesses: a printed grammar parsed again, and a regex, each lose "é0" / "A0"."""
    printed = str(xgr.Grammar.from_json_schema(json.dumps({"const": "é0"})))
    assert "\\xe90" in printed
    assert not _is_grammar_accept_string(xgr.Grammar.from_ebnf(printed), '"é0"'), (
        "xgrammar fixed: drop unambiguous_hex"
    )
    assert _is_grammar_accept_string(xgr.Grammar.from_ebnf(unambiguous_hex(printed)), '"é0"')
    assert not _is_grammar_accept_string(xgr.Grammar.from_regex("\\x410"), "A0"), (
        "xgrammar fixed: drop fixed_hex_escapes"
    )


@pytest.mark.parametrize(
    ("printed", "written"),
    [
        ('"\\xe90"', '"\\u00e90"'),
        ('[^\\0-\\x1f\\"\\\\\\r\\n]', '[^\\0-\\u001f\\"\\\\\\r\\n]'),
        ('Regex("\\\\x41")', 'Regex("\\\\x41")'),  # an escaped backslash, then text: not an escape
        ('"\\\\\\xe9a"', '"\\\\\\u00e9a"'),  # an escaped backslash, then one
    ],
)
def test_printed_hex_escapes_are_written_with_four_digits(printed, written):
    assert unambiguous_hex(printed) == written


@pytest.mark.parametrize(
    ("pattern", "written"),
    [
        ("\\x410", "\\u00410"),
        ("[\\xe90-9]", "[é0-9]"),
        ("[^\\u0000-\\u001f0]", "[^\\u0000-\x1f0]"),
        ("[\\t0]", "[\\t0]"),
        ("[]\\x41]a", "[]\\u0041]a"),
        ("\\\\x41", "\\\\x41"),
        ("\\x4", "\\x4"),
        ("\\x{41}", "\\x{41}"),
    ],
)
def test_xgrammar_hex_escapes(pattern, written):
    assert xgrammar_hex_escapes(pattern) == written


#: schemas whose grammar the backend prints and parses again, each naming "é0", "éa" or "ÿ9"
ROUND_TRIPPED = [
    {"type": "object", "properties": {"s": {"type": "string", "pattern": "^[a-z]{1,3}$"}, "k": {"const": "é0"}},
     "required": ["s", "k"], "additionalProperties": False},
    {"type": "object", "patternProperties": {"^[xy]$": {"type": "object", "properties": {"éa": {"const": "ÿ9"}},
     "required": ["éa"]}}, "additionalProperties": False, "minProperties": 1},
    {"type": "object", "propertyNames": {"pattern": "^[xy]$"}, "additionalProperties": {"enum": ["é0", "\u00800"]},
     "minProperties": 1},
]  # fmt: skip


@pytest.mark.parametrize("schema", ROUND_TRIPPED)
def test_round_tripped_grammars_keep_their_strings(backend, schema):
    """Random walks end in values ``jsonschema`` finds valid (they gave "ຐ" for "é0")."""
    spec = GrammarSpec("json_schema", json.dumps(schema))
    compiled = backend.compile(spec)
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(0)
    stop = backend.stop_token_ids[0]
    for _ in range(12):
        tokens = walk(backend.matcher(compiled), len(backend.tokenizer), stop, rng, max_steps=200)
        text = backend.tokenizer.decode([t for t in tokens if t != stop])
        assert not list(validator.iter_errors(json.loads(text))), text


def test_a_round_tripped_string_is_taken_as_written(backend, takes):
    assert takes("json_schema", json.dumps(ROUND_TRIPPED[0]), '{"s":"ab","k":"é0"}')


@pytest.mark.parametrize(
    ("kind", "value", "text"),
    [
        ("regex", "\\x410", "A0"),
        ("regex", "[\\xe90]{2}", "é0"),
        ("regex", "[\\u00e9a]{2}", "éa"),
        ("regex", "[^\\u0000-\\u001f0]", "a"),
        ("json_schema", json.dumps({"type": "string", "pattern": "^\\x41[\\xe90]$"}), '"A0"'),
        ("structural_tag", json.dumps({"type": "structural_tag", "format": {"type": "regex", "pattern": "\\x410"}}), "A0"),
        ("structural_tag", json.dumps({"type": "structural_tag", "format": {"type": "tag", "begin": "<f>",
         "content": {"type": "json_schema", "json_schema": {"const": "é0"}}, "end": "</f>"}}), '<f>"é0"</f>'),
    ],
)  # fmt: skip
def test_hex_escapes_mean_two_digits(backend, kind, value, text, takes):
    assert takes(kind, value, text)


#: atoms of random regexes: escapes of every form, Latin-1 characters in and out of classes
_ATOMS = ["a", "é", "0", "A", "\\x41", "\\u00e9", "\\x30", "[a0]", "[é0]", "[\\u00e9a]", "[^a]", ".", "\\d", "\\w",
          "\\W", "[\\x30-\\x39]", "[a-c0]", "[\\u0080-\\u00ff0]", "[\\x41-\\x43a]", "\\u0041", "[^\\u00e9]",
          "[\\d\\u00e9]", "\\.", "\\t", "[\\t0]"]  # fmt: skip


def _random_regex(rng: random.Random, depth: int = 0) -> str:
    parts = []
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.15 and depth < 2:
            atom = "(" + "|".join(_random_regex(rng, depth + 1) for _ in range(rng.randint(1, 2))) + ")"
        else:
            atom = rng.choice(_ATOMS)
        parts.append(atom + rng.choice(["", "", "", "?", "*", "+", "{2}", "{0,2}"]))
    return "".join(parts)


def test_random_regexes_take_what_python_takes(backend, takes):
    """40 random regex grammars take exactly the strings of up to three characters over
    "a0éA\\tຐ" that Python's ``re`` (ASCII classes, as ECMA-262) takes; with the escapes as
    xgrammar read them, 17 of 80 such patterns did not (a probe, 2026-12-01)."""
    rng = random.Random(20261201)
    strings = ["".join(c) for n in range(1, 4) for c in itertools.product("a0éA\tຐ", repeat=n)]
    wrong = []
    for _ in range(40):
        pattern = _random_regex(rng)
        reference = re.compile(pattern, re.ASCII)
        missed = [s for s in strings if takes("regex", pattern, s) != bool(reference.fullmatch(s))]
        if missed:
            wrong.append(f"{pattern!r} on {missed[:3]}")
    assert wrong == []
