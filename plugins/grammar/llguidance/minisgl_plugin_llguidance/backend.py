"""The llguidance grammar backend: JSON schema, JSON object, regex, choice and EBNF (GBNF or Lark)."""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Iterator, Sequence
from decimal import Decimal
from typing import Any, NamedTuple

import torch

from minisgl_core.api import GrammarBackend, GrammarError, GrammarMatcher, GrammarSpec
from minisgl_core.api.ecma_regex import class_atoms, class_end, ecma_dot, paired_surrogates, read_escape
from minisgl_core.api.grammar import FORMAT_REGEXES, repeatable_key_count
from minisgl_plugin_llguidance.key_guard import KeyGuard, KeyState

logger = logging.getLogger(__name__)

#: compact JSON (no free whitespace): a weak model cannot stall in an endless run of spaces
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


class LLGuidanceMatcher(GrammarMatcher):
    """``keys``: the backend's :class:`KeyGuard` for a JSON schema whose objects name properties
    (their keys are written as JSON writes them), else None."""

    def __init__(self, matcher: Any, keys: KeyGuard | None = None) -> None:
        self._matcher = matcher
        self._keys = keys
        self._key_state = KeyState()

    def accept_token(self, token_id: int) -> bool:
        if self._keys is not None and not self._keys.allows(self._key_state, token_id):
            return False  # (not given to llguidance: the matcher stays where it was)
        # a rejected token leaves the matcher in its error state for good; the engine then
        # fails the request, so there is nothing to undo
        accepted = bool(self._matcher.consume_token(token_id))
        if accepted:
            self._advance(token_id)
        return accepted

    def _advance(self, token_id: int) -> None:
        if self._keys is not None:
            self._key_state.feed(
                self._keys.token_bytes[token_id] if token_id < len(self._keys.token_bytes) else b""
            )

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if bitmask.dtype != torch.int32 or not bitmask.is_cpu or bitmask.dim() != 2:
            raise ValueError("the bitmask must be a 2-D int32 tensor on the CPU")
        words = bitmask[row]
        if not words.is_contiguous():
            raise ValueError("bitmask rows must be contiguous")
        self._matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * words.element_size())
        if self._matcher.is_error():  # nothing may follow: the engine fails the request as invalid
            words.zero_()
        elif self._keys is not None:
            self._keys.apply(bitmask, row, self._key_state)

    def is_terminated(self) -> bool:
        # llguidance stops when only the end may follow (or after the stop token)
        return bool(self._matcher.is_stopped()) and not self._matcher.is_error()

    def reset(self) -> None:
        self._matcher.reset()
        self._key_state = KeyState()


class _Compiled(NamedTuple):
    grammar: str
    #: a JSON schema naming properties: its matchers take the key guard
    guard_keys: bool


def _log_limit(error: str) -> None:
    """Say in the log when llguidance stopped a grammar at one of its parser's limits (an object of
    several hundred optional properties passes its 2,000 items a row after the opening brace): the
    engine fails the request as a grammar with no next token, which alone reads as the schema's
    fault."""
    lines = error.splitlines()
    if any(line.startswith("Stop: ParserTooComplex") for line in lines):
        reason = next((line for line in lines if "Error" in line), lines[0] if lines else error)
        logger.warning("llguidance stopped a grammar at its parser's limits: %s", reason)


