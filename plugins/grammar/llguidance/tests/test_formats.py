"""Formats llguidance writes too loosely are written as exact patterns (``FORMAT_REGEXES``):
llguidance 1.9 took February 29 of 2023 and second 60. Each beside a witness that llguidance
itself still needs it."""

from __future__ import annotations

import json

import pytest
from minisgl_plugin_llguidance.backend import _JSON_OPTIONS, LLGuidanceBackend, exact_formats

from minisgl_core.api import GrammarSpec
from minisgl_core.api.grammar import FORMAT_REGEXES


def _takes(backend: LLGuidanceBackend, grammar: str, text: str) -> bool:
    matcher = backend.matcher(grammar)._matcher  # type: ignore[attr-defined]
    return bool(matcher.consume_tokens(backend._tokenizer.tokenize_str(text))) and matcher.is_accepting()


def _llguidance_own(schema: dict) -> str:
    from llguidance import LLMatcher

    return LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=_JSON_OPTIONS)


@pytest.mark.parametrize(
    ("name", "invalid"),
    [("date", "2023-02-29"), ("time", "23:59:60Z"), ("date-time", "2023-02-29T00:00:00Z")],
)
def test_llguidance_writes_these_formats_loosely_and_the_backend_does_not(backend, name, invalid):
    schema = {"type": "string", "format": name}
    assert _takes(backend, _llguidance_own(schema), json.dumps(invalid)), (
        f"llguidance now refuses {invalid!r} for format {name!r}"
    )
    assert not _takes(
        backend, backend.compile(GrammarSpec("json_schema", json.dumps(schema))), json.dumps(invalid)
    )


def test_a_pattern_beside_the_format_is_kept_with_it(backend):
    schema = {"type": "string", "format": "date", "pattern": "^1"}
    assert exact_formats(schema)
    assert schema == {"type": "string", "pattern": "^1", "allOf": [{"pattern": FORMAT_REGEXES["date"]}]}
    compiled = backend.compile(
        GrammarSpec("json_schema", json.dumps({"type": "string", "format": "date", "pattern": "^1"}))
    )
    assert _takes(backend, compiled, '"1996-02-29"')
    assert not _takes(backend, compiled, '"1997-02-29"') and not _takes(backend, compiled, '"2024-02-29"')


def test_formats_in_nested_schemas_and_property_names_called_format(backend):
    schema = {
        "type": "object",
        "properties": {"format": {"type": "string", "format": "ipv4"}, "when": {"$ref": "#/$defs/day"}},
        "$defs": {"day": {"type": "string", "format": "date"}},
    }
    assert exact_formats(schema)
    assert schema["properties"]["format"] == {"type": "string", "pattern": FORMAT_REGEXES["ipv4"]}
    assert schema["$defs"]["day"] == {"type": "string", "pattern": FORMAT_REGEXES["date"]}
    assert not exact_formats({"type": "string", "format": "email", "enum": [{"format": "date"}]})
