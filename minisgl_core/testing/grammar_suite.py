"""Conformance suite for grammar backends: subclass it, point it at a backend, run pytest.

    from minisgl_core.testing.grammar_suite import GrammarBackendSuite

    class TestMyGrammar(GrammarBackendSuite):
        backend_cls = "mine"   # a registered name, "module:Class", or the class itself

Every test builds the backend on a small byte-level BPE tokenizer (trained locally) whose model
vocabulary is padded past the tokenizer's, as real models' often are, and checks the contract of
:class:`~minisgl_core.api.GrammarBackend` and :class:`~minisgl_core.api.GrammarMatcher`: valid
text is accepted token by token, each token allowed by the bitmask filled just before it, and the
stop token ends it; tokens outside the bitmask are rejected; random walks through the bitmask end
in text that matches (JSON validated with ``jsonschema``), random schemas' walks too
(:func:`random_schema`), random regexes string by string as ECMA-262 reads them
(:func:`random_regex`); padded ids are never allowed; bad grammars raise GrammarError; compiling
is cached; ``reset`` starts over. Tests of grammar kinds the backend does not list in
``capabilities`` are skipped, not failed.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from minisgl_core.api import (
    GrammarBackend,
    GrammarError,
    GrammarMatcher,
    GrammarSpec,
    allocate_token_bitmask,
    allowed_tokens,
    bitmask_width,
)
from minisgl_core.testing.targets import resolve

#: ids past the tokenizer's vocabulary that the (pretend) model still has logits for
VOCAB_PADDING = 37
STOP_TOKEN = "<|im_end|>"

#: a nested schema with objects, arrays, enums, bounded numbers and required fields, small
#: enough that every walk through it ends
NESTED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "kind": {"enum": ["cat", "dog", "fish"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 3},
        "owner": {
            "type": "object",
            "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9}, "vip": {"type": "boolean"}},
            "required": ["id", "vip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "kind", "age", "owner"],
    "additionalProperties": False,
}


#: values for enum/const: strings with quotes, backslashes and non-ASCII, numbers, containers
_CHOICES: list[Any] = ["a", "b c", 'say "q"', "\\n", "é", 0, -3, 1, 2.5, 5, True, False, None, [1], {"k": 1}]
#: patterns, read as ECMA-262 reads them (:func:`ecma_validator`: Python's ``re``, jsonschema's,
#: reads ``.``, ``\s``, ``\d`` and ``\w`` otherwise): ranges, negated classes, class escapes in and
#: out of classes, which a backend must write as JSON text (a quote, a backslash, a tab escaped)
_PATTERNS = [
    "^[a-c]{1,3}$",
    "^[0-9]{2}-[0-9]$",
    "^(x|yy)$",
    "^[A-Z][a-z]?$",
    "^.{0,3}$",
    "^[^a-z]{1,2}$",
    "^é?[ab]$",
    "^[a\\S]{1,3}$",
    '^[\\D"]{1,2}$',
    "^\\S\\s?\\W?$",
    "^[\\s\\d]{1,2}$",
]
#: formats Python's jsonschema checks without extras
_FORMATS = ["date", "email", "ipv4", "ipv6", "uuid"]

#: string format -> (valid strings, strings a generator must not write): leap years, the days of
#: each month, the leap second (valid by RFC 3339 only at 23:59:60 UTC; Python's ``datetime``
#: refuses it), leading zeros of an IPv4 octet (octal to some readers; Python refuses them)
FORMAT_CASES: dict[str, tuple[list[str], list[str]]] = {
    "date": (
        ["2024-02-29", "2000-02-29", "2023-12-31", "2023-04-30", "0001-01-01", "1900-02-28"],
        ["2023-02-29", "1900-02-29", "2023-04-31", "2023-11-31", "2024-02-30", "0000-01-01", "2023-13-01"],
    ),
    "time": (
        ["23:59:59Z", "00:00:00.125+05:30", "12:30:00-08:00"],
        ["23:59:60Z", "24:00:00Z", "12:60:00Z", "12:00:00+24:00"],
    ),
    "date-time": (
        ["2024-02-29T23:59:59.5+01:00", "2023-01-31T00:00:00Z"],
        ["2023-02-29T00:00:00Z", "2023-06-31T00:00:00Z", "2023-01-01T10:00:60Z"],
    ),
    "ipv4": (["0.0.0.0", "255.255.255.255", "10.0.20.9"], ["1.02.3.4", "072.69.35.57", "256.1.1.1", "1.2.3"]),
}


def valid_format(name: str, text: str) -> bool:
    """Whether ``text`` is a valid ``format`` ``name`` by Python's own readers (``datetime``,
    ``ipaddress``), with the parts RFC 3339 requires (an offset on a time, ``T`` and ``Z`` read in
    upper case only)."""
    import datetime
    import ipaddress

    try:
        if name == "date":
            return len(text) == 10 and bool(datetime.date.fromisoformat(text))
        if name in ("time", "date-time"):
            shaped = re.fullmatch(r"([0-9-]{10}T)?[0-9:]{8}(\.[0-9]+)?(Z|[+-][0-9:]{5})", text)
            moment = datetime.datetime.fromisoformat(text if name == "date-time" else "2000-01-01T" + text)
            return (
                shaped is not None
                and bool(shaped.group(1)) == (name == "date-time")
                and moment.tzinfo is not None
            )
        if name == "ipv4":
            return bool(ipaddress.IPv4Address(text))
    except ValueError:
        return False
    raise ValueError(f"no reader for format {name!r}")


def random_schema(rng: random.Random) -> dict[str, Any]:
    """A random JSON schema, small and bounded (every string and array has a length limit, so that
    random walks end), mixing the keyword families backends got wrong: keywords beside ``anyOf``,
    ``oneOf``, ``allOf``, ``$ref``, ``enum`` and ``const`` (xgrammar dropped them), bounds of
    either kind, patterns with classes of any character (overlong UTF-8), ``prefixItems``,
    ``additionalProperties`` as a schema, ``patternProperties`` (whose patterns may match names in
    ``properties``), ``propertyNames``, ``items: false``, type lists. A backend may refuse any of
    it; what it accepts must hold."""
    defs: dict[str, Any] = {}
    schema = _random_subschema(rng, 0, defs)
    if defs:
        schema = {**schema, "$defs": defs}
    return schema


def _random_subschema(rng: random.Random, depth: int, defs: dict[str, Any]) -> dict[str, Any]:
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const", "typelist"]
    if depth < 2:
        kinds += ["array", "object", "anyOf", "oneOf", "allOf", "ref", "beside"]
    kind = rng.choice(kinds)
    if kind == "string":
        r = rng.random()
        if r < 0.25:
            return {"type": "string", "pattern": rng.choice(_PATTERNS)}
        if r < 0.35:
            return {"type": "string", "format": rng.choice(_FORMATS)}
        bounded: dict[str, Any] = {"type": "string", "maxLength": rng.randint(0, 4)}
        if rng.random() < 0.3:
            bounded["minLength"] = rng.randint(0, bounded["maxLength"])
        return bounded
    if kind in ("integer", "number"):
        numeric: dict[str, Any] = {"type": kind}
        for key, values in (
            ("minimum", [-20, -1.5, 0, 0.5, 3]),
            ("maximum", [4, 7.5, 300]),
            ("exclusiveMinimum", [-5, 0, 1.5]),
            ("exclusiveMaximum", [5, 100.25, 10**6]),
        ):
            if rng.random() < 0.35:
                numeric[key] = rng.choice(values)
        if kind == "integer" and rng.random() < 0.1 and not any(k in numeric for k in ("minimum", "maximum")):
            numeric["multipleOf"] = rng.choice([2, 3, 5])
        return numeric
    if kind in ("boolean", "null"):
        return {"type": kind}
    if kind == "enum":
        return {"enum": rng.sample(_CHOICES, rng.randint(1, 4))}
    if kind == "const":
        return {"const": rng.choice(_CHOICES)}
    if kind == "typelist":
        return {
            "type": rng.sample(["string", "integer", "null", "boolean", "number"], rng.randint(1, 3)),
            "maxLength": 3,
        }
    if kind == "array":
        array: dict[str, Any] = {
            "type": "array",
            "items": _random_subschema(rng, depth + 1, defs),
            "maxItems": rng.randint(0, 3),
        }
        if rng.random() < 0.4:
            array["minItems"] = rng.randint(0, array["maxItems"])
        if rng.random() < 0.25:
            array["prefixItems"] = [_random_subschema(rng, depth + 1, defs) for _ in range(rng.randint(1, 2))]
            if rng.random() < 0.4:
                array["items"] = False
        return array
    if kind == "object":
        names = ["a", "b c", 'q"', "é", "$x", "p"]
        properties = {
            f"{rng.choice(names)}{i}": _random_subschema(rng, depth + 1, defs)
            for i in range(rng.randint(0, 3))
        }
        obj: dict[str, Any] = {"type": "object", "properties": properties}
        required = [name for name in properties if rng.random() < 0.6]
        if required:
            obj["required"] = required
        r = rng.random()
        if r < 0.6:
            obj["additionalProperties"] = False
        elif r < 0.7:
            obj["additionalProperties"] = {"type": "integer", "minimum": 0, "maximum": 9}
            obj["maxProperties"] = len(properties) + 1
        r = rng.random()
        if r < 0.25:  # names of properties may match the patterns: both schemas apply
            obj["patternProperties"] = {
                rng.choice(["^a[0-9]?$", "^p[0-9]$", "^[xy]$"]): _random_subschema(rng, depth + 1, defs)
            }
        elif r < 0.35:
            obj["propertyNames"] = rng.choice([{"maxLength": 2}, {"pattern": "^[a-p][0-9]$"}])
        return obj
    if kind in ("anyOf", "oneOf", "allOf"):
        return {kind: [_random_subschema(rng, depth + 1, defs) for _ in range(rng.randint(1, 3))]}
    if kind == "ref":
        name = f"d{len(defs)}"
        defs[name] = {}  # (taken before the schema is made, so nested references get other names)
        defs[name] = _random_subschema(rng, depth + 1, defs)
        ref: dict[str, Any] = {"$ref": f"#/$defs/{name}"}
        if rng.random() < 0.3:
            ref["description"] = "an annotation, which asserts nothing"
        return ref
    # kind == "beside": a keyword a backend must not drop, beside one it compiles on its own
    inner = _random_subschema(rng, depth + 1, defs)
    return rng.choice(
        [
            {"anyOf": [inner, {"type": "integer", "minimum": 0, "maximum": 9}], "minimum": 3},
            {"anyOf": [inner, {"type": "null"}], "type": rng.choice(["string", "integer", "null"])},
            {"allOf": [inner], "maxLength": 1},
            {"enum": rng.sample(_CHOICES, 4), "type": rng.choice(["string", "integer", "number"])},
            {"enum": [1, 2, 5, 7.5], "maximum": rng.choice([2, 5])},
            {"const": rng.choice(_CHOICES), "type": "string"},
        ]
    )


#: atoms of :func:`random_regex`: literals of one to three UTF-8 bytes, escapes of every form,
#: classes with ranges, escapes, negation and class escapes, ``.`` (thrice: the atom backends
#: read otherwise most)
_REGEX_ATOMS = [
    "a", "é", "0", "A", " ", "ຐ", "-", "\\x41", "\\u00e9", "\\u0ec0", "\\.", "\\t", "\\n", "\\\\", "\\-",
    "[a0]", "[^a]", "[a-c0]", "[\\d\\u00e9]", "[\\x30-\\x39]", "[^\\u00e9\\n]", "[\\w-]", "[^\\d\\s]", "[.]",
    "[\\]a]", "[a^]", "[-a]", "[\\s\\-]", "\\d", "\\w", "\\W", "\\D", "\\s", "\\S", ".", ".", ".",
    '"', '[^"]', '[a"\\\\]', "\\x01", "[\\x00-\\x1f]", "[a\\S]", "[\\W\\d]", "[^\\s\\d]",
]  # fmt: skip
#: the characters the string-pattern check builds its strings from: what JSON must escape too
_PATTERN_ALPHABET = 'a0é \t\n"\\\x01'
#: the characters :meth:`GrammarBackendSuite.test_random_regexes_match_as_ecma_262_reads_them`
#: builds its strings from: what the atoms name, line terminators, a white space ``re`` reads
#: otherwise (U+3000), a ``]``
_REGEX_ALPHABET = "aA0é \tຐ\n\r\u2028\u3000-]"
_REGEX_QUANTIFIERS = ["", "", "", "?", "*", "+", "{2}", "{0,2}", "{1,}", "*?", "+?", "??", "{1,2}?"]
#: ECMA-262's white space and line terminators (what ``\s`` matches), as class members for ``re``
_ECMA_SPACE = "\t\n\x0b\x0c\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
#: the rest (what ``\\S`` matches), as class members, so that it can stand beside others in a class
_ECMA_NON_SPACE = (
    "\x00-\x08\x0e-\x1f\x21-\x9f\xa1-\u167f\u1681-\u1fff\u200b-\u2027\u202a-\u202e\u2030-\u205e"
    "\u2060-\u2fff\u3001-\ufefe\uff00-\U0010ffff"
)


def ecma_validator(schema: Any) -> Any:
    """A ``jsonschema`` validator of ``schema`` (Draft 2020-12, formats checked) whose ``pattern``
    is read as ECMA-262 reads it (:func:`ecma_reference`), as JSON Schema says: Python's ``re``
    takes a carriage return for ``.``, Unicode digits for ``\\d``, and another white space."""
    import jsonschema

    def pattern(validator: Any, regex: str, instance: Any, _schema: Any) -> Any:
        if validator.is_type(instance, "string") and not ecma_reference(regex).search(instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {regex!r} (ECMA-262)")

    cls = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": pattern})
    return cls(schema, format_checker=jsonschema.FormatChecker())


def random_regex(rng: random.Random, depth: int = 0) -> str:
    """A random ECMA-262 regex of one to three quantified atoms (:data:`_REGEX_ATOMS`, groups of
    alternatives, lazy quantifiers too), for :func:`ecma_reference` to read."""
    parts = []
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.2 and depth < 2:
            alternatives = "|".join(random_regex(rng, depth + 1) for _ in range(rng.randint(1, 3)))
            atom = rng.choice(["(", "(?:"]) + alternatives + ")"
        else:
            atom = rng.choice(_REGEX_ATOMS)
        parts.append(atom + rng.choice(_REGEX_QUANTIFIERS))
    return "".join(parts)


def ecma_reference(pattern: str) -> re.Pattern[str]:
    """``pattern`` (of :func:`random_regex`'s atoms) compiled by Python's ``re`` so that it matches
    what ECMA-262 matches: ``.`` no line terminator (``re``'s takes all but a line feed), ``\\s``
    and ``\\S`` ECMA-262's white space (``re``'s is ASCII or Unicode's, neither the same),
    ``\\d`` and ``\\w`` ASCII."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            escape = pattern[i : i + 2]
            if escape == "\\s":
                out.append(_ECMA_SPACE if in_class else f"[{_ECMA_SPACE}]")
            elif escape == "\\S":
                out.append(_ECMA_NON_SPACE if in_class else f"[^{_ECMA_SPACE}]")
            else:
                out.append(escape)
            i += 2
            continue
        if char == "[" and not in_class:
            in_class = True
            out.append(char)
            i += 1
            if pattern.startswith("^", i):
                out.append("^")
                i += 1
            if pattern.startswith("]", i):  # a "]" first in a class (after any "^") is a literal one
                out.append("\\]")
                i += 1
            continue
        if char == "]" and in_class:
            in_class = False
        out.append("[^\\n\\r\\u2028\\u2029]" if char == "." and not in_class else char)
        i += 1
    return re.compile("".join(out), re.ASCII)


def walk(
    matcher: GrammarMatcher, vocab_size: int, stop_id: int, rng: random.Random, max_steps: int
) -> list[int]:
    """Tokens drawn at random among those the bitmask allows, until the matcher terminates.

    Prefers ending: once the stop token is allowed it is taken half the time, so walks stay short."""
    tokens: list[int] = []
    mask = allocate_token_bitmask(1, vocab_size)
    for _ in range(max_steps):
        if matcher.is_terminated():
            return tokens
        mask.fill_(0)
        matcher.fill_bitmask(mask, 0)
        allowed = allowed_tokens(mask[0], vocab_size).nonzero().flatten().tolist()
        assert allowed, "the bitmask allows no token at all before the grammar ended"
        token = stop_id if stop_id in allowed and rng.random() < 0.5 else rng.choice(allowed)
        assert matcher.accept_token(token), f"token {token} was in the bitmask but accept_token refused it"
        tokens.append(token)
    raise AssertionError(f"the walk did not end within {max_steps} tokens: {tokens}")


class GrammarBackendSuite:
    #: the backend: its class, "package.module:Class", or a name registered by an installed plugin
    backend_cls: ClassVar[type[GrammarBackend] | str | None] = None
    #: random walks per grammar
    walks: ClassVar[int] = 20
    #: random schemas (:func:`random_schema`) walked twice each
    random_schemas: ClassVar[int] = 60
    #: random regexes (:func:`random_regex`) checked string by string and walked
    random_regexes: ClassVar[int] = 40
    #: random regexes checked as a string's ``pattern``, string by string
    random_patterns: ClassVar[int] = 25

    # ------------------------------------------------------------------ fixtures

    @pytest.fixture(scope="class")
    @classmethod
    def backend_class(cls) -> type[GrammarBackend]:
        if cls.backend_cls is None:
            pytest.skip("set backend_cls on the suite subclass")
        backend_cls = resolve("grammars", cls.backend_cls)
        assert issubclass(backend_cls, GrammarBackend), f"{backend_cls!r} is not a GrammarBackend subclass"
        reason = backend_cls.availability()
        assert reason is None or (isinstance(reason, str) and reason), (
            "availability() must be None or a reason"
        )
        if reason is not None:
            pytest.skip(f"{backend_cls.__name__} is unavailable here: {reason}")
        return backend_cls

    @pytest.fixture(scope="class")
    @classmethod
    def tokenizer(cls, tmp_path_factory: pytest.TempPathFactory) -> Any:
        from transformers import AutoTokenizer

        from minisgl_core.demo.factories import train_tokenizer

        directory: Path = train_tokenizer(tmp_path_factory.mktemp("grammar-tokenizer"), vocab_size=512)
        return AutoTokenizer.from_pretrained(str(directory))

    @pytest.fixture(scope="class")
    @classmethod
    def vocab_size(cls, tokenizer: Any) -> int:
        return len(tokenizer) + VOCAB_PADDING

    @pytest.fixture(scope="class")
    @classmethod
    def stop_id(cls, tokenizer: Any) -> int:
        return tokenizer.convert_tokens_to_ids(STOP_TOKEN)

    @pytest.fixture(scope="class")
    @classmethod
    def backend(
        cls, backend_class: type[GrammarBackend], tokenizer: Any, vocab_size: int, stop_id: int
    ) -> GrammarBackend:
        return backend_class(tokenizer, vocab_size=vocab_size, stop_token_ids=[stop_id])

    def need(self, backend: GrammarBackend, kind: str) -> None:
        if kind not in backend.capabilities:
            pytest.skip(f"{type(backend).__name__} does not declare {kind!r}")

    def matcher(self, backend: GrammarBackend, kind: str, value: str) -> GrammarMatcher:
        self.need(backend, kind)
        return backend.matcher(backend.compile(GrammarSpec(kind, value)))  # type: ignore[arg-type]

    def feed(self, matcher: GrammarMatcher, tokenizer: Any, text: str, vocab_size: int) -> None:
        """Accept ``text`` token by token, checking each token was in the bitmask filled before it."""
        mask = allocate_token_bitmask(1, vocab_size)
        for token in tokenizer.encode(text, add_special_tokens=False):
            mask.fill_(0)
            matcher.fill_bitmask(mask, 0)
            assert allowed_tokens(mask[0], vocab_size)[token], (
                f"token {token} of {text!r} is not in the bitmask"
            )
            assert matcher.accept_token(token), f"token {token} of {text!r} was refused"

    def finish(self, matcher: GrammarMatcher, stop_id: int, vocab_size: int) -> None:
        """Whatever is accepted so far is a complete output: the stop token ends it (or it ended already)."""
        if matcher.is_terminated():
            return
        mask = allocate_token_bitmask(1, vocab_size)
        mask.fill_(0)
        matcher.fill_bitmask(mask, 0)
        assert allowed_tokens(mask[0], vocab_size)[stop_id], (
            "the stop token is not allowed after a complete output"
        )
        assert matcher.accept_token(stop_id)
        assert matcher.is_terminated()

    def takes(
        self, matcher: GrammarMatcher, tokenizer: Any, text: str, stop_id: int, vocab_size: int
    ) -> bool:
        """Whether ``text`` is a complete output: each token in the bitmask filled before it and
        accepted, then the stop token allowed (or the grammar ended)."""
        mask = allocate_token_bitmask(1, vocab_size)
        for token in [*tokenizer.encode(text, add_special_tokens=False), stop_id]:
            if matcher.is_terminated():
                return token == stop_id
            mask.fill_(0)
            matcher.fill_bitmask(mask, 0)
            if not allowed_tokens(mask[0], vocab_size)[token] or not matcher.accept_token(token):
                return False
        return True

    def decoded(self, tokenizer: Any, tokens: list[int], stop_id: int) -> str:
        return tokenizer.decode([t for t in tokens if t != stop_id], skip_special_tokens=False)

    def ended_walks(
        self,
        backend: GrammarBackend,
        compiled: Any,
        tokenizer: Any,
        vocab_size: int,
        stop_id: int,
        rng: random.Random,
        walks: int,
        max_steps: int,
    ) -> list[str]:
        """The texts of ``walks`` random walks through ``compiled`` (:func:`walk`), less those that
        did not end within ``max_steps`` tokens (a long string or run: no verdict)."""
        texts = []
        for _ in range(walks):
            try:
                tokens = walk(backend.matcher(compiled), vocab_size, stop_id, rng, max_steps=max_steps)
            except AssertionError as exc:
                if "did not end" in str(exc):
                    continue
                raise
            texts.append(self.decoded(tokenizer, tokens, stop_id))
        return texts

    # ------------------------------------------------------------------ the contract

    def test_declares_known_capabilities(self, backend_class: type[GrammarBackend]) -> None:
        from minisgl_core.api.grammar import GRAMMAR_KINDS

        assert backend_class.capabilities, "declare the grammar kinds the backend compiles"
        assert set(backend_class.capabilities) <= set(GRAMMAR_KINDS), backend_class.capabilities

    def test_json_schema_text_is_accepted_and_ends(
        self, backend: GrammarBackend, tokenizer: Any, vocab_size: int, stop_id: int
    ) -> None:
        m = self.matcher(backend, "json_schema", json.dumps(NESTED_SCHEMA))
        value = {"name": "Rex", "kind": "dog", "age": 7, "tags": ["a", "bc"], "owner": {"id": 3, "vip": True}}
        self.feed(m, tokenizer, json.dumps(value, separators=(",", ":")), vocab_size)
        self.finish(m, stop_id, vocab_size)

    def test_the_schema_true_takes_any_json_value(
        self, backend: GrammarBackend, tokenizer: Any, vocab_size: int, stop_id: int
    ) -> None:
        """JSON Schema's ``true`` (as ``{}``) is any value; OpenAI clients send it for "no
        constraint". llguidance takes objects only, so it needs mapping."""
        self.need(backend, "json_schema")
        for text in ('{"a":[1,"x",null]}', "5", '"s"', "[true]"):
            assert self.takes(
                self.matcher(backend, "json_schema", "true"), tokenizer, text, stop_id, vocab_size
            ), text
        assert not self.takes(
            self.matcher(backend, "json_schema", "true"), tokenizer, "nope", stop_id, vocab_size
        )

    def test_random_walks_validate_against_the_schema(
        self, backend: GrammarBackend, tokenizer: Any, vocab_size: int, stop_id: int
    ) -> None:
        jsonschema = pytest.importorskip("jsonschema")
        self.need(backend, "json_schema")
        compiled = backend.compile(GrammarSpec("json_schema", json.dumps(NESTED_SCHEMA)))
        rng = random.Random(0)
        for _ in range(self.walks):
            tokens = walk(backend.matcher(compiled), vocab_size, stop_id, rng, max_steps=400)
            jsonschema.validate(json.loads(self.decoded(tokenizer, tokens, stop_id)), NESTED_SCHEMA)

    def test_random_schemas_walk_to_values_that_validate(
        self, backend: GrammarBackend, tokenizer: Any, vocab_size: int, stop_id: int
    ) -> None:
        """Whatever random schema the backend takes (:func:`random_schema`; it may refuse any),
        random walks through its bitmask end in JSON that ``jsonschema`` finds valid (patterns read
        as ECMA-262 reads them, :func:`ecma_validator`): a keyword compiled but not enforced fails
        here (a probe of this kind found xgrammar dropping what is beside ``anyOf`` and letting
        overlong UTF-8 through ``.``, 2026-11-30; a raw quote through ``[a\\S]``, 2026-12-01)."""
        pytest.importorskip("jsonschema")
        self.need(backend, "json_schema")
        rng = random.Random(20261130)
        walked = 0
        for _ in range(self.random_schemas):
            schema = random_schema(rng)
            try:
                compiled = backend.compile(GrammarSpec("json_schema", json.dumps(schema)))
            except GrammarError:
                continue
            validator = ecma_validator(schema)
            for text in self.ended_walks(backend, compiled, tokenizer, vocab_size, stop_id, rng, 2, 300):
                errors = [e.message for e in validator.iter_errors(json.loads(text))]
                assert not errors, f"{json.dumps(schema)} gave {text!r}: {errors[0]}"
                walked += 1
        assert walked >= self.random_schemas // 2, f"only {walked} walks ended in schemas the backend took"

    @staticmethod
    def compiled_randoms(
        backend: GrammarBackend,
        rng: random.Random,
        count: int,
        spec: Callable[[str], GrammarSpec],
        wrap: str = "{}",
    ) -> Iterator[tuple[str, re.Pattern[str], Any]]:
        """``count`` random regexes (:func:`random_regex`, each put in ``wrap``) as ``(pattern, its
        ECMA-262 reading, the backend's grammar of spec(pattern))``, those the backend refuses
        skipped; at least half of them must compile."""
        compiled_count = 0
        for _ in range(count):
            pattern = wrap.format(random_regex(rng))
            reference = ecma_reference(pattern)
            try:
                compiled = backend.compile(spec(pattern))
            except GrammarError:
                continue
            compiled_count += 1
            yield pattern, reference, compiled
        assert compiled_count >= count // 2, f"only {compiled_count} of {count} random regexes compiled"

    def test_random_regexes_match_as_ecma_262_reads_them(
        self, backend: GrammarBackend, tokenizer: Any, vocab_size: int, stop_id: int
    ) -> None:
        """Whatever random regex the backend takes (:func:`random_regex`), it takes exactly the
        strings of up to two characters over letters, digits, white space, line terminators and
        characters of two and three UTF-8 bytes that ECMA-262 matches (:func:`ecma_reference`),
        and random walks end in text it matches: xgrammar's ``.`` took line breaks, llguidance's a
        carriage return and U+2028 (a probe of this kind, 2026-12-01)."""
        self.need(backend, "regex")
        strings = [""] + [a + b for a in _REGEX_ALPHABET for b in ["", *_REGEX_ALPHABET]]
        rng = random.Random(20261201)
        wrong: list[str] = []
        randoms = self.compiled_randoms(backend, rng, self.random_regexes, lambda p: GrammarSpec("regex", p))
        for pattern, reference, compiled in randoms:
            missed = [
                s
                for s in strings
                if self.takes(backend.matcher(compiled), tokenizer, s, stop_id, vocab_size)
                != bool(reference.fullmatch(s))
            ]
            if missed:
                wrong.append(f"{pattern!r} on {missed[:3]} ({len(missed)} strings)")
            for text in self.ended_walks(backend, compiled, tokenizer, vocab_size, stop_id, rng, 3, 60):
                if not reference.fullmatch(text):
                    wrong.append(f"{pattern!r} walked to {text!r}")
        assert not wrong, "\n".join(wrong[:10])

    def test_random_patterns_take_the_json_strings_ecma_262_matches(
        self, backend: GrammarBackend, tokenizer: Any, vocab_size: int, stop_id: int
    ) -> None:
        """A string schema with a random ``pattern`` (:func:`random_regex`) takes the JSON text of
        no value of up to two characters (quotes, backslashes, control characters among them,
        written as ``json.dumps`` writes them) that the pattern does not match as ECMA-262 reads
        it, and of every such value without a character JSON must escape that it does match (a
        backend may leave those characters out where a class or ``.`` allows them: a completeness
        limit, not wrong output), and random walks end in a JSON string the pattern matches.
        xgrammar let a raw quote through ``[a\\S]``, llguidance an escaped one through ``[^"]`` (a
        probe of this kind, 2026-12-01)."""
        self.need(backend, "json_schema")
        values = [""] + [a + b for a in _PATTERN_ALPHABET for b in ["", *_PATTERN_ALPHABET]]
        rng = random.Random(20261202)
        wrong: list[str] = []

        def schema(pattern: str) -> GrammarSpec:
            return GrammarSpec("json_schema", json.dumps({"type": "string", "pattern": pattern}))

        randoms = self.compiled_randoms(backend, rng, self.random_patterns, schema, wrap="^(?:{})$")
        for pattern, reference, compiled in randoms:
            for value in values:
                text = json.dumps(value, ensure_ascii=False)
                taken = self.takes(backend.matcher(compiled), tokenizer, text, stop_id, vocab_size)
                matches = bool(reference.fullmatch(value))
                plain = all(c >= " " and c not in '"\\' for c in value)
                if (taken and not matches) or (matches and plain and not taken):
                    wrong.append(f"{pattern!r} {'took' if taken else 'refused'} {text}")
            # walks: a raw quote or backslash mid-string is no canonical text
            for text in self.ended_walks(backend, compiled, tokenizer, vocab_size, stop_id, rng, 4, 60):
                try:
                    value = json.loads(text)
                except ValueError:
                    value = None
                if not isinstance(value, str) or not reference.fullmatch(value):
                    wrong.append(f"{pattern!r} walked to {text!r}")
        assert not wrong, "\n".join(wrong[:10])

    @pytest.mark.parametrize(
        ("kind", "value", "begun"),
        [
            ("regex", ".+", ""),
            ("regex", "a[^b]+", "a"),
            ("ebnf", 'root ::= "x" [^\\n]+', "x"),
            ("regex", "(b|.)+", ""),
        ],
    )
    def test_special_tokens_are_not_text(
        self,
        backend: GrammarBackend,
        tokenizer: Any,
        vocab_size: int,
        stop_id: int,
        kind: str,
        value: str,
        begun: str,
    ) -> None:
        """A special token is not the characters it is spelled with: where the grammar needs one
        more character, no special token is allowed (the stop token included; xgrammar read
        ``<|im_end|>`` as ten characters that ``.+`` matches, so an answer to ``.+`` could end
        empty, 2026-12-01); once it may end, the stop token is, and no other special one."""
        m = self.matcher(backend, kind, value)
        if begun:
            self.feed(m, tokenizer, begun, vocab_size)
        special = sorted(
            {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
            | set(tokenizer.all_special_ids)
        )
        assert stop_id in special and len(special) > 1
        mask = allocate_token_bitmask(1, vocab_size)
        m.fill_bitmask(mask, 0)
        allowed = allowed_tokens(mask[0], vocab_size)
        assert [i for i in special if allowed[i]] == [], "special tokens allowed before the grammar can end"
        self.feed(m, tokenizer, "c", vocab_size)
        mask.fill_(0)
        m.fill_bitmask(mask, 0)
        allowed = allowed_tokens(mask[0], vocab_size)
        assert [i for i in special if allowed[i]] == [stop_id]

    @pytest.mark.parametrize("name", sorted(FORMAT_CASES))
    def test_string_formats_take_valid_strings_only(
        self, backend: GrammarBackend, tokenizer: Any, vocab_size: int, stop_id: int, name: str
    ) -> None:
        """``{"type": "string", "format": name}`` takes each valid string of :data:`FORMAT_CASES`
        and none of the invalid ones, and random walks through it end in valid strings (Python's
        ``datetime`` and ``ipaddress`` judge): xgrammar wrote ``date`` as any day up to 31 of any
        month, ``ipv4`` with leading zeros; both libraries took February 29 of 2023 and second 60
        (a probe, 2026-12-01). A backend may refuse the format instead."""
        self.need(backend, "json_schema")
        try:
            compiled = backend.compile(
                GrammarSpec("json_schema", json.dumps({"type": "string", "format": name}))
            )
        except GrammarError:
            pytest.skip(f"{type(backend).__name__} refuses format {name!r}")
        valid, invalid = FORMAT_CASES[name]
        assert all(valid_format(name, text) for text in valid) and not any(
            valid_format(name, t) for t in invalid
        )
        taken = {
            t: self.takes(backend.matcher(compiled), tokenizer, json.dumps(t), stop_id, vocab_size)
            for t in valid + invalid
        }
        assert [t for t in valid if not taken[t]] == [], "valid strings refused"
        assert [t for t in invalid if taken[t]] == [], "invalid strings taken"
        rng = random.Random(20261201)
        for _ in range(3 * self.walks):
            text = json.loads(
                self.decoded(
                    tokenizer, walk(backend.matcher(compiled), vocab_size, stop_id, rng, 80), stop_id
                )
            )
            assert valid_format(name, text), f"a walk through format {name!r} gave {text!r}"

    @pytest.mark.parametrize(
        ("pattern", "value"),
        [
            ('^"$', '"'),
            ("^a\\\\b$", "a\\b"),
            ("^x\\ty$", "x\ty"),
            ("^[\\x00-\\x02]z$", "\x01z"),
            ("^(\\u0022|\\n){2}$", '"\n'),
            ('^[\\\\"]+$', '\\"'),
        ],
    )
    def test_patterns_naming_characters_json_escapes(
        self, backend: GrammarBackend, tokenizer: Any, vocab_size: int, stop_id: int, pattern: str, value: str
    ) -> None:
        """A string ``pattern`` that names a character JSON text must escape (a quote, a backslash,
        a control character) gives valid JSON whose string matches it: xgrammar wrote ``^"$`` as
        three quotes, ``^a\\\\b$`` as ``"a\\b"`` (a backspace) and ``\\t`` as a raw tab, finished
        as "stop" (a probe, 2026-12-01). A backend may refuse the pattern, or write fewer of the
        strings it matches, but never text that is not JSON or a string it does not match."""
        self.need(backend, "json_schema")
        assert re.fullmatch(pattern[1:-1], value)
        schema = {"type": "string", "pattern": pattern}
        try:
            compiled = backend.compile(GrammarSpec("json_schema", json.dumps(schema)))
        except GrammarError:
            pytest.skip(f"{type(backend).__name__} refuses the pattern {pattern!r}")
        assert self.takes(backend.matcher(compiled), tokenizer, json.dumps(value), stop_id, vocab_size)
        rng = random.Random(20261201)
        for _ in range(self.walks):
            text = self.decoded(
                tokenizer, walk(backend.matcher(compiled), vocab_size, stop_id, rng, 40), stop_id
            )
            assert re.fullmatch(pattern[1:-1], json.loads(text)), f"{pattern!r} gave {text!r}"

    def test_json_object_walks_give_objects(
        self, backend: GrammarBackend, tokenizer: Any, vocab_size: int, stop_id: int
    ) -> None:
        self.need(backend, "json_object")
        compiled = backend.compile(GrammarSpec("json_object", ""))
        m = backend.matcher(compiled)
        self.feed(m, tokenizer, '{"a":[1,{"b":null}],"c":"x"}', vocab_size)
        self.finish(m, stop_id, vocab_size)
        bad = backend.matcher(compiled)
        assert not bad.accept_token(tokenizer.encode("[", add_special_tokens=False)[0]), (
            "a JSON array is not an object"
        )

    def test_regex(self, backend: GrammarBackend, tokenizer: Any, vocab_size: int, stop_id: int) -> None:
        pattern = r"[a-c]{2,4}-[0-9]{3}"
        m = self.matcher(backend, "regex", pattern)
        self.feed(m, tokenizer, "abca-123", vocab_size)
        self.finish(m, stop_id, vocab_size)
        compiled = backend.compile(GrammarSpec("regex", pattern))
        rng = random.Random(1)
        for _ in range(self.walks):
            text = self.decoded(
                tokenizer, walk(backend.matcher(compiled), vocab_size, stop_id, rng, 50), stop_id
            )
            assert re.fullmatch(pattern, text), text

    def test_choice(self, backend: GrammarBackend, tokenizer: Any, vocab_size: int, stop_id: int) -> None:
        options = ["yes", "no", "maybe so", 'say "hi"']
        self.need(backend, "choice")
        compiled = backend.compile(GrammarSpec("choice", json.dumps(options)))
        rng = random.Random(2)
        seen = set()
        for _ in range(self.walks):
            text = self.decoded(
                tokenizer, walk(backend.matcher(compiled), vocab_size, stop_id, rng, 30), stop_id
            )
            assert text in options, text
            seen.add(text)
        assert len(seen) > 1, "random walks always picked the same choice"

    def test_ebnf(self, backend: GrammarBackend, tokenizer: Any, vocab_size: int, stop_id: int) -> None:
        grammar = 'root ::= "(" item ("," item)* ")"\nitem ::= [0-9] | "x"'
        m = self.matcher(backend, "ebnf", grammar)
        self.feed(m, tokenizer, "(1,x,7)", vocab_size)
        self.finish(m, stop_id, vocab_size)
        rng = random.Random(3)
        compiled = backend.compile(GrammarSpec("ebnf", grammar))
        for _ in range(self.walks):
            text = self.decoded(
                tokenizer, walk(backend.matcher(compiled), vocab_size, stop_id, rng, 60), stop_id
            )
            assert re.fullmatch(r"\(([0-9x])(,[0-9x])*\)", text), text

    def test_rejects_tokens_outside_the_bitmask(
        self, backend: GrammarBackend, tokenizer: Any, vocab_size: int
    ) -> None:
        m = self.matcher(backend, "regex", "[0-9]+")
        mask = allocate_token_bitmask(1, vocab_size)
        m.fill_bitmask(mask, 0)
        allowed = allowed_tokens(mask[0], vocab_size)
        assert 0 < int(allowed.sum()) < vocab_size
        letter = tokenizer.encode("a", add_special_tokens=False)[0]
        assert not allowed[letter]
        assert not m.accept_token(letter)

    def test_padded_ids_are_never_allowed(
        self, backend: GrammarBackend, tokenizer: Any, vocab_size: int
    ) -> None:
        kind, value = ("json_object", "") if "json_object" in backend.capabilities else ("regex", ".*")
        m = self.matcher(backend, kind, value)
        mask = allocate_token_bitmask(2, vocab_size)
        assert mask.shape == (2, bitmask_width(vocab_size)) and mask.dtype == torch.int32
        m.fill_bitmask(mask, 1)
        allowed = allowed_tokens(mask[1], vocab_size)
        assert not allowed[len(tokenizer) :].any(), "ids past the tokenizer's vocabulary were allowed"
        assert (mask[0] == -1).all(), "filling row 1 touched row 0"

    def test_reset_starts_over(self, backend: GrammarBackend, tokenizer: Any, vocab_size: int) -> None:
        m = self.matcher(backend, "regex", "ab[0-9]")
        first = allocate_token_bitmask(1, vocab_size)
        m.fill_bitmask(first, 0)
        self.feed(m, tokenizer, "ab", vocab_size)
        again = allocate_token_bitmask(1, vocab_size)
        m.reset()
        m.fill_bitmask(again, 0)
        assert torch.equal(first, again)

    def test_batched_fill_and_accept_match_one_by_one(
        self, backend: GrammarBackend, vocab_size: int, stop_id: int
    ) -> None:
        """``fill_bitmasks`` / ``accept_tokens`` (one call for many matchers, as the engine makes
        each step) give what ``fill_bitmask`` / ``accept_token`` give matcher by matcher: twin
        matchers walk the same random tokens, one set batched, the other one by one, into
        scattered rows (rows not listed stay untouched), with 1 and 3 threads, for several grammars
        at once; a token outside the mask is refused in the batch too."""
        specs = [
            GrammarSpec("json_schema", json.dumps(NESTED_SCHEMA)),
            GrammarSpec("regex", "[a-c]{2,9}-[0-9]{1,6}"),
        ]
        specs = [s for s in specs if s.kind in backend.capabilities]
        if not specs:
            pytest.skip("neither json_schema nor regex is declared")
        compiled = [backend.compile(s) for s in specs]
        threads = backend.fill_threads
        try:
            for fill_threads in (1, 3):
                backend.fill_threads = fill_threads
                rng = random.Random(fill_threads)
                n = 7
                batched = [backend.matcher(compiled[i % len(compiled)]) for i in range(n)]
                single = [backend.matcher(compiled[i % len(compiled)]) for i in range(n)]
                for _ in range(24):
                    live = [i for i in range(n) if not single[i].is_terminated()]
                    if not live:
                        break
                    rows = [2 * i + 1 for i in live]  # scattered, in a bigger mask
                    got = allocate_token_bitmask(2 * n + 1, vocab_size)
                    backend.fill_bitmasks([batched[i] for i in live], got, rows)
                    want = allocate_token_bitmask(2 * n + 1, vocab_size)
                    for i, row in zip(live, rows):
                        single[i].fill_bitmask(want, row)
                    assert torch.equal(got, want), "fill_bitmasks differs from fill_bitmask one by one"
                    tokens = []
                    for row in rows:
                        allowed = allowed_tokens(got[row], vocab_size).nonzero().flatten().tolist()
                        tokens.append(
                            stop_id if stop_id in allowed and rng.random() < 0.1 else rng.choice(allowed)
                        )
                    accepted = backend.accept_tokens([batched[i] for i in live], tokens)
                    assert accepted == [True] * len(live), "accept_tokens refused a token its mask allowed"
                    assert all(single[i].accept_token(t) for i, t in zip(live, tokens))
                    assert [batched[i].is_terminated() for i in live] == [
                        single[i].is_terminated() for i in live
                    ]
                # a token outside the mask: refused in the batch as one by one
                fresh = [backend.matcher(compiled[-1]), backend.matcher(compiled[-1])]
                mask = allocate_token_bitmask(2, vocab_size)
                backend.fill_bitmasks(fresh, mask, [0, 1])
                forbidden = int((~allowed_tokens(mask[0], vocab_size)).nonzero()[0])
                allowed = int(allowed_tokens(mask[1], vocab_size).nonzero()[0])
                assert backend.accept_tokens(fresh, [forbidden, allowed]) == [False, True]
        finally:
            backend.fill_threads = threads

    def test_compiles_are_cached(self, backend: GrammarBackend) -> None:
        self.need(backend, "regex")
        spec = GrammarSpec("regex", "cache-me-[0-9]")
        before = backend.compiles
        first = backend.compile(spec)
        assert backend.compile(GrammarSpec("regex", "cache-me-[0-9]")) is first
        assert backend.compiles == before + 1

    @pytest.mark.parametrize(
        "kind, value",
        [
            ("json_schema", "{not json"),
            ("json_schema", '{"type": "no-such-type"}'),
            ("json_schema", "false"),  # no value at all
            ("json_schema", "5"),  # a schema is an object or a boolean
            ("regex", "(unclosed"),
            ("choice", "[]"),
            ("choice", '["a", 1]'),
            ("ebnf", "root ::= missing_rule"),
        ],
    )
    def test_bad_grammars_raise_grammar_error(self, backend: GrammarBackend, kind: str, value: str) -> None:
        self.need(backend, kind)
        spec = GrammarSpec(kind, value)  # type: ignore[arg-type]
        with pytest.raises(GrammarError) as err:
            backend.check(spec)
            backend.compile(spec)
        assert str(err.value), "the error must say what is wrong"

    def test_undeclared_kinds_raise_grammar_error(self, backend: GrammarBackend) -> None:
        from minisgl_core.api.grammar import GRAMMAR_KINDS

        missing = [k for k in GRAMMAR_KINDS if k not in backend.capabilities]
        if not missing:
            pytest.skip("the backend declares every kind")
        with pytest.raises(GrammarError, match=missing[0]):
            backend.compile(GrammarSpec(missing[0], "{}"))  # type: ignore[arg-type]
