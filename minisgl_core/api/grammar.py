"""Constrained decoding: what a request's output must match, and the grammar-backend plugin ABCs.

A :class:`GrammarSpec` travels with a request's sampling parameters. The engine compiles it once
with the selected :class:`GrammarBackend` (cached by ``(kind, value)``), gives the request its own
:class:`GrammarMatcher`, and every step asks the matcher for the tokens it allows next as a row
of a token bitmask: int32 words, ``ceil(vocab / 32)`` per row, bit ``t % 32`` of word ``t // 32``
set when token ``t`` is allowed (xgrammar's and llguidance's layout). The sampler sets the
logits of disallowed tokens to -inf.

A decode step asks every constrained request at once: :meth:`GrammarBackend.accept_tokens` then
:meth:`GrammarBackend.fill_bitmasks`. Their defaults go matcher by matcher; a backend whose
library has a batched, multi-threaded call overrides them (``fill_threads`` says how many threads).

Backends that check JSON schemas before their library compiles them share the rules stated once
here: :func:`repeatable_key_count` (``minProperties`` a repeated key could meet) and
:data:`FORMAT_REGEXES` (exact regexes for the string formats libraries write too loosely), and
every backend the words for a grammar no text can begin (:func:`accepts_no_text`). Import
them from ``minisgl_core.api.grammar``. Patterns naming UTF-16 surrogates are rewritten by
:func:`minisgl_core.api.ecma_regex.paired_surrogates` (with the ECMA-262 escape reader it uses).

.. versionadded:: 1.6
.. versionadded:: 2.0 ``GrammarBackend.fill_bitmasks``, ``accept_tokens``, ``fill_threads``,
   ``default_fill_threads``
"""

from __future__ import annotations

import json
import os
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args

if TYPE_CHECKING:
    import torch

GrammarKind = Literal["json_schema", "json_object", "regex", "choice", "ebnf", "structural_tag"]
GRAMMAR_KINDS: tuple[str, ...] = get_args(GrammarKind)


