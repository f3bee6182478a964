"""A key written with an escape JSON does not require: llguidance compared the keys that
``additionalProperties`` allows with the names of ``properties`` as written, so
``{"\\u0061ge":"old"}`` passed ``{"properties": {"age": {"type": "integer"}}}`` and parses to
``{"age": "old"}``. The key guard (:mod:`minisgl_plugin_llguidance.key_guard`) allows in a key only
the escapes JSON requires, spelled as ``json.dumps`` spells them: every text the matcher takes
then parses to an object the schema allows (checked with ``jsonschema``), and keys that need an
escape are still taken."""

from __future__ import annotations

import json

import jsonschema
import pytest
from minisgl_plugin_llguidance.backend import _JSON_OPTIONS, LLGuidanceBackend

from minisgl_core.api import GrammarSpec, allocate_token_bitmask, allowed_tokens

INTEGER, STRING = {"type": "integer"}, {"type": "string"}
AGE = {"type": "object", "properties": {"age": INTEGER}}
NAME = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 3}}}
EXTRA = {"type": "object", "properties": {"a": INTEGER}, "additionalProperties": STRING}
PATTERN = {"type": "object", "patternProperties": {"^a": INTEGER}, "additionalProperties": STRING}
CONTROL = {"type": "object", "properties": {"a\nb": INTEGER, 'c"d': INTEGER}}


def _takes(backend: LLGuidanceBackend, schema: dict, text: str, *, batched: bool = False) -> bool:
    """Whether the backend's matcher takes ``text`` token by token and may end there."""
    matcher = backend.matcher(backend.compile(GrammarSpec("json_schema", json.dumps(schema))))
    for token in backend._tokenizer.tokenize_str(text):
        ok = backend.accept_tokens([matcher], [token])[0] if batched else matcher.accept_token(token)
        if not ok:
            return False
    return matcher._matcher.is_accepting()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("schema", "text"),
    [
        (AGE, '{"\\u0061ge":"old"}'),
        (NAME, '{"name":"ab","n\\u0061me":"toolong"}'),
        ({**EXTRA, "required": ["a"]}, '{"a":1,"\\u0061":"x"}'),
        (EXTRA, '{"\\u0061":"x"}'),
        (PATTERN, '{"\\u0061b":"x"}'),
        (CONTROL, '{"a\\u000ab":"x"}'),
        (CONTROL, '{"c\\u0022d":"x"}'),
        ({"type": "object", "properties": {"a/b": INTEGER}}, '{"a\\/b":"x"}'),
        ({"type": "array", "items": AGE}, '[{"age":1},{"\\u0061ge":"old"}]'),
    ],
)
@pytest.mark.parametrize("batched", [False, True])
def test_a_key_spelled_as_a_declared_name_follows_its_schema(backend, schema, text, batched):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(text), schema)
    assert not _takes(backend, schema, text, batched=batched)


@pytest.mark.parametrize(
    ("schema", "text"),
    [
        (EXTRA, '{"x\\"y":"q","z\\\\":"w","t\\tu":"v","\\u001f":"c"}'),
        (AGE, '{"age":1,"n\\nm":[1,"\\"\\t"]}'),
        (CONTROL, '{"a\\nb":1,"c\\"d":2}'),
        ({"type": "object", "properties": {"s": STRING}}, '{"s":"\\u001F\\u0008"}'),
    ],
)
def test_keys_that_need_an_escape_and_values_with_escapes_are_taken(backend, schema, text):
    jsonschema.validate(json.loads(text), schema)
    assert _takes(backend, schema, text)


def test_the_mask_forbids_what_would_spell_a_name_with_an_escape(backend):
    """The rows the engine samples from: after ``{"\\u00`` in a key, "6" (``\\u0061``) is masked,
    "1" (``\\u001f``, a control character) is not, nor "F" (one spelling: lower case); in a
    value nothing is."""
    tokenizer = backend._tokenizer
    vocab = backend.vocab_size

    def allowed_after(schema: dict, prefix: str, char: str) -> bool:
        matcher = backend.matcher(backend.compile(GrammarSpec("json_schema", json.dumps(schema))))
        assert all(matcher.accept_token(t) for t in tokenizer.tokenize_str(prefix))
        mask = allocate_token_bitmask(2, vocab)
        backend.fill_bitmasks([matcher], mask, [1])
        (token,) = tokenizer.tokenize_str(char)
        return bool(allowed_tokens(mask[1], vocab)[token])

    assert not allowed_after(EXTRA, '{"\\u00', "6")
    assert allowed_after(EXTRA, '{"\\u00', "1")
    assert not allowed_after(EXTRA, '{"\\', "/")
    assert allowed_after(EXTRA, '{"\\', "n")
    assert not allowed_after(EXTRA, '{"\\u001', "F")  # one spelling: \u001f
    assert allowed_after({"type": "object", "properties": {"s": STRING}}, '{"s":"\\u001', "F")


def test_llguidance_compares_keys_as_written(backend):
    """The witness: if this fails, llguidance reads keys' escapes itself; the guard may go."""
    import llguidance

    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(AGE), defaults=_JSON_OPTIONS)
    matcher = llguidance.LLMatcher(backend._tokenizer, grammar, log_level=0)
    assert matcher.consume_tokens(backend._tokenizer.tokenize_str('{"\\u0061ge":"old"}'))
    assert matcher.is_accepting()
