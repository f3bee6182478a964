r"""``\d`` and ``\w`` match ASCII only, as in ECMA-262 (JSON Schema's regexes) and in xgrammar:
llguidance's regex grammars (Rust's syntax) took any Unicode digit or letter ("\u0663", Arabic-Indic
three, passed ``\d``). The plugin spells them as ASCII sets (:func:`ecma_classes`); each regex
here is checked against Python's ``re`` with ``re.ASCII`` on every text. ``\s`` is ECMA-262's
WhiteSpace and LineTerminator, in regex grammars and in JSON-schema patterns: llguidance's own
(Unicode's White_Space) took U+0085 and refused U+FEFF."""

from __future__ import annotations

import json
import re

import pytest
from minisgl_plugin_llguidance.backend import LLGuidanceBackend, ecma_classes, ecma_space_in_patterns

from minisgl_core.api import GrammarSpec


def _takes(backend: LLGuidanceBackend, spec: GrammarSpec, text: str) -> bool:
    matcher = backend.matcher(backend.compile(spec))._matcher  # type: ignore[attr-defined]
    return bool(matcher.consume_tokens(backend._tokenizer.tokenize_str(text))) and matcher.is_accepting()


REGEXES = [
    r"\d+",
    r"[\w-z]+",
    r"[.-\d]",
    r"[\d.]+",
    r"\D",
    r"[^\d]",
    r"[\D]",
    r"[^\D]",
    r"\w+",
    r"[\w-]+",
    r"\W",
    r"[a\W]",
    r"\\d",
    r"\\\d",
]
#: ECMA-262 reads a "-" beside a class escape in a class as a "-" (Annex B); Python's re refuses it
PYTHON_SPELLING = {r"[\w-z]+": r"[\w\-z]+", r"[.-\d]": r"[.\-\d]"}
TEXTS = [
    "12",
    "`",
    "z-",
    "\u0663",
    "\u06f3\u0661",
    "1.2",
    "a",
    "\u00e9",
    "_",
    "-",
    " ",
    "\\d",
    "\\1",
    "\\\u0663",
]


@pytest.mark.parametrize("regex", REGEXES)
def test_digit_and_word_classes_match_ascii_only(backend, regex):
    for text in TEXTS:
        expected = re.fullmatch(PYTHON_SPELLING.get(regex, regex), text, re.ASCII) is not None
        assert _takes(backend, GrammarSpec("regex", regex), text) is expected, f"{text!r} for {regex!r}"


def test_the_rewrite_keeps_to_the_regex_as_written():
    assert ecma_classes(r"[\d.]") == "[0-9.]"
    assert ecma_classes(r"\D[^\w]") == "[^0-9][^0-9A-Za-z_]"
    assert ecma_classes(r"\\d\\\d") == r"\\d\\[0-9]"
    assert ecma_classes(r"[]\d][^]\d]") == "[]0-9][^]0-9]"  # a ] first in a class is literal
    assert ecma_classes(r"[\w-z][.-\d]") == r"[0-9A-Za-z_\-z][.\-0-9]"  # not a range of _ to z
    assert ecma_classes(r"[[:alpha:]\d]\d\p{Nd}x\[\d") == r"[[:alpha:]0-9][0-9]\p{Nd}x\[[0-9]"


def test_json_schema_patterns_were_ascii_already(backend):
    """llguidance reads a JSON schema's pattern as ECMA-262 itself: not rewritten, and it stays so."""
    spec = GrammarSpec("json_schema", json.dumps({"type": "string", "pattern": r"^[\d]\w$"}))
    assert _takes(backend, spec, '"1a"')
    assert not _takes(backend, spec, '"\u0663a"') and not _takes(backend, spec, '"1\u00e9"')


#: ECMA-262 (section "White Space" and "Line Terminators"): TAB, VT, FF, ZWNBSP, SP, NBSP, the
#: other Space_Separator (Zs) characters, and LF, CR, LS, PS
ECMA_SPACE = {0x09, 0x0B, 0x0C, 0xFEFF, 0x20, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x202F, 0x205F, 0x3000}
ECMA_SPACE |= {0x0A, 0x0D, 0x2028, 0x2029}
#: every character some library calls a space, and a few that look like one
CANDIDATES = sorted(
    {c for c in range(0x3001) if chr(c).isspace()} | ECMA_SPACE | {0x180E, 0x200B, 0x2060, 0xFEFF, 0x85, 0x1C}
)


