"""The xgrammar grammar backend: every grammar kind, compiled for the served tokenizer."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from minisgl_core.api import GrammarBackend, GrammarError, GrammarMatcher, GrammarSpec, bitmask_width
from minisgl_core.api.grammar import accepts_no_text
from minisgl_plugin_xgrammar.byte_guard import ByteGuard
from minisgl_plugin_xgrammar.patterns import rewrite_printed, unambiguous_hex, xgrammar_regex
from minisgl_plugin_xgrammar.schema_checks import refuse_what_xgrammar_gets_wrong
from minisgl_plugin_xgrammar.schema_rewrites import rewrite_for_xgrammar

#: the largest grammar text (characters) admission compiles against the 256 bytes to see that some
#: text can begin it: 8,192 characters of JSON schema are about 300 properties, 0.05 s
BYTE_CHECK_MAX_CHARS = 8192


DEFAULT_COMPILE_THREADS = 8
#: most compile threads taken (as ``--grammar-threads``): 100,000 hung the first compile
MAX_COMPILE_THREADS = 64


def compile_threads(value: str | None) -> int:
    """The threads xgrammar compiles one grammar with (it splits the vocabulary among them):
    ``MINISGL_XGRAMMAR_THREADS``, an integer in [1, 64], else 8. Another value is logged and 8
    used: an ``int()`` of it had failed the plugin's import, taking the default grammar backend
    away, and a huge one hung or failed the first compile."""
    if value is None or value.strip() == "":
        return DEFAULT_COMPILE_THREADS
    try:
        threads = int(value)
    except ValueError:
        threads = 0
    if not 1 <= threads <= MAX_COMPILE_THREADS:
        logging.getLogger(__name__).warning(
            "MINISGL_XGRAMMAR_THREADS=%r is not an integer in [1, %d]; compiling grammars with %d threads",
            value,
            MAX_COMPILE_THREADS,
            DEFAULT_COMPILE_THREADS,
        )
        return DEFAULT_COMPILE_THREADS
    return threads


_COMPILE_THREADS = compile_threads(os.environ.get("MINISGL_XGRAMMAR_THREADS"))


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


class XGrammarMatcher(GrammarMatcher):
    def __init__(self, matcher: Any, guard: ByteGuard) -> None:
        self._matcher = matcher
        self._guard = guard
        #: the lead byte the last accepted token ended in, where it limits the next byte
        self._after_lead: int | None = None

    def accept_token(self, token_id: int) -> bool:
        accepted = bool(self._matcher.accept_token(token_id))
        if accepted:
            self._after_lead = self._guard.lead_ids.get(token_id)
        return accepted

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)
        bitmask[row] &= self._guard.always
        if self._after_lead is not None:
            bitmask[row] &= self._guard.after_lead[self._after_lead]

    def is_terminated(self) -> bool:
        return bool(self._matcher.is_terminated())

    def reset(self) -> None:
        self._matcher.reset()
        self._after_lead = None


def special_token_ids(tokenizer: Any) -> set[int]:
    """The ids of ``tokenizer``'s special tokens: those decoding with ``skip_special_tokens``
    drops (its added tokens marked special, and ``all_special_ids``)."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return {int(i) for i, token in added.items() if getattr(token, "special", False)} | set(
        getattr(tokenizer, "all_special_ids", ())
    )


