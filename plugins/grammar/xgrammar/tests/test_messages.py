"""A bad grammar's 400 says what is wrong in the user's terms: xgrammar's own messages come with a
time stamp, a C++ source location and, for a failed assertion, its condition; those are cut."""

from __future__ import annotations

import json

import pytest

from minisgl_core.api import GrammarError, GrammarSpec


@pytest.mark.parametrize(
    ("kind", "value", "says"),
    [
        ("json_schema", json.dumps({"type": "foo"}), 'invalid json_schema grammar: Unsupported type "foo"'),
        (
            "json_schema",
            json.dumps({"type": "number", "minimum": 5, "maximum": 1}),
            "invalid json_schema grammar: Invalid range: empty range",
        ),
        (
            "regex",
            "((",
            "invalid regex grammar: Regex parsing error at position 3: The parenthesis is not closed.",
        ),
        (
            "ebnf",
            "root ::= foo",
            'invalid ebnf grammar: EBNF parser error at line 1, column 10: Rule "foo" is not defined',
        ),
    ],
)
@pytest.mark.parametrize("how", ["check", "compile"])
def test_a_bad_grammar_is_named_without_the_librarys_noise(backend, kind, value, says, how):
    with pytest.raises(GrammarError) as refused:
        getattr(backend, how)(GrammarSpec(kind, value))
    message = str(refused.value)
    assert message.startswith(says), message
    assert ".cc:" not in message and "Check failed" not in message and not message.endswith("\n")


@pytest.mark.parametrize("grammar", ['start: "x" "y"', '?start: value\nvalue: "a" | "b"\n'])
def test_a_lark_grammar_is_named_as_such(backend, grammar):
    """vLLM takes Lark for its ebnf grammars; here a Lark grammar's refusal says what to write."""
    with pytest.raises(
        GrammarError, match=r"it reads as Lark.*name ::= \.\.\., starting from the rule named root"
    ):
        backend.check(GrammarSpec("ebnf", grammar))
    with pytest.raises(GrammarError) as refused:  # GBNF's own mistakes are not called Lark
        backend.check(GrammarSpec("ebnf", 'root ::= "x" rest'))
    assert "Lark" not in str(refused.value)


@pytest.mark.parametrize(
    ("kind", "value", "hint"),
    [
        ("regex", "[^\\s\\S]", "a class that matches no character"),
        ("ebnf", "root ::= root", "a rule that only refers to itself"),
        ("json_schema", json.dumps({"anyOf": [{"$ref": "#"}]}), "a schema that only refers to itself"),
    ],
)
def test_a_grammar_no_text_can_begin_gets_a_hint_of_its_own_kind(backend, kind, value, hint):
    """A regex no text matches was told of "a schema that only refers to itself"."""
    with pytest.raises(GrammarError) as refused:
        backend.check(GrammarSpec(kind, value))
    message = str(refused.value)
    assert message.startswith(f"the {kind} grammar accepts no text: no token can begin it ({hint}")
    assert kind == "json_schema" or "schema" not in message
