"""The xgrammar grammar backend: every grammar kind, compiled for the served tokenizer."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from minisgl_core.api import GrammarBackend, GrammarError, GrammarMatcher, GrammarSpec, bitmask_width

#: the largest grammar text (characters) admission compiles against the 256 bytes to see that some
#: text can begin it: 8,192 characters of JSON schema are about 300 properties, 0.05 s
BYTE_CHECK_MAX_CHARS = 8192

#: threads xgrammar compiles one grammar with (it splits the vocabulary among them)
_COMPILE_THREADS = int(os.environ.get("MINISGL_XGRAMMAR_THREADS", "8"))

#: any JSON object, compact (no whitespace) and strict (no raw control characters in strings).
#: xgrammar's own ``{"type": "object"}`` writes ", " between array items whatever the separators.
JSON_OBJECT_EBNF = r"""
root ::= object
value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" "}" | "{" member ("," member)* "}"
member ::= string ":" value
array ::= "[" "]" | "[" value ("," value)* "]"
string ::= "\"" char* "\""
char ::= [^"\\\0-\x1f] | "\\" escape
escape ::= ["\\/bfnrt] | "u" [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9]
number ::= "-"? integer fraction? exponent?
integer ::= "0" | [1-9] [0-9]*
fraction ::= "." [0-9]+
exponent ::= [eE] [+\-]? [0-9]+
"""


class JsonGuard:
    """What xgrammar 0.2 lets through in JSON strings that no JSON parser accepts: raw control
    characters (in strings with maxLength) and UTF-8-encoded surrogates (0xED then 0xA0-0xBF,
    which decode to U+FFFD). Compact JSON never needs either, so JSON matchers also forbid every
    token holding a control byte or such a pair, and after a token that ends in a lone 0xED,
    every token starting with 0xA0-0xBF. Bitmask rows, ANDed into what xgrammar fills."""

    def __init__(self, decoded_vocab: Sequence[bytes], vocab_size: int) -> None:
        self.decoded_vocab = decoded_vocab
        self.always = _bitmask_row(vocab_size, decoded_vocab, _json_unsafe)
        self.after_lone_ed = _bitmask_row(vocab_size, decoded_vocab, lambda raw: raw[:1] in _SURROGATE_TAILS)
        #: the ids of the tokens that end in a lone 0xED (few: a set lookup per accepted token)
        self.lone_ed_ids = frozenset(i for i, raw in enumerate(decoded_vocab) if raw.endswith(b"\xed"))

    def ends_in_lone_ed(self, token_id: int) -> bool:
        return token_id in self.lone_ed_ids

    def apply(self, bitmask: torch.Tensor, rows: Sequence[int], after_lone_ed: Sequence[int]) -> None:
        """AND the guard into ``bitmask[rows]`` (one vectorized AND for all of them, in place;
        a contiguous run of rows is ANDed as one block) and ``after_lone_ed`` into those rows."""
        if not rows:
            return
        words = bitmask.numpy()  # a view: the AND runs in numpy, in place, without torch's dispatch
        first, count = rows[0], len(rows)
        if rows[-1] - first + 1 == count and all(b - a == 1 for a, b in zip(rows, rows[1:])):
            block = words[first : first + count]
            np.bitwise_and(block, self._always_np, out=block)
        else:
            index = np.asarray(rows, dtype=np.int64)
            words[index] &= self._always_np
        for row in after_lone_ed:
            np.bitwise_and(words[row], self._after_lone_ed_np, out=words[row])

    @property
    def _always_np(self) -> np.ndarray:
        return self.always.numpy()

    @property
    def _after_lone_ed_np(self) -> np.ndarray:
        return self.after_lone_ed.numpy()


class XGrammarMatcher(GrammarMatcher):
    def __init__(self, matcher: Any, json_guard: JsonGuard | None = None) -> None:
        self._matcher = matcher
        self._guard = json_guard
        self._after_lone_ed = False

    def accept_token(self, token_id: int) -> bool:
        accepted = bool(self._matcher.accept_token(token_id))
        if accepted and self._guard is not None:
            self._after_lone_ed = self._guard.ends_in_lone_ed(token_id)
        return accepted

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)
        if self._guard is not None:
            bitmask[row] &= self._guard.always
            if self._after_lone_ed:
                bitmask[row] &= self._guard.after_lone_ed

    def is_terminated(self) -> bool:
        return bool(self._matcher.is_terminated())

    def reset(self) -> None:
        self._matcher.reset()
        self._after_lone_ed = False


class XGrammarBackend(GrammarBackend):
    capabilities = frozenset({"json_schema", "json_object", "regex", "choice", "ebnf", "structural_tag"})

    @classmethod
    def availability(cls) -> str | None:
        if importlib.util.find_spec("xgrammar") is None:
            return "xgrammar is not installed (pip install minisgl-plugin-xgrammar pulls it in)"
        return None

    def __init__(self, tokenizer: Any, *, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        super().__init__(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        import xgrammar

        self._xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(self.stop_token_ids) or None
        )
        # our own cache (GrammarBackend.compile) keeps compiled grammars; no second one inside
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=_COMPILE_THREADS, cache_enabled=False)
        #: grammars compiled against the 256 bytes, to see whether any text can begin one (check)
        self._byte_compiler: Any = None
        #: specs that parsed (check), so admission parses each distinct grammar once
        self._checked: set[GrammarSpec] = set()
        self._json_guard = JsonGuard(info.decoded_vocab, vocab_size)
        #: xgrammar's thread pool for batched fills, started on the first (``fill_threads`` threads)
        self._batch: Any = None
        self._batch_threads = 0

    def fill_bitmasks(
        self, matchers: Sequence[GrammarMatcher], bitmask: torch.Tensor, rows: Sequence[int]
    ) -> None:
        """One call for every row: xgrammar's BatchGrammarMatcher fills them on ``fill_threads``
        threads without the GIL, then the JSON guard is ANDed into the guarded rows at once."""
        if not matchers:
            return
        if not hasattr(self._xgr, "BatchGrammarMatcher"):  # xgrammar before 0.1.22: one by one
            super().fill_bitmasks(matchers, bitmask, rows)
            return
        if self._batch is None or self._batch_threads != self.fill_threads:
            self._batch = self._xgr.BatchGrammarMatcher(max_threads=self.fill_threads)
            self._batch_threads = self.fill_threads
        rows = list(rows)
        inner = [m._matcher for m in matchers]  # type: ignore[attr-defined]
        self._batch.batch_fill_next_token_bitmask(inner, bitmask, rows)
        self.apply_guards(matchers, bitmask, rows)

    def apply_guards(
        self, matchers: Sequence[GrammarMatcher], bitmask: torch.Tensor, rows: Sequence[int]
    ) -> None:
        """AND the JSON guard into the rows of the JSON matchers (after xgrammar filled them)."""
        guarded = [row for m, row in zip(matchers, rows) if m._guard is not None]  # type: ignore[attr-defined]
        lone = [row for m, row in zip(matchers, rows) if m._after_lone_ed]  # type: ignore[attr-defined]
        self._json_guard.apply(bitmask, guarded, lone)

    def accept_tokens(self, matchers: Sequence[GrammarMatcher], token_ids: Sequence[int]) -> list[bool]:
        """One call into xgrammar for every matcher (no Python per token), then the guards' state."""
        if not hasattr(self._xgr, "BatchGrammarMatcher"):
            return super().accept_tokens(matchers, token_ids)
        inner = [m._matcher for m in matchers]  # type: ignore[attr-defined]
        accepted = self._xgr.BatchGrammarMatcher.batch_accept_token(inner, list(token_ids))
        lone_ed = self._json_guard.lone_ed_ids
        for matcher, token, ok in zip(matchers, token_ids, accepted):
            if ok and matcher._guard is not None:  # type: ignore[attr-defined]
                matcher._after_lone_ed = token in lone_ed  # type: ignore[attr-defined]
        return [bool(ok) for ok in accepted]

    def check(self, spec: GrammarSpec) -> None:
        """Parse without compiling against the vocabulary (the expensive part), for admission."""
        if spec in self._checked or spec in self._cache:
            return
        if spec.kind not in self.capabilities:
            self.compile(spec)  # raises, naming the kinds we support
        try:
            grammar = self._grammar(spec)
            # only a reference can make a schema's grammar recurse with no way out; the byte
            # compile is cheap for most but took 1.4 s for 1,000 optional properties and 20 s for
            # 2,000, here in the tokenizer process: a large grammar is left to the engine, which
            # fails a request whose grammar allows no first token as well (still a 400)
            begins = (
                (spec.kind == "json_schema" and '"$ref"' not in spec.value)
                or len(spec.value) > BYTE_CHECK_MAX_CHARS
                or self._can_begin(grammar)
            )
        except GrammarError:
            raise
        except Exception as exc:  # noqa: BLE001 - xgrammar's parse errors name the problem
            raise GrammarError(f"invalid {spec.kind} grammar: {exc}") from exc
        if not begins:
            raise GrammarError(
                f"the {spec.kind} grammar accepts no text: no token can begin it (a schema that only "
                "refers to itself, for one)"
            )
        if len(self._checked) >= self.cache_size:
            self._checked.clear()
        self._checked.add(spec)

    def _can_begin(self, grammar: Any) -> bool:
        """Whether some text (or the empty one) can begin ``grammar``: compiled against a vocabulary
        of the 256 bytes and a stop token (2-5 ms, not the model's vocabulary), a fresh matcher
        allows a byte or is already complete. xgrammar compiles a JSON schema that only refers to
        itself into a grammar allowing nothing: admitted, its request failed at its first token."""
        if self._byte_compiler is None:
            xgr = self._xgr
            info = xgr.TokenizerInfo(
                [bytes([b]) for b in range(256)] + [b"</s>"],
                vocab_type=xgr.VocabType.RAW,
                stop_token_ids=[256],
            )
            self._byte_compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        matcher = self._xgr.GrammarMatcher(self._byte_compiler.compile_grammar(grammar))
        mask = torch.zeros(1, bitmask_width(257), dtype=torch.int32)
        matcher.fill_next_token_bitmask(mask)
        return bool(mask.any()) or matcher.is_terminated()

    def compile_uncached(self, spec: GrammarSpec) -> Any:
        return _Compiled(self._compiler.compile_grammar(self._grammar(spec)), spec.kind in _JSON_KINDS)

    def matcher(self, compiled: Any) -> GrammarMatcher:
        guard = self._json_guard if compiled.json else None
        return XGrammarMatcher(self._xgr.GrammarMatcher(compiled.grammar), guard)

    def _grammar(self, spec: GrammarSpec) -> Any:
        try:
            return self._parse(spec)
        except RuntimeError as exc:  # xgrammar's parse errors: what is wrong, behind C++ noise
            raise GrammarError(f"invalid {spec.kind} grammar: {library_message(exc)}") from exc

    def _parse(self, spec: GrammarSpec) -> Any:
        grammar = self._xgr.Grammar
        if spec.kind == "json_schema":
            _check_json(spec.value, "json_schema")
            unenforced = unenforced_keywords(json.loads(spec.value))
            if unenforced:
                more = f"; and {len(unenforced) - 5} more" if len(unenforced) > 5 else ""
                raise GrammarError(
                    "json_schema: the xgrammar backend cannot enforce "
                    + "; ".join(unenforced[:5])
                    + more
                    + " (it would pass output that breaks them): remove them from the schema"
                )
            # compact output (no free whitespace): a weak model cannot stall in an endless run of spaces
            return grammar.from_json_schema(
                spec.value, any_whitespace=False, separators=(",", ":"), strict_mode=True
            )
        if spec.kind == "json_object":
            return grammar.from_ebnf(JSON_OBJECT_EBNF)
        if spec.kind == "regex":
            return grammar.from_regex(spec.value)
        if spec.kind == "choice":
            options = spec.choices()
            return grammar.from_ebnf(
                "root ::= " + " | ".join(json.dumps(o, ensure_ascii=False) for o in options)
            )
        if spec.kind == "ebnf":
            return grammar.from_ebnf(spec.value)
        if spec.kind == "structural_tag":
            _check_json(spec.value, "structural_tag")
            return grammar.from_structural_tag(spec.value)
        raise GrammarError(f"xgrammar backend: unsupported grammar kind {spec.kind!r}")


_JSON_KINDS = frozenset({"json_schema", "json_object"})

#: JSON Schema keywords xgrammar (0.2.8 and 0.2.9) compiles and then ignores: a grammar with one of
#: them lets through output that breaks it (tested against byte vocabularies; llguidance refuses
#: the same ones as "Unimplemented keys")
_IGNORED_KEYWORDS = (
    "not",
    "contains",
    "minContains",
    "maxContains",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "unevaluatedProperties",
)
#: where a schema holds further schemas: by name, in a list, or as the value itself
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SCHEMA_VALUES = (
    "items",
    "additionalProperties",
    "additionalItems",
    "unevaluatedItems",
    "unevaluatedProperties",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "contains",
)


def unenforced_keywords(schema: Any, path: str = "#") -> list[str]:
    """What of ``schema`` xgrammar would not enforce, each as "'keyword' at PATH": the
    :data:`_IGNORED_KEYWORDS`, ``uniqueItems: true``, ``multipleOf`` on a number that may be
    fractional (integers are enforced), ``allOf`` of several schemas (not intersected), and
    ``minProperties`` above the required properties where keys outside ``properties`` are allowed
    (the grammar lets a key repeat, and a repeated key counts once in the parsed object)."""
    if not isinstance(schema, dict):
        return []
    found = [f"{key!r} at {path}" for key in _IGNORED_KEYWORDS if key in schema]
    if schema.get("uniqueItems") is True:
        found.append(f"'uniqueItems' at {path}")
    types = schema.get("type")
    if "multipleOf" in schema and not (
        types == "integer" or (isinstance(types, list) and "number" not in types)
    ):
        found.append(f"'multipleOf' on a number at {path} (only on integers)")
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:
        found.append(f"'allOf' of {len(schema['allOf'])} schemas at {path} (one at most)")
    least = schema.get("minProperties")
    open_keys = schema.get("additionalProperties", False) is not False or "patternProperties" in schema
    required = schema.get("required")
    named = len(set(required)) if isinstance(required, list) else 0
    if isinstance(least, int) and open_keys and least > max(1, named):
        found.append(f"'minProperties' with keys outside 'properties' at {path}")
    for key in _SCHEMA_MAPS:
        value = schema.get(key)
        if isinstance(value, dict):
            for name, sub in value.items():
                found += unenforced_keywords(sub, f"{path}/{key}/{name}")
    for key in _SCHEMA_LISTS:
        value = schema.get(key)
        if isinstance(value, list):
            for i, sub in enumerate(value):
                found += unenforced_keywords(sub, f"{path}/{key}/{i}")
    for key in _SCHEMA_VALUES:
        if isinstance(schema.get(key), dict) and key not in _IGNORED_KEYWORDS:
            found += unenforced_keywords(schema[key], f"{path}/{key}")
    return found


class _Compiled(NamedTuple):
    grammar: Any
    #: JSON output: the matcher is guarded by JsonGuard
    json: bool


_SURROGATE_TAILS = frozenset(bytes([b]) for b in range(0xA0, 0xC0))
_SURROGATE_PAIR = re.compile(rb"\xed[\xa0-\xbf]")


def _json_unsafe(raw: bytes) -> bool:
    return any(b < 0x20 for b in raw) or _SURROGATE_PAIR.search(raw) is not None


def _bitmask_row(
    vocab_size: int, decoded_vocab: Sequence[bytes], forbidden: Callable[[bytes], bool]
) -> torch.Tensor:
    """One bitmask row: set for every token but those ``forbidden`` says, and for the ids past the
    tokenizer's vocabulary (the grammar forbids those already)."""
    ok = torch.ones(bitmask_width(vocab_size) * 32, dtype=torch.bool)
    for token_id, raw in enumerate(decoded_vocab[:vocab_size]):
        if forbidden(raw):
            ok[token_id] = False
    words = ok.view(-1, 32).to(torch.int64) << torch.arange(32)
    packed = words.sum(dim=1)
    # as int32: bit 31 is the sign bit
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


#: what xgrammar puts before its messages: "[05:08:01] /project/cpp/regex_converter.cc:83: " and, for
#: a failed assertion, "Check failed: (val <= MAX_INT64_AS_DOUBLE) is false: "
_LIBRARY_NOISE = re.compile(r"^\[\d\d:\d\d:\d\d\] \S+:\d+: |Check failed: \(.*?\) is false: ")


def library_message(exc: Exception) -> str:
    """xgrammar's error message without its time stamp, source location and assertion text."""
    return _LIBRARY_NOISE.sub("", str(exc)).strip()


def _check_json(text: str, what: str) -> None:
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise GrammarError(f"{what} is not valid JSON: {exc}") from exc
