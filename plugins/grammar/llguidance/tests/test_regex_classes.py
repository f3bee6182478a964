r"""``\d`` and ``\w`` match ASCII only, as in ECMA-262 (JSON Schema's regexes) and in xgrammar:
llguidance's regex grammars (Rust's syntax) took any Unicode digit or letter ("\u0663", Arabic-Indic
three, passed ``\d``). The plugin spells them as ASCII sets (:func:`ascii_classes`); each regex
here is checked against Python's ``re`` with ``re.ASCII`` on every text."""

from __future__ import annotations

import json
import re

import pytest
from minisgl_plugin_llguidance.backend import LLGuidanceBackend, ascii_classes

from minisgl_core.api import GrammarSpec


@pytest.fixture(scope="module")
def backend(tmp_path_factory) -> LLGuidanceBackend:
    from transformers import AutoTokenizer

    from minisgl_core.demo.factories import train_tokenizer

    tok = AutoTokenizer.from_pretrained(str(train_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=400)))
    return LLGuidanceBackend(tok, vocab_size=len(tok), stop_token_ids=[2])


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
    assert ascii_classes(r"[\d.]") == "[0-9.]"
    assert ascii_classes(r"\D[^\w]") == "[^0-9][^0-9A-Za-z_]"
    assert ascii_classes(r"\\d\\\d") == r"\\d\\[0-9]"
    assert ascii_classes(r"[]\d][^]\d]") == "[]0-9][^]0-9]"  # a ] first in a class is literal
    assert ascii_classes(r"[\w-z][.-\d]") == r"[0-9A-Za-z_\-z][.\-0-9]"  # not a range of _ to z
    assert ascii_classes(r"[[:alpha:]\d]\d\p{Nd}x\[\d") == r"[[:alpha:]0-9][0-9]\p{Nd}x\[[0-9]"


def test_json_schema_patterns_were_ascii_already(backend):
    """llguidance reads a JSON schema's pattern as ECMA-262 itself: not rewritten, and it stays so."""
    spec = GrammarSpec("json_schema", json.dumps({"type": "string", "pattern": r"^[\d]\w$"}))
    assert _takes(backend, spec, '"1a"')
    assert not _takes(backend, spec, '"\u0663a"') and not _takes(backend, spec, '"1\u00e9"')