@dataclass(frozen=True)
class GrammarSpec:
    """What a request's output must match. value: the JSON schema as JSON text (json_schema),
    "" (json_object), the regex, a JSON list of strings (choice), the EBNF text (ebnf), or the
    structural-tag JSON (structural_tag: free text with tagged regions constrained by schemas).
    A json_schema may also be given as the schema itself (a dict, as vLLM takes it), a choice as
    the list of its strings (vLLM's ``choice=[...]``): the spec keeps their JSON text, so that it
    stays hashable (the compile cache's key)."""

    kind: GrammarKind
    value: str

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise GrammarError(f"unknown grammar kind {self.kind!r}; use one of {', '.join(GRAMMAR_KINDS)}")
        if self.kind == "json_schema" and isinstance(self.value, (dict, list, bool)):
            try:  # (the keys' order kept: it is the order the output writes the properties in)
                text = json.dumps(self.value, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise GrammarError(f"the json_schema grammar is not JSON: {exc}") from None
            except RecursionError:  # (json's own error, naming no field)
                raise GrammarError("the json_schema grammar is not JSON: it is nested too deeply") from None
            object.__setattr__(self, "value", text)
        if self.kind == "choice" and isinstance(self.value, (list, tuple)):
            if not all(isinstance(option, str) for option in self.value):
                raise GrammarError("choice must be a non-empty list of strings")
            object.__setattr__(self, "value", json.dumps(list(self.value)))
        if not isinstance(self.value, str):
            raise GrammarError(
                f"the {self.kind} grammar must be given as a string"
                + (" (or the schema as a dict)" if self.kind == "json_schema" else "")
                + (" (or the list of choices)" if self.kind == "choice" else "")
                + f", got {type(self.value).__name__}"
            )

    @classmethod
    def coerce(cls, value: GrammarSpec | dict[str, Any] | None) -> GrammarSpec | None:
        """A spec from itself or from its wire form ``{"kind": ..., "value": ...}`` (msgpack)."""
        if value is None or isinstance(value, GrammarSpec):
            return value
        if isinstance(value, dict) and set(value) == {"kind", "value"}:
            return cls(value["kind"], value["value"])
        raise GrammarError(
            "must be a GrammarSpec(kind, value) (from minisgl_core.api; a JSON schema is "
            f"GrammarSpec('json_schema', schema)) or {{'kind': ..., 'value': ...}}, got {_short(value)}"
        )

    def choices(self) -> list[str]:
        """The alternatives of a ``choice`` spec, checked (a non-empty JSON list of strings)."""
        try:
            options = json.loads(self.value)
        except json.JSONDecodeError as exc:
            raise GrammarError(f"choice must be a JSON list of strings: {exc}") from exc
        if not isinstance(options, list) or not options or not all(isinstance(o, str) for o in options):
            raise GrammarError("choice must be a non-empty list of strings")
        return options


def _short(value: object, limit: int = 80) -> str:
    try:
        text = repr(value)
    except RecursionError:  # (a list nested thousands deep)
        return f"<{type(value).__name__} nested too deeply to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class GrammarError(ValueError):
    """The grammar of a request is invalid (the message says what is wrong) or unsupported."""


def bitmask_width(vocab_size: int) -> int:
    """int32 words per bitmask row."""
    return (vocab_size + 31) // 32


def allocate_token_bitmask(rows: int, vocab_size: int, *, pin_memory: bool = False) -> torch.Tensor:
    """A host bitmask of ``rows`` rows with every token allowed (all bits set)."""
    import torch  # here, not at import: the tokenizer process checks grammars without torch

    return torch.full((rows, bitmask_width(vocab_size)), -1, dtype=torch.int32, pin_memory=pin_memory)


def allowed_tokens(bitmask_row: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A bool vector over ``vocab_size`` tokens from one bitmask row (for tests and checks)."""
    import torch

    ids = torch.arange(vocab_size)
    words = bitmask_row.to(torch.int64)[ids // 32]
    return ((words >> (ids % 32)) & 1).bool()


def default_fill_threads() -> int:
    """Threads a batched bitmask fill uses unless configured: half the CPUs this process may run
    on (the other half keeps the scheduler and the device's launches going), 1 to 16."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 2
    return max(1, min(16, cpus // 2))


def repeatable_key_count(schema: Any, *, additional_properties_default: bool) -> bool:
    """Whether a repeated key could meet the ``minProperties`` of the object schema ``schema`` (a
    dict; anything else: False): it asks for more than one property and more than its distinct
    ``required`` names, and keys outside ``properties`` are allowed (``patternProperties``, or
    ``additionalProperties`` other than false; ``additional_properties_default`` says whether a
    schema without it allows them: True in JSON Schema, False in xgrammar's strict mode).

    Grammars let such a key repeat, and count it each time: ``{"k":0,"k":1}`` meets
    ``minProperties: 2`` there and parses as one property. A backend refuses these schemas (or
    enforces them itself) rather than pass that output.

    .. versionadded:: 2.0
    """
    if not isinstance(schema, dict):
        return False
    least = schema.get("minProperties")
    if not isinstance(least, int) or isinstance(least, bool):
        return False
    additional = schema.get("additionalProperties", additional_properties_default)
    open_keys = "patternProperties" in schema or additional is not False
    required = schema.get("required")
    named = len({name for name in required if isinstance(name, str)}) if isinstance(required, list) else 0
    return open_keys and least > max(1, named)


#: what typically makes a grammar of each kind accept no text, for :func:`accepts_no_text`
_NO_TEXT_HINTS = {
    "json_schema": "a schema that only refers to itself, for one",
    "structural_tag": "a tag's schema that only refers to itself, for one",
    "regex": "a class that matches no character, such as [^\\s\\S], for one",
    "ebnf": "a rule that only refers to itself, for one",
}


def accepts_no_text(kind: str) -> str:
    """The message for a grammar of ``kind`` that no token can begin (a fresh matcher allows none
    and is not complete), with a hint at the usual cause that fits the kind: a schema that only
    refers to itself is no hint for a regex.

    .. versionadded:: 2.3 (no minor bump: a message, no behaviour of the API)
    """
    hint = _NO_TEXT_HINTS.get(kind)
    return f"the {kind} grammar accepts no text: no token can begin it" + (f" ({hint})" if hint else "")


def _format_regexes() -> dict[str, str]:
    year = "([0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"  # 0001-9999 (no year 0 in Python)
    leap_year = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
    month_day = (
        "((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"  # any month: days 1-28
        "|(0[13-9]|1[0-2])-(29|30)"  # any month but February: 29, 30
        "|(0[13578]|1[02])-31)"  # the months of 31 days
    )
    date = f"({year}-{month_day}|{leap_year}-02-29)"
    hour_minute = "([01][0-9]|2[0-3]):[0-5][0-9]"
    time = f"{hour_minute}:[0-5][0-9](\\.[0-9]+)?(Z|[+-]{hour_minute})"
    octet = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
    return {
        "date": f"^{date}$",
        "time": f"^{time}$",
        "date-time": f"^{date}T{time}$",
        "ipv4": f"^({octet}\\.){{3}}{octet}$",
    }


#: JSON Schema string format -> an anchored regex (ECMA-262, in the syntax xgrammar's and
#: llguidance's JSON-schema patterns read alike) matching only valid strings of it, for the formats
#: the libraries write too loosely: xgrammar 0.2.9 took day 31 in every month and an IPv4 octet with
#: a leading zero ("072.69.35.57", which Python's ``ipaddress`` refuses), llguidance 1.9 and
#: xgrammar took February 29 of 2023, and both second 60 at any minute. RFC 3339's ``full-date``,
#: ``full-time`` and ``date-time`` (Gregorian leap years, years 0001-9999, upper-case T and Z, no
#: leap second: a valid subset for every validator) and RFC 2673's dotted quad. A backend writes a
#: ``format`` named here as its regex (as a ``pattern``).
#:
#: .. versionadded:: 2.0 (after 2.0 was first tagged, with no minor bump: no released core lacks it)
FORMAT_REGEXES: dict[str, str] = _format_regexes()


class GrammarMatcher(ABC):
    """One request's position in its grammar. Not thread-safe; used by one engine step at a time."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by ``token_id``; False (and no change) when the grammar does not allow it."""

    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into ``bitmask[row]`` (a host int32 tensor, see the module)."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once the output is complete (the grammar accepted a stop token); nothing may follow."""

    @abstractmethod
    def reset(self) -> None:
        """Back to the start of the grammar, as freshly made."""


#: characters of grammar text whose compiled grammars a backend's cache keeps at most (beside
#: ``GrammarBackend.cache_size``), the oldest dropped first; the newest is always kept. What a
#: compiled grammar holds grows with its text: xgrammar keeps 120-200 bytes a character (an enum,
#: a regex alternation or an EBNF choice of 500,000 characters: 60-93 MB), so 256 of them at the
#: largest grammar a request may send (``SamplingParams.MAX_GRAMMAR_CHARS``) held some 24 GB; this
#: bound keeps the cache under 1 GB.
_CACHE_CHARS = 1 << 22


class GrammarBackend(ABC):
    """Compiles grammars for one tokenizer and makes matchers; registered by plugins with
    ``minisgl_register_grammar_backends`` and selected with ``--grammar-backend NAME``.

    Built once per process from the served Hugging Face tokenizer, the model's vocabulary size
    (the logits' width, which may exceed the tokenizer's: the extra ids are never allowed) and the
    model's stop token ids (end of sequence): a grammar allows a stop token exactly where the
    output may end, and accepting it terminates the matcher.
    """

    #: the grammar kinds this backend compiles; others raise GrammarError naming the backend
    capabilities: ClassVar[frozenset[str]] = frozenset()
    #: compiled grammars kept (least recently used dropped first; at most 4,194,304 characters of
    #: grammar text in all, whatever this says)
    cache_size: ClassVar[int] = 256

    def __init__(self, tokenizer: Any, *, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = tuple(stop_token_ids)
        self._cache: OrderedDict[GrammarSpec, Any] = OrderedDict()
        #: characters of the cached grammars' texts (bounded by _CACHE_CHARS)
        self._cache_chars = 0
        #: the engine compiles on other threads while its own reads the cache
        self._cache_lock = threading.Lock()
        #: compiles done (cache misses), for tests and the benchmarks
        self.compiles = 0
        #: threads :meth:`fill_bitmasks` may use; the engine sets it (``--grammar-threads``) before
        #: the first fill, so a backend reads it when it starts its pool, not here
        self.fill_threads = default_fill_threads()

    @classmethod
    def availability(cls) -> str | None:
        """``None`` when the backend can run here, else one line saying why not (e.g. what to
        ``pip install``). Must be cheap."""
        return None

    def compile(self, spec: GrammarSpec) -> Any:
        """The compiled grammar of ``spec``, from the cache when compiled before.

        Raises GrammarError saying what is wrong with the spec, or that this backend does not
        support its kind. Safe to call from several threads (the cache is locked, not the compile:
        two threads may compile one grammar at once)."""
        with self._cache_lock:
            cached = self._cache.get(spec)
            if cached is not None:
                self._cache.move_to_end(spec)
                return cached
        if spec.kind not in self.capabilities:
            supported = ", ".join(sorted(self.capabilities)) or "none"
            raise GrammarError(
                f"grammar backend {type(self).__name__} does not support {spec.kind!r} grammars (it supports: {supported})"
            )
        if spec.kind == "choice":
            spec.choices()  # the same error for every backend
        try:
            compiled = self.compile_uncached(spec)
        except GrammarError:
            raise
        except Exception as exc:  # noqa: BLE001 - a library's parse error is the spec's fault
            said = str(exc).strip() or f"{type(exc).__name__} with no message"
            raise GrammarError(f"invalid {spec.kind} grammar: {said}") from exc
        with self._cache_lock:
            self.compiles += 1
            if spec not in self._cache:  # (two threads may have compiled it)
                self._cache_chars += len(spec.value)
            self._cache[spec] = compiled
            self._cache.move_to_end(spec)
            while len(self._cache) > 1 and (
                len(self._cache) > self.cache_size or self._cache_chars > _CACHE_CHARS
            ):
                dropped, _ = self._cache.popitem(last=False)
                self._cache_chars -= len(dropped.value)
        return compiled

    def check(self, spec: GrammarSpec) -> None:
        """Raise GrammarError when ``spec`` is invalid; used at admission, before a request runs.

        The default compiles (and caches) it and, when it compiled it now, asks a fresh matcher
        which tokens may begin it: a grammar no token can begin (xgrammar's for a JSON schema
        that only refers to itself) would otherwise fail its request at the first step, after
        admission. A backend may override it with a cheaper parse."""
        before = self.compiles
        compiled = self.compile(spec)
        if self.compiles == before:  # checked when it was compiled
            return
        matcher = self.matcher(compiled)
        mask = allocate_token_bitmask(1, self.vocab_size)
        matcher.fill_bitmask(mask, 0)
        if not matcher.is_terminated() and not bool(allowed_tokens(mask[0], self.vocab_size).any()):
            with self._cache_lock:
                if self._cache.pop(spec, None) is not None:
                    self._cache_chars -= len(spec.value)
            raise GrammarError(accepts_no_text(spec.kind))

    @abstractmethod
    def compile_uncached(self, spec: GrammarSpec) -> Any:
        """Compile ``spec`` (its kind is in ``capabilities``); any exception becomes a GrammarError."""

    @abstractmethod
    def matcher(self, compiled: Any) -> GrammarMatcher:
        """A fresh matcher at the start of a compiled grammar."""

    def fill_bitmasks(
        self, matchers: Sequence[GrammarMatcher], bitmask: torch.Tensor, rows: Sequence[int]
    ) -> None:
        """Fill ``bitmask[rows[i]]`` for ``matchers[i]`` (this backend's, none terminated), as
        :meth:`GrammarMatcher.fill_bitmask` would one by one; rows not listed are left alone.

        The default does exactly that. A backend overrides it with its library's batched call
        (up to ``fill_threads`` threads, the GIL released): the engine calls it once per step
        with every constrained request. On an exception the engine fills the rows one by one to
        find the request at fault."""
        for matcher, row in zip(matchers, rows, strict=True):
            matcher.fill_bitmask(bitmask, row)

    def accept_tokens(self, matchers: Sequence[GrammarMatcher], token_ids: Sequence[int]) -> list[bool]:
        """Advance ``matchers[i]`` by ``token_ids[i]``; whether each accepted (as
        :meth:`GrammarMatcher.accept_token`). The default goes one by one. An exception fails every
        request of the call (some matchers may have moved, so none is tried again)."""
        return [matcher.accept_token(t) for matcher, t in zip(matchers, token_ids, strict=True)]