class LLGuidanceBackend(GrammarBackend):
    capabilities = frozenset({"json_schema", "json_object", "regex", "choice", "ebnf"})

    @classmethod
    def availability(cls) -> str | None:
        if importlib.util.find_spec("llguidance") is None:
            return "llguidance is not installed (pip install minisgl-plugin-llguidance pulls it in)"
        return None

    def __init__(self, tokenizer: Any, *, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        super().__init__(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        import llguidance
        import llguidance.hf

        self._llg = llguidance
        self._tokenizer = llguidance.hf.from_tokenizer(
            tokenizer, n_vocab=vocab_size, eos_token=list(self.stop_token_ids) or None
        )
        #: the guard of JSON keys' escapes (:mod:`key_guard`), built on first use
        self._keys: KeyGuard | None = None
        #: llguidance's thread pool for batched fills and accepts, started on first use
        self._executor: Any = None
        self._executor_threads = 0

    def _pool(self) -> Any:
        if self._executor is None or self._executor_threads != self.fill_threads:
            self._executor = self._llg.LLExecutor(num_threads=self.fill_threads)
            self._executor_threads = self.fill_threads
        return self._executor

    def fill_bitmasks(
        self, matchers: Sequence[GrammarMatcher], bitmask: torch.Tensor, rows: Sequence[int]
    ) -> None:
        """One call for every row: llguidance's executor computes the masks on ``fill_threads``
        threads without the GIL, straight into the (contiguous, int32, host) bitmask."""
        if not matchers:
            return
        if (
            bitmask.dtype != torch.int32
            or not bitmask.is_cpu
            or bitmask.dim() != 2
            or not bitmask.is_contiguous()
        ):
            raise ValueError("the bitmask must be a contiguous 2-D int32 tensor on the CPU")
        pairs = [(m._matcher, row) for m, row in zip(matchers, rows, strict=True)]  # type: ignore[attr-defined]
        batch, words = bitmask.shape
        self._pool().unsafe_compute_mask_ptr(pairs, bitmask.data_ptr(), words * 4, batch)
        for ours, (matcher, row) in zip(matchers, pairs):
            # a matcher in its error state allows nothing (llguidance writes some mask for it):
            # the engine then sees a grammar at a dead end, the request's fault, not a token it
            # drew from that mask rejected
            if matcher.is_error():
                bitmask[row].zero_()
            elif ours._keys is not None:  # type: ignore[attr-defined]
                ours._keys.apply(bitmask, row, ours._key_state)  # type: ignore[attr-defined]

    def accept_tokens(self, matchers: Sequence[GrammarMatcher], token_ids: Sequence[int]) -> list[bool]:
        # a token the key guard forbids is refused here, not given to llguidance
        guarded = [
            m._keys is None or m._keys.allows(m._key_state, t)  # type: ignore[attr-defined]
            for m, t in zip(matchers, token_ids, strict=True)
        ]
        pairs = [(m._matcher, t) for m, t, ok in zip(matchers, token_ids, guarded) if ok]  # type: ignore[attr-defined]
        consumed = iter(self._pool().consume_token_par(pairs) if pairs else [])
        accepted = [ok and bool(next(consumed)) for ok in guarded]
        for ours, token, ok in zip(matchers, token_ids, accepted):
            matcher = ours._matcher  # type: ignore[attr-defined]
            if ok:
                ours._advance(token)  # type: ignore[attr-defined]
            elif matcher.is_error():
                _log_limit(matcher.get_error())
        return accepted

    def compile_uncached(self, spec: GrammarSpec) -> _Compiled:
        """The llguidance grammar text of ``spec``, validated against the tokenizer, and whether
        its keys are guarded (a JSON schema naming properties: :mod:`key_guard`)."""
        grammar = self._grammar(spec)
        error = self._llg.LLMatcher.validate_grammar(grammar, self._tokenizer)
        if error:
            raise GrammarError(f"invalid {spec.kind} grammar: {error}")
        names = spec.kind == "json_schema" and any(
            word in spec.value for word in ('"properties"', '"patternProperties"')
        )
        return _Compiled(grammar, names)

    def matcher(self, compiled: Any) -> GrammarMatcher:
        """A matcher of what :meth:`compile` made (or of an llguidance grammar's text, unguarded)."""
        grammar, guard_keys = (compiled, False) if isinstance(compiled, str) else compiled
        matcher = self._llg.LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"llguidance could not start the grammar: {matcher.get_error()}")
        return LLGuidanceMatcher(matcher, self._key_guard() if guard_keys else None)

    def _key_guard(self) -> KeyGuard:
        """The key guard, built on first use from the tokens' bytes (special tokens have none)."""
        if self._keys is None:
            tokenizer = self._tokenizer
            count = min(self.vocab_size, tokenizer.vocab_size)
            token_bytes = [
                b"" if tokenizer.is_special_token(i) else tokenizer.decode_bytes([i]) for i in range(count)
            ]
            self._keys = KeyGuard(token_bytes, self.vocab_size)
        return self._keys

    def _grammar(self, spec: GrammarSpec) -> str:
        build = self._llg.LLMatcher
        if spec.kind == "json_schema":
            try:
                schema = json.loads(spec.value)
            except json.JSONDecodeError as exc:
                raise GrammarError(f"json_schema is not valid JSON: {exc}") from exc
            # a schema is an object or a boolean; llguidance takes objects only ("Expecting object
            # schema to apply options" for each of true, false and 5)
            if schema is True:
                schema, spec = {}, GrammarSpec("json_schema", "{}")
            elif schema is False:
                raise GrammarError("json_schema: the schema false accepts no value at all")
            elif not isinstance(schema, dict):
                raise GrammarError(f"json_schema must be a JSON object or a boolean, got {spec.value[:60]}")
            crashing = crashing_integers(schema)
            if crashing:
                raise GrammarError(
                    f"json_schema: the integer {crashing[0]} is one the llguidance backend cannot "
                    "compile (llguidance crashed the whole process on an integer from -2**63 to "
                    "-2**63+512, which a 64-bit float reads as -2**63); leave it out of the schema"
                )
            rounded = rounded_integers(schema)
            if rounded:
                raise GrammarError(
                    f"json_schema: the integer {rounded[0]} is past what the llguidance backend "
                    "holds exactly (llguidance reads every number as a 64-bit float, and would take "
                    "the float's integer where the schema names this one); write an integer a "
                    "64-bit float holds exactly (any up to 2**53)"
                )
            long = long_floats(schema)
            if long:
                raise GrammarError(
                    f"json_schema: the number {long[0]} has more significant digits than the "
                    f"llguidance backend writes or bounds by exactly ({MAX_FLOAT_DIGITS}; llguidance "
                    "wrote 0.10653719911035897 as 0.10653719911035896, another number, and let "
                    "-93424338.98624992 through a minimum of -93424338.98624991); round it to "
                    f"{MAX_FLOAT_DIGITS} significant digits"
                )
            narrow = narrow_exclusive_ranges(schema)
            if narrow:
                raise GrammarError(
                    f"json_schema: {narrow[0]} is not enforced by llguidance (it lets the excluded "
                    "whole number itself through when the other bound is less than 1 away: 1 passed "
                    "exclusiveMinimum 1 beside maximum 1.5); give the range a width of 1 or more"
                )
            repeatable = repeatable_key_counts(schema)
            if repeatable:
                raise GrammarError(
                    f"json_schema: 'minProperties' with keys outside 'properties' at {repeatable[0]} is "
                    "not enforced by llguidance (such a key may repeat, and a repeated key counts once "
                    "in the parsed object); list the keys in 'properties', or require as many"
                )
            text = json.dumps(schema) if exact_formats(schema) else spec.value
            return build.grammar_from_json_schema(
                ecma_space_in_patterns(schema, text), defaults=_JSON_OPTIONS
            )
        if spec.kind == "json_object":
            return build.grammar_from_json_schema('{"type": "object"}', defaults=_JSON_OPTIONS)
        if spec.kind == "regex":
            return build.grammar_from_regex(ecma_classes(ecma_dot(paired_surrogates(spec.value))))
        if spec.kind == "choice":
            return build.grammar_from_lark("start: " + " | ".join(json.dumps(o) for o in spec.choices()))
        if spec.kind == "ebnf":
            return self._llg.grammar_from("ebnf", spec.value)  # GBNF (xgrammar's dialect) or Lark
        raise GrammarError(f"llguidance backend: unsupported grammar kind {spec.kind!r}")


#: keywords whose values are data, not schemas
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})