def _special_tokens_apart(xgrammar: Any, info: Any, tokenizer: Any, vocab_size: int) -> Any:
    """``info`` with the tokenizer's special tokens as xgrammar's special tokens (no text), not
    as the text they are spelled with: xgrammar (0.2.9) read ``<|im_end|>`` as 10 characters, which
    ``.+`` and ``[^\\n]+`` match, so the stop token was allowed where the grammar could not end
    (an empty answer to the regex ``.+``, "x" to the EBNF ``"x" [^\\n]+``), and another special
    token passed as text that the detokenizer then drops. The stop tokens stay stop tokens."""
    special = {i for i in special_token_ids(tokenizer) if 0 <= i < vocab_size}
    if special <= set(info.special_token_ids):  # (xgrammar's own: no text; decoded_vocab copies it all)
        return info
    encoded: list[str] = [""] * vocab_size
    for token, i in tokenizer.get_vocab().items():
        if i < vocab_size and i not in special:
            encoded[i] = token
    return xgrammar.TokenizerInfo.from_vocab_and_metadata(encoded, info.dump_metadata())


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
        info = _special_tokens_apart(xgrammar, info, tokenizer, vocab_size)
        # our own cache (GrammarBackend.compile) keeps compiled grammars; no second one inside
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=_COMPILE_THREADS, cache_enabled=False)
        #: grammars compiled against the 256 bytes, to see whether any text can begin one (check)
        self._byte_compiler: Any = None
        #: specs that parsed (check), so admission parses each distinct grammar once
        self._checked: set[GrammarSpec] = set()
        decoded = info.decoded_vocab  # (a copy of the whole vocabulary each time it is read)
        self._json_guard = ByteGuard(decoded, vocab_size, control=True)
        self._text_guard = ByteGuard(decoded, vocab_size, control=False)
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
        """AND each matcher's guard into its row (after xgrammar filled them): the JSON guard into
        the JSON matchers' rows, the text guard into the others'."""
        for guard in (self._json_guard, self._text_guard):
            pairs = [(m, row) for m, row in zip(matchers, rows) if m._guard is guard]  # type: ignore[attr-defined]
            after = [(row, m._after_lead) for m, row in pairs if m._after_lead is not None]  # type: ignore[attr-defined]
            guard.apply(bitmask, [row for _, row in pairs], after)

    def accept_tokens(self, matchers: Sequence[GrammarMatcher], token_ids: Sequence[int]) -> list[bool]:
        """One call into xgrammar for every matcher (no Python per token), then the guards' state."""
        if not hasattr(self._xgr, "BatchGrammarMatcher"):
            return super().accept_tokens(matchers, token_ids)
        inner = [m._matcher for m in matchers]  # type: ignore[attr-defined]
        accepted = self._xgr.BatchGrammarMatcher.batch_accept_token(inner, list(token_ids))
        for matcher, token, ok in zip(matchers, token_ids, accepted):
            if ok:
                matcher._after_lead = matcher._guard.lead_ids.get(token)  # type: ignore[attr-defined]
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
            raise GrammarError(f"invalid {spec.kind} grammar: {library_message(exc)}") from exc
        if not begins:
            raise GrammarError(accepts_no_text(spec.kind))
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
        guard = self._json_guard if compiled.json else self._text_guard
        return XGrammarMatcher(self._xgr.GrammarMatcher(compiled.grammar), guard)

    def _grammar(self, spec: GrammarSpec) -> Any:
        try:
            return self._parse(spec)
        except RuntimeError as exc:  # xgrammar's parse errors: what is wrong, behind C++ noise
            raise GrammarError(
                f"invalid {spec.kind} grammar: {library_message(exc)}{_lark_hint(spec)}"
            ) from exc

    def _compact_json(self, schema: Any) -> str:
        """The EBNF of ``schema`` (checked and rewritten) as a ``json_schema`` grammar compiles it:
        compact, strict, and a string of limited length written as :func:`strict_limited_strings`
        writes it (no raw control character: the JSON guard forbids them elsewhere, but a tag's free
        text may hold them, and a raw NUL came out inside a tag's JSON)."""
        text = json.dumps(schema, ensure_ascii=False)
        grammar = self._xgr.Grammar.from_json_schema(
            text, any_whitespace=False, separators=(",", ":"), strict_mode=True
        )
        return unambiguous_hex(rewrite_printed(str(grammar)))

    def _parse(self, spec: GrammarSpec) -> Any:
        grammar = self._xgr.Grammar
        if spec.kind == "json_schema":
            _check_json(spec.value, "json_schema")
            schema = json.loads(spec.value)
            refuse_what_xgrammar_gets_wrong(schema)
            rewritten = rewrite_for_xgrammar(schema)
            # ensure_ascii=False: xgrammar leaves nothing after an escaped surrogate pair
            text = json.dumps(schema, ensure_ascii=False) if rewritten else spec.value
            # compact output (no free whitespace): a weak model cannot stall in an endless run of spaces
            compiled = grammar.from_json_schema(
                text, any_whitespace=False, separators=(",", ":"), strict_mode=True
            )
            ebnf = str(compiled)
            plain = rewrite_printed(ebnf)
            return compiled if plain == ebnf else grammar.from_ebnf(unambiguous_hex(plain))
        if spec.kind == "json_object":
            return grammar.from_ebnf(JSON_OBJECT_EBNF)
        if spec.kind == "regex":
            return grammar.from_regex(xgrammar_regex(spec.value))
        if spec.kind == "choice":
            options = spec.choices()
            return grammar.from_ebnf(
                "root ::= " + " | ".join(json.dumps(o, ensure_ascii=False) for o in options)
            )
        if spec.kind == "ebnf":
            return grammar.from_ebnf(spec.value)
        if spec.kind == "structural_tag":
            _check_json(spec.value, "structural_tag")
            tag = structural_tag(json.loads(spec.value), compact=self._compact_json)
            return grammar.from_structural_tag(json.dumps(tag, ensure_ascii=False))
        raise GrammarError(f"xgrammar backend: unsupported grammar kind {spec.kind!r}")


_JSON_KINDS = frozenset({"json_schema", "json_object"})
#: a Lark rule's head at a line's start (``start: ...``, ``?value: ...``), which GBNF writes ``::=``
_LARK_RULE = re.compile(r"^\s*[?!]?[A-Za-z_]\w*(\.\d+)?\s*:(?!:)", re.MULTILINE)