def test_space_classes_are_ecma_262s_in_regexes(backend):
    plain, negated = GrammarSpec("regex", r"a\sb"), GrammarSpec("regex", r"a[^\S]b")
    other = GrammarSpec("regex", r"a\Sb")
    for c in CANDIDATES:
        text = f"a{chr(c)}b"
        expected = c in ECMA_SPACE
        assert _takes(backend, plain, text) is expected, f"U+{c:04X}"
        assert _takes(backend, negated, text) is expected, f"U+{c:04X}"
        assert _takes(backend, other, text) is not expected, f"U+{c:04X}"
    assert _takes(backend, GrammarSpec("regex", r"[\s-]+"), " - ")  # a "-" beside it is one


def test_space_classes_are_ecma_262s_in_json_schema_patterns(backend):
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "pattern": r"^a\s+b$"}},
        "patternProperties": {r"^k\S$": {"type": "integer"}},
        "additionalProperties": False,
    }
    spec = GrammarSpec("json_schema", json.dumps(schema))
    for c in CANDIDATES:
        if c < 0x20:  # (a control character is no JSON string's raw content)
            continue
        text = json.dumps({"s": f"a{chr(c)}b"}, ensure_ascii=False, separators=(",", ":"))
        assert _takes(backend, spec, text) is (c in ECMA_SPACE), f"U+{c:04X}"
    assert _takes(backend, spec, '{"k1":2}') and _takes(backend, spec, '{"k\u0085":2}')
    assert not _takes(backend, spec, '{"k\ufeff":2}')
    # untouched where no pattern has one
    plain = json.dumps({"type": "string", "pattern": r"^\d$"})
    assert ecma_space_in_patterns(json.loads(plain), plain) is plain


#: what ``.`` does not match in ECMA-262: the line terminators
LINE_TERMINATORS = {0x0A, 0x0D, 0x2028, 0x2029}


def test_dot_is_ecma_262s_in_regexes_and_json_schema_patterns(backend):
    """llguidance's ``.`` (Rust's) took a carriage return, U+2028 and U+2029 (``ecma_dot``)."""
    regex = GrammarSpec("regex", r"a.b")
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "pattern": "^a.b$"}},
        "required": ["s"],
    }
    pattern = GrammarSpec("json_schema", json.dumps(schema))
    for c in [*CANDIDATES, 0x0A, 0x0D, 0x2028, 0x2029, 0x0085, 0x0009]:
        expected = c not in LINE_TERMINATORS
        assert _takes(backend, regex, f"a{chr(c)}b") is expected, f"U+{c:04X}"
        if c >= 0x20:  # (a control character is no JSON string's raw content)
            text = json.dumps({"s": f"a{chr(c)}b"}, ensure_ascii=False, separators=(",", ":"))
            assert _takes(backend, pattern, text) is expected, f"U+{c:04X}"
    assert _takes(backend, pattern, '{"s":"a\\tb"}') and not _takes(backend, pattern, '{"s":"a\\rb"}')
    assert _takes(backend, GrammarSpec("regex", r"a[.]\."), "a..")  # a dot in a class or escaped
    assert not _takes(backend, GrammarSpec("regex", r"a[.]\."), "a.x")


@pytest.mark.parametrize(
    ("regex", "taken", "refused"),
    [
        (r"a\cJb", "a\nb", "acJb"),
        (r"a\0b", "a\x00b", "a0b"),
        (r"a[\b]b", "a\x08b", "abb"),
        (r"[\cI-\cK]", "\x0b", "c"),
    ],
)
def test_ecma_262_escapes_rust_lacks(backend, regex, taken, refused):
    """``\\cJ``, ``\\0`` and a backspace in a class (``[\\b]``) are ECMA-262's (xgrammar takes
    them); llguidance refused the regex."""
    assert _takes(backend, GrammarSpec("regex", regex), taken)
    assert not _takes(backend, GrammarSpec("regex", regex), refused)
    schema = {"type": "string", "pattern": f"^{regex}$"}
    assert _takes(backend, GrammarSpec("json_schema", json.dumps(schema)), json.dumps(taken))