def repeatable_key_counts(schema: Any) -> list[str]:
    """The paths of the object schemas in ``schema`` whose ``minProperties`` a repeated key can
    meet (:func:`minisgl_core.api.grammar.repeatable_key_count`, keys outside ``properties``
    allowed unless ``additionalProperties`` is false, as in JSON Schema). llguidance refuses most such schemas itself ("min/maxProperties only supported when
    all keys listed"), but passed ``{"k":0,"k":1}`` for ``patternProperties`` and for an object
    without ``properties`` (found by a probe), which parses as one property."""
    return sorted(
        path
        for node, path in _schema_objects(schema)
        if repeatable_key_count(node, additional_properties_default=True)
    )


#: what a 64-bit float reads the integers llguidance crashes on as
_CRASHING_FLOAT = -(2.0**63)


def crashing_integers(schema: Any) -> list[str]:
    """Each integer in ``schema`` (a keyword's value or data: ``const``, ``enum``, at any depth)
    from -2**63 to -2**63+512, which a 64-bit float reads as -2**63, as "VALUE at PATH".
    llguidance 1.9 crashed the process compiling the grammar (a segmentation fault in
    ``validate_grammar``) on ``{"const": -9223372036854775808}`` and on such an integer
    anywhere in an ``enum`` or ``const`` (a random-schema walk); -2**63-1 and -2**63+513 compile."""
    return [
        f"{value} at {path}"
        for value, path in _integers(schema)
        if -(2**63) <= value < 0 and float(value) == _CRASHING_FLOAT
    ]