def _lark_hint(spec: GrammarSpec) -> str:
    """What to write instead, for an ebnf grammar in Lark's syntax (vLLM takes Lark and converts
    it; its users send ``start: ...`` and got only xgrammar's "Unexpected character: ':'")."""
    if spec.kind != "ebnf" or "::=" in spec.value or not _LARK_RULE.search(spec.value):
        return ""
    return (
        " (it reads as Lark, \"start: ...\"; the grammar is GBNF, as llama.cpp's and xgrammar's: rules "
        "written name ::= ..., starting from the rule named root)"
    )


def structural_tag(tag: Any, compact: Callable[[Any], str] | None = None) -> Any:
    """The structural tag xgrammar compiles for ``tag`` (parsed JSON): vLLM's older form
    (``{"structures": [{"begin", "schema", "end"}], "triggers": [...]}``, which xgrammar 0.2 refuses
    for want of a "format") written as triggered tags, and each JSON schema in it checked and
    rewritten as a ``json_schema`` grammar's is (xgrammar compiled them as given: ``[1,1]`` passed
    ``uniqueItems``, "2023-11-31" a ``date``). A schema it refuses is a GrammarError naming where
    in the tag it is. With ``compact`` (schema -> EBNF), JSON contents in plain JSON style become
    that grammar: xgrammar writes a tag's JSON with free whitespace, in which a random model ran
    to its token limit ("<f>{" and spaces), where a ``json_schema`` grammar has none. A ``regex``
    content is written as a regex grammar is (:func:`xgrammar_regex`)."""
    legacy = isinstance(tag, dict) and "format" not in tag and isinstance(tag.get("structures"), list)
    if legacy:
        tags = [
            {"type": "tag", "begin": item.get("begin"), "end": item.get("end"),
             "content": {"type": "json_schema", "json_schema": item.get("schema", True)}}
            if isinstance(item, dict) else item
            for item in tag["structures"]
        ]  # fmt: skip
        tag = {
            "type": "structural_tag",
            "format": {"type": "triggered_tags", "triggers": tag.get("triggers"), "tags": tags},
        }
    stack: list[tuple[Any, str]] = [(tag, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, list):
            stack += [(item, f"{where}/{i}") for i, item in enumerate(node)]
        elif isinstance(node, dict):
            if isinstance(node.get("json_schema"), dict):  # a schema: checked here, not walked as a tag
                try:
                    refuse_what_xgrammar_gets_wrong(node["json_schema"])
                    rewrite_for_xgrammar(node["json_schema"])  # (it refuses a $ref it cannot keep)
                except GrammarError as exc:
                    named = f"{where}/json_schema"
                    if legacy:  # where the user wrote it
                        named = re.sub(
                            r"^/format/tags/(\d+)/content/json_schema$", r"/structures/\1/schema", named
                        )
                    raise GrammarError(
                        f"structural_tag: the schema at {named}: " + str(exc).removeprefix("json_schema: ")
                    ) from None
                plain = node.get("type") == "json_schema" and node.get("style", "json") == "json"
                if compact is not None and plain and not node.get("any_order"):
                    grammar = compact(node["json_schema"])
                    node.clear()
                    node.update({"type": "grammar", "grammar": grammar})
                else:
                    stack += [
                        (value, f"{where}/{key}") for key, value in node.items() if key != "json_schema"
                    ]
            else:
                if node.get("type") == "regex" and isinstance(node.get("pattern"), str):
                    what = f"structural_tag: the regex at {where}/pattern"
                    node["pattern"] = xgrammar_regex(node["pattern"], what=what)
                stack += [(value, f"{where}/{key}") for key, value in node.items()]
    return tag


class _Compiled(NamedTuple):
    grammar: Any
    #: JSON output: the matcher takes the JSON guard (a ByteGuard that also forbids control bytes)
    json: bool


#: what xgrammar puts before its messages: "[05:08:01] /project/cpp/regex_converter.cc:83: " and, for
#: a failed assertion, "Check failed: (val <= MAX_INT64_AS_DOUBLE) is false: "
_LIBRARY_NOISE = re.compile(r"^\[\d\d:\d\d:\d\d\] \S+:\d+: |Check failed: \(.*?\) is false: ")


def library_message(exc: Exception) -> str:
    """xgrammar's error message without its time stamp, source location and assertion text; where
    that leaves nothing (10**400 in a schema raised RuntimeError('')), what was raised."""
    return _LIBRARY_NOISE.sub("", str(exc)).strip() or f"xgrammar raised {type(exc).__name__} with no message"


def _check_json(text: str, what: str) -> None:
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise GrammarError(f"{what} is not valid JSON: {exc}") from exc