def _integers(schema: Any) -> Iterator[tuple[int, str]]:
    """Every integer (not a bool) in ``schema`` at any depth, with its JSON pointer, in document
    order; a walk without recursion (nesting is unbounded)."""
    stack: list[tuple[Any, str]] = [(schema, "#")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            stack += [(v, f"{path}/{k}") for k, v in reversed(value.items())]
        elif isinstance(value, list):
            stack += [(v, f"{path}/{i}") for i, v in reversed(list(enumerate(value)))]
        elif isinstance(value, int) and not isinstance(value, bool):
            yield value, path


def rounded_integers(schema: Any) -> list[str]:
    """Each integer in ``schema`` (a keyword's value or data, at any depth) that a 64-bit float
    does not hold exactly (past 2**53; one past the floats is left to llguidance, which names it),
    as "VALUE at PATH (read as FLOAT)". llguidance reads them as the float: ``{"const":
    9007199254740993}`` took 9007199254740992 and refused itself, and ``{"type": "integer",
    "minimum": 9007199254740993}`` took 9007199254740992 (a random-schema walk), values the schema
    rules out. And one past the 64-bit integers that llguidance writes as the float's shortest
    digits padded with zeros: 2**64 (a float exactly) took 18446744073709552000."""
    found = []
    for value, path in _integers(schema):
        if abs(value) > 2**53:
            try:
                read = float(value)
            except OverflowError:
                continue
            if read != value:
                found.append(f"{value} at {path} (read as {int(read)})")
            elif not -(2**63) <= value < 2**64 and (written := int(Decimal(repr(read)))) != value:
                found.append(f"{value} at {path} (written as {written})")
    return found


#: the most significant digits of a float in a ``const`` or ``enum`` that llguidance 1.9 wrote
#: right in every probe (300 random floats each, 1e-9 to 1e17: none wrong at 6, 10 or 12 digits,
#: 1 at 13, 8 at 15, 25 at 16), and of a number's bound it kept to (120 each: none let through
#: a float past it at 8, 12 or 14 digits, 10 at 17)
MAX_FLOAT_DIGITS = 12


def long_floats(schema: Any) -> list[str]:
    """Each float in a ``const`` or ``enum`` of ``schema`` (at any depth in the value), or a
    number's bound (``minimum``, ``maximum`` and the exclusive ones), with more than
    :data:`MAX_FLOAT_DIGITS` significant digits, as "VALUE at PATH". llguidance writes such a
    value with digits of its own: 0.10653719911035897 as 0.10653719911035896, 1000000000000000.5
    as 1000000000000000.4, 4420421153695070.0 as 4420421153695070.5 (a random-schema walk, then a
    probe), taking only that other number; and such a bound lets a number past it through:
    -93424338.98624992 passed a minimum of -93424338.98624991, 238.9465653679488 a maximum of
    238.94656536794878 (a probe). An integer is :func:`rounded_integers`'s."""
    found = []
    for node, path in _schema_objects(schema):
        stack: list[tuple[Any, str]] = [
            (node[key], f"{path}/{key}") for key in ("const", "enum", *_BOUNDS) if key in node
        ]
        while stack:
            value, where = stack.pop()
            if isinstance(value, dict):
                stack += [(v, f"{where}/{k}") for k, v in value.items()]
            elif isinstance(value, list):
                stack += [(v, f"{where}/{i}") for i, v in enumerate(value)]
            elif isinstance(value, float) and _significant_digits(value) > MAX_FLOAT_DIGITS:
                found.append(f"{value!r} at {where}")
    return sorted(found)


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _significant_digits(value: float) -> int:
    """The significant digits of ``value``'s shortest form (``repr``: 0.1 has 1, 1250.5 has 5)."""
    return len(repr(abs(value)).split("e")[0].replace(".", "").strip("0"))


def narrow_exclusive_ranges(schema: Any) -> list[str]:
    """Each schema in ``schema`` bounding numbers (not integers only) on both sides less than 1
    apart where the bound in force on one side is an exclusive whole number, as "'KEY' N beside
    'KEY' M at PATH". llguidance 1.9 let that whole number itself through: 1 passed
    ``{"type": "number", "exclusiveMinimum": 1, "maximum": 1.5}``, 0 ``exclusiveMinimum`` 0
    beside ``exclusiveMaximum`` 0.5, -0 ``exclusiveMaximum`` 0 beside ``minimum`` -0.5 (a
    random-schema walk: the whole number nearer zero, where the range lies on its side). Every
    such pair is refused, also those llguidance got right (0.5 to an exclusive 1)."""
    found = []
    for node, path in _schema_objects(schema):
        types = node.get("type")
        if types == "integer" or (isinstance(types, list) and "integer" in types and "number" not in types):
            continue
        low = _bound_in_force(node, "minimum", "exclusiveMinimum", max)
        high = _bound_in_force(node, "maximum", "exclusiveMaximum", min)
        if low is None or high is None or not high[1] - low[1] < 1:
            continue
        for key, value, exclusive in (low, high):
            if exclusive and (isinstance(value, int) or value.is_integer()):
                other = high if key == low[0] else low
                found.append(f"{key!r} {value!r} beside {other[0]!r} {other[1]!r} at {path}")
                break
    return found


def _bound_in_force(node: dict, inclusive: str, exclusive: str, tighter: Any) -> tuple[str, Any, bool] | None:
    """(keyword, value, whether exclusive) of the bound of ``node`` in force on one side (``tighter``:
    max for the lower side, min for the upper); an exclusive one wins a tie. None without one."""
    bounds = [
        (key, node[key], key == exclusive)
        for key in (exclusive, inclusive)
        if isinstance(node.get(key), (int, float)) and not isinstance(node[key], bool)
    ]
    if not bounds:
        return None
    best = tighter(bound[1] for bound in bounds)
    return next(bound for bound in bounds if bound[1] == best)


def _schema_objects(schema: Any) -> Iterator[tuple[dict, str]]:
    """Every object in ``schema`` outside data keywords, with its JSON pointer; a walk without
    recursion (nesting is unbounded). A node changed when it is yielded is walked as changed."""
    stack: list[tuple[Any, str]] = [(schema, "#")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, list):
            stack += [(item, f"{path}/{i}") for i, item in enumerate(node)]
        elif isinstance(node, dict):
            yield node, path
            stack += [(value, f"{path}/{key}") for key, value in node.items() if key not in _DATA_KEYWORDS]


def exact_formats(schema: Any) -> bool:
    """Write each ``format`` in ``schema`` that llguidance's own regex lets invalid strings through
    (:data:`~minisgl_core.api.grammar.FORMAT_REGEXES`: February 29 of 2023, second 60) as that
    format's exact pattern instead, in place; whether any was. Beside a ``pattern`` of its own the
    format's goes into ``allOf`` (llguidance intersects the patterns there)."""
    changed = False
    for node, _ in _schema_objects(schema):
        regex = FORMAT_REGEXES.get(node["format"]) if isinstance(node.get("format"), str) else None
        if regex is None or not isinstance(node.get("allOf", []), list):
            continue
        del node["format"]
        if "pattern" in node:
            node["allOf"] = [*node.get("allOf", []), {"pattern": regex}]
        else:
            node["pattern"] = regex
        changed = True
    return changed


#: what ``\d``, ``\w`` and their negations match in ECMA-262 (JSON Schema's regexes) and in
#: xgrammar: ASCII only. llguidance's regex grammars (Rust's syntax) match any Unicode digit or
#: letter ("\u0663", Arabic-Indic three, passed ``\d``), its JSON-schema patterns ASCII only.
#: ``\s``: ECMA-262's WhiteSpace and LineTerminator (xgrammar's too); llguidance's, in regex
#: grammars and JSON-schema patterns alike, is Unicode's White_Space, with U+0085 (NEL) and
#: without U+FEFF, so "a\u0085b" passed the pattern ``^a\s+b$``, which ECMA-262 refuses.
#: Each as (its set, negated), written so both ECMA-262 and Rust read it alike.
_ECMA_SPACE = r"\t\n\v\f\r \u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000\uFEFF"
_ECMA_CLASSES = {
    "d": ("0-9", False),
    "D": ("0-9", True),
    "w": ("0-9A-Za-z_", False),
    "W": ("0-9A-Za-z_", True),
    "s": (_ECMA_SPACE, False),
    "S": (_ECMA_SPACE, True),
}


def ecma_classes(regex: str, escapes: str = "dDwWsS") -> str:
    """``regex`` with the class escapes named in ``escapes`` (``\\d``, ``\\D``, ``\\w``, ``\\W``,
    ``\\s``, ``\\S``) spelled as the sets they are in ECMA-262 and xgrammar, in and out of
    classes (``[\\d.]`` -> ``[0-9.]``, ``[^\\D]`` -> ``[^[^0-9]]``); an escaped backslash stays
    one (``\\\\d`` is a backslash and a d). ECMA-262's escapes Rust's syntax lacks (``\\cJ``,
    ``\\0``, a backspace ``[\\b]``; llguidance refused them) are written ``\\x{...}``."""
    out: list[str] = []
    depth = 0  # classes open at this point (Rust nests them)
    i = 0
    while i < len(regex):
        char = regex[i]
        if char == "\\" and i + 1 < len(regex):
            escaped = regex[i + 1]
            spelled = _ECMA_CLASSES.get(escaped) if escaped in escapes else None
            text, code = read_escape(regex, i, in_class=depth > 0)
            if code is not None and escaped in "c0b" and text != "\\c":  # \cJ, \0, [\b]: not Rust's
                out.append(f"\\x{{{code:x}}}")
                i += len(text)
                continue
            if spelled is None:
                out.append(char + escaped)
            else:
                members, negated = spelled
                # in a class, the set's members (negated: a nested class, Rust's syntax for it)
                out.append(members if depth and not negated else f"[{'^' if negated else ''}{members}]")
                if depth and out[-2] == "-":  # a "-" beside the escape is one (ECMA), not a range
                    out[-2] = "\\-"
                if depth and regex.startswith("-", i + 2) and not regex.startswith("-]", i + 2):
                    out.append("\\-")
                    i += 1
            i += 2
            continue
        out.append(char)
        i += 1
        if char == "[":
            depth += 1
            # a "]" first in a class (after any "^") is a literal one
            if regex.startswith("^", i):
                out.append("^")
                i += 1
            if regex.startswith("]", i):
                out.append("]")
                i += 1
        elif char == "]" and depth:
            depth -= 1
    return "".join(out)


#: the characters a JSON string must escape (U+0000-U+001F, a quote, a backslash)
_MUST_ESCAPE = frozenset([*range(0x20), 0x22, 0x5C])
#: the control characters but the line feed: a class matching them all is quoted as one set
_CONTROLS_BUT_LF = frozenset(range(0x20)) - {0x0A}
#: what each class escape matches among them (ECMA-262: ``\\s`` takes the tab to the CR)
_CLASS_ESCAPE_MEMBERS = {
    "d": frozenset(),
    "w": frozenset(),
    "s": frozenset(range(0x09, 0x0E)),
    "D": _MUST_ESCAPE,
    "W": _MUST_ESCAPE,
    "S": _MUST_ESCAPE - frozenset(range(0x09, 0x0E)),
}


def quotable_classes(pattern: str) -> str:
    """``pattern`` (ECMA-262) with U+0000 left out of each class that matches every control
    character (or all but the line feed) and not both a quote and a backslash, written
    ``[[...]--[\\x00]]``. llguidance matches a JSON-schema pattern against the string's JSON text
    (derivre's ``json_quote``), and there such a class took the escapes ``\\"`` and ``\\\\``
    whatever it named: ``^[^"]*$`` took a quote, ``^[\\x00-\\x1f]$`` a quote and a backslash (a
    probe against ECMA-262's reading, 2026-12-01). Without U+0000 its control characters are
    escaped one by one; what is lost is a NUL (``\\u0000``), which the pattern allowed."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern[i] == "\\":
            text = read_escape(pattern, i, in_class=False)[0]
            out.append(text)
            i += len(text)
            continue
        if pattern[i] != "[":
            out.append(pattern[i])
            i += 1
            continue
        end = class_end(pattern, i)
        if end is None:  # unterminated: llguidance refuses it in its own words
            out.append(pattern[i:])
            break
        members = _escaped_members(pattern[i:end])
        risky = members is not None and _CONTROLS_BUT_LF <= members and not {0x22, 0x5C} <= members
        out.append(f"[{pattern[i:end]}--[\\x00]]" if risky else pattern[i:end])
        i = end
    return "".join(out)


def _escaped_members(text: str) -> frozenset[int] | None:
    """Which characters JSON must escape the class ``text`` (``[`` to ``]``) matches; None when it
    names something this reading does not know (a Unicode property)."""
    negated, atoms = class_atoms(text)
    found: set[int] = set()
    j = 0
    while j < len(atoms):
        atom_text, low = atoms[j]
        high = low
        if (
            j + 2 < len(atoms)
            and atoms[j + 1] == ("-", 0x2D)
            and low is not None
            and atoms[j + 2][1] is not None
        ):
            high = atoms[j + 2][1]
            j += 2
        j += 1
        if low is None:
            escaped = _CLASS_ESCAPE_MEMBERS.get(atom_text[1:2])
            if escaped is None:
                return None
            found |= escaped
        else:
            assert high is not None
            found |= {code for code in _MUST_ESCAPE if low <= code <= high}
    return _MUST_ESCAPE - found if negated else frozenset(found)


def ecma_space_in_patterns(schema: Any, text: str) -> str:
    """The JSON schema ``text`` (parsed: ``schema``) with ``\\s`` and ``\\S`` spelled as
    ECMA-262's sets in every ``pattern`` and ``patternProperties`` name, ``.`` as ECMA-262's
    (:func:`~minisgl_core.api.ecma_regex.ecma_dot`: llguidance's took a carriage return, U+2028
    and U+2029; it reads the rest of a pattern as ECMA-262 does), a class that would take escapes
    it does not name without U+0000 (:func:`quotable_classes`), escaped UTF-16 surrogate pairs as
    their characters (:func:`~minisgl_core.api.ecma_regex.paired_surrogates`: llguidance refused
    ``\\ud83d\\ude00``, which ECMA-262 reads as one character); ``text`` itself when no pattern
    changes."""
    changed = False

    def spelled(pattern: str) -> str:
        nonlocal changed
        out = ecma_classes(
            quotable_classes(ecma_dot(paired_surrogates(pattern, what="json_schema pattern"))), "sS"
        )
        changed = changed or out != pattern
        return out

    for node, _ in _schema_objects(schema):
        if isinstance(node.get("pattern"), str):
            node["pattern"] = spelled(node["pattern"])
        if isinstance(node.get("patternProperties"), dict):
            node["patternProperties"] = {spelled(k): v for k, v in node["patternProperties"].items()}
    return json.dumps(schema) if changed else text
