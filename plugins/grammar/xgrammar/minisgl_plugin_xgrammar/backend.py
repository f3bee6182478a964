"""The xgrammar grammar backend: every grammar kind, compiled for the served tokenizer."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from minisgl_core.api import GrammarBackend, GrammarError, GrammarMatcher, GrammarSpec, bitmask_width
from minisgl_core.api.ecma_regex import class_atoms, class_end, ecma_dot, paired_surrogates, read_escape
from minisgl_core.api.grammar import FORMAT_REGEXES, repeatable_key_count

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


class ByteGuard:
    """Tokens xgrammar 0.2 lets through that no text holds, forbidden in every matcher: byte pairs
    that are not UTF-8 (:data:`_NOT_UTF8`: its regex classes, ``.`` and ``[^...]``, took the
    overlong forms 0xE0 0x80-0x9F and 0xF0 0x80-0x8F, which decode to three or four U+FFFD and
    broke the pattern; surrogates, 0xED 0xA0-0xBF, in JSON strings) and, for JSON matchers
    (``control``), raw control characters (in strings with maxLength; compact JSON never needs
    one). Each token holding one is forbidden, and after a token that ends in one of those lead
    bytes, every token whose first byte may not follow it. Bitmask rows, ANDed into what xgrammar
    fills."""

    def __init__(self, decoded_vocab: Sequence[bytes], vocab_size: int, *, control: bool) -> None:
        self.decoded_vocab = decoded_vocab
        self.always = _bitmask_row(vocab_size, decoded_vocab, _json_unsafe if control else _not_utf8)
        #: lead byte -> the row forbidding the tokens that may not follow it
        self.after_lead = {
            lead: _bitmask_row(
                vocab_size, decoded_vocab, lambda raw, bad=bad: raw[:1] != b"" and raw[0] in bad
            )
            for lead, bad in _BAD_SECOND_BYTES.items()
        }
        #: the ids of the tokens that end in such a lead byte, with it (few: one lookup per token)
        self.lead_ids = {
            i: raw[-1] for i, raw in enumerate(decoded_vocab) if raw[-1:] and raw[-1] in _BAD_SECOND_BYTES
        }

    def apply(
        self, bitmask: torch.Tensor, rows: Sequence[int], after_lead: Sequence[tuple[int, int]]
    ) -> None:
        """AND the guard into ``bitmask[rows]`` (one vectorized AND for all of them, in place;
        a contiguous run of rows is ANDed as one block) and, for each ``(row, lead byte)`` of
        ``after_lead``, what may follow that byte."""
        if not rows:
            return
        words = bitmask.numpy()  # a view: the AND runs in numpy, in place, without torch's dispatch
        first, count = rows[0], len(rows)
        always = self.always.numpy()
        if rows[-1] - first + 1 == count and all(b - a == 1 for a, b in zip(rows, rows[1:])):
            block = words[first : first + count]
            np.bitwise_and(block, always, out=block)
        else:
            index = np.asarray(rows, dtype=np.int64)
            words[index] &= always
        for row, lead in after_lead:
            np.bitwise_and(words[row], self.after_lead[lead].numpy(), out=words[row])


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
        guard = self._json_guard if compiled.json else self._text_guard
        return XGrammarMatcher(self._xgr.GrammarMatcher(compiled.grammar), guard)

    def _grammar(self, spec: GrammarSpec) -> Any:
        try:
            return self._parse(spec)
        except RuntimeError as exc:  # xgrammar's parse errors: what is wrong, behind C++ noise
            raise GrammarError(f"invalid {spec.kind} grammar: {library_message(exc)}") from exc

    def _compact_json(self, schema: Any) -> str:
        """The EBNF of ``schema`` (checked and rewritten) as a ``json_schema`` grammar compiles it:
        compact, strict, and a string of limited length written as :func:`strict_limited_strings`
        writes it (no raw control character: the JSON guard forbids them elsewhere, but a tag's free
        text may hold them, and a raw NUL came out inside a tag's JSON)."""
        text = json.dumps(schema, ensure_ascii=False)
        grammar = self._xgr.Grammar.from_json_schema(
            text, any_whitespace=False, separators=(",", ":"), strict_mode=True
        )
        return unambiguous_hex(_rewrite_printed(str(grammar)))

    def _parse(self, spec: GrammarSpec) -> Any:
        grammar = self._xgr.Grammar
        if spec.kind == "json_schema":
            _check_json(spec.value, "json_schema")
            schema = json.loads(spec.value)
            _refuse_what_xgrammar_gets_wrong(schema)
            rewritten = _rewrite_for_xgrammar(schema)
            # ensure_ascii=False: xgrammar leaves nothing after an escaped surrogate pair
            text = json.dumps(schema, ensure_ascii=False) if rewritten else spec.value
            # compact output (no free whitespace): a weak model cannot stall in an endless run of spaces
            compiled = grammar.from_json_schema(
                text, any_whitespace=False, separators=(",", ":"), strict_mode=True
            )
            ebnf = str(compiled)
            plain = _rewrite_printed(ebnf)
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


#: a ``pattern``'s rule as xgrammar (0.2.9) prints it: ``Regex("...", json_string=true)``
_JSON_STRING_REGEX = re.compile(r'(Regex\("(?:[^"\\]|\\.)*"), json_string=true\)')


#: a two-digit hex escape as xgrammar (0.2.9) prints a character U+0080-U+00FF (and control
#: characters in classes), not after an escaped backslash
_PRINTED_HEX = re.compile(r"(?<!\\)((?:\\\\)*)\\x([0-9a-fA-F]{2})")


def unambiguous_hex(ebnf: str) -> str:
    """``ebnf`` as xgrammar printed it, each ``\\xNN`` written ``\\u00NN``, so that it parses back
    to the same characters: xgrammar's EBNF parser reads every hex digit after ``\\x``, and its
    printer writes "é0" as ``"\\xe90"``, which came back as U+0E90 ("ຐ"). Every grammar the
    backend prints and parses again goes through it (a schema with a ``pattern``, and every
    structural tag's JSON): their strings and names with such a character before a hex digit
    were generated wrong (a cross-backend probe, 2026-12-01)."""
    return _PRINTED_HEX.sub(r"\1\\u00\2", ebnf)


def xgrammar_hex_escapes(pattern: str) -> str:
    """``pattern`` (an ECMA-262 regex) with its escapes written so that xgrammar's regex converter
    reads them as ECMA-262 does. It reads every hex digit after ``\\x`` (``\\x410``, "A0",
    matched U+0410), and in a class it writes an escaped member it prints as ``\\xNN`` (U+0001-U+001F,
    U+007F-U+00FF but a tab and line breaks) into the class's text and parses that again, with
    the member after it:
    ``[\\u00e9a]`` was U+0E9A, ``[^\\u0000-\\u001f0]`` refused "a". So ``\\xHH`` becomes ``\\u00HH``, and
    such a member in a class its raw character (no syntax in a class)."""
    out: list[str] = []
    i = class_stop = 0  # the index after the class ``i`` is in (0: none yet)
    while i < len(pattern):
        if pattern[i] == "[" and i >= class_stop:
            class_stop = class_end(pattern, i) or len(pattern)
        if pattern[i] != "\\":
            out.append(pattern[i])
            i += 1
            continue
        in_class = i < class_stop
        text, code = read_escape(pattern, i, in_class=in_class)
        i += len(text)
        if (
            in_class
            and code is not None
            and (0x01 <= code < 0x20 or 0x7F <= code < 0x100)
            and code not in (9, 10, 13)
        ):
            out.append(chr(code))
        elif text[1:2] == "x" and len(text) == 4 and code is not None:
            out.append(f"\\u{code:04x}")
        else:
            out.append(text)
    return "".join(out)


def _rewrite_printed(ebnf: str) -> str:
    """A JSON schema's grammar as xgrammar printed it, with the rules it gets wrong rewritten
    (:func:`_plain_pattern_rules`, :func:`strict_limited_strings`); parse it again only after
    :func:`unambiguous_hex`."""
    return strict_limited_strings(_plain_pattern_rules(ebnf))


def _plain_pattern_rules(ebnf: str) -> str:
    """``ebnf`` (a JSON schema's grammar) with each string pattern's rule a plain regex over the
    string's JSON text. xgrammar marks those rules ``json_string`` and then lets no branch through
    that names a JSON escape: ``[a"]`` (written ``(?:[a]|\\")`` by :func:`xgrammar_pattern`) took
    "a" and never a quote, ``^(?:b|\\\\)+$`` "b" and never a backslash. The patterns are written
    for the JSON text already (no raw quote, backslash or control character can match)."""
    return _JSON_STRING_REGEX.sub(r"\1)", ebnf)


#: the class xgrammar (0.2.9) prints a length-limited JSON string's characters with: no escape
#: (a quote, a backslash, a line break could not be written at all), raw control characters allowed
_LIMITED_STRING_CHARACTERS = r"[^\"\\\r\n]"
#: that class as the body of a limited string's character rule, as printed
_LIMITED_CHARACTER_RULE = re.compile(
    r"(_characters ::= )\(\(" + re.escape(_LIMITED_STRING_CHARACTERS) + r"\)\)$", re.M
)
#: a string of at most one character has no such rule: xgrammar writes the class in place, as
#: ``("" | ([^"\\\r\n]))`` (``maxLength: 1``) or ``"\"" [^"\\\r\n] "\""`` (exactly one)
_ONE_CHARACTER = re.compile(
    r"(\(\"\" \| \(|\"\\\"\" )" + re.escape(_LIMITED_STRING_CHARACTERS) + r"(?=\)\)| \"\\\"\")"
)
#: one character of a one-character string: a plain one (no control character) or one JSON escape
#: (an escaped surrogate pair would count two: never more than allowed)
_CHARACTER_OR_ESCAPE = (
    r'(([^\"\\\0-\x1f]) | ("\\" ([\"\\/bfnrt] | ("u" [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9]))))'
)
#: the character rule the backend writes for a repeated one: a plain character, no escape. With
#: :data:`_CHARACTER_OR_ESCAPE` repeated (``{0, 100}``, as from 3b3bdd5) xgrammar filled a
#: 49k-token mask in 16-22 ms a token, against 0.2-0.3 ms with a class (SmolLM2's vocabulary,
#: 2026-12-01): such a string takes no escape
_PLAIN_CHARACTER = r"(([^\"\\\0-\x1f]))"


def strict_limited_strings(ebnf: str) -> str:
    """``ebnf`` (a JSON schema's grammar as xgrammar printed it) with no raw control character in a
    length-limited string (``minLength``/``maxLength``): xgrammar's class took them, which JSON
    forbids (a raw NUL came out inside a tag's JSON). Its repeated character rule stays a class
    (:data:`_PLAIN_CHARACTER`: no escape, so no quote, backslash or line break in such a string; a
    rule taking escapes made xgrammar's masks 50-100 times slower); a string of at most one
    character, whose class stands in place of the rule (:data:`_ONE_CHARACTER`), takes one JSON
    escape too (:data:`_CHARACTER_OR_ESCAPE`: a one-character delimiter may be ``"\\t"``)."""
    ebnf = _LIMITED_CHARACTER_RULE.sub(lambda m: m.group(1) + _PLAIN_CHARACTER, ebnf)
    return _ONE_CHARACTER.sub(lambda m: m.group(1) + _CHARACTER_OR_ESCAPE, ebnf)


def _rewrite_for_xgrammar(schema: Any) -> bool:
    """The rewrites a checked schema gets before xgrammar compiles it, in place; whether any
    changed it."""
    return (
        apply_siblings_to_choices(schema)
        | whole_integer_bounds(schema)
        | exact_formats(schema)
        | exact_patterns(schema)
        | moot_property_names(schema)
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
                    _refuse_what_xgrammar_gets_wrong(node["json_schema"])
                except GrammarError as exc:
                    named = f"{where}/json_schema"
                    if legacy:  # where the user wrote it
                        named = re.sub(
                            r"^/format/tags/(\d+)/content/json_schema$", r"/structures/\1/schema", named
                        )
                    raise GrammarError(
                        f"structural_tag: the schema at {named}: " + str(exc).removeprefix("json_schema: ")
                    ) from None
                _rewrite_for_xgrammar(node["json_schema"])
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


#: the deepest a JSON schema may nest schemas in schemas (the root is level 1). xgrammar's
#: conversion of a schema grows with the cube of its depth (two cores, objects in objects each
#: with a required property: 0.05 s at 64 levels, 0.37 s at 128, 12.5 s at 450), and runs in the
#: tokenizer process, where a 450-deep schema held every request's admission for 12 s. llguidance
#: refuses past about 63 (serde_json's limit of 128 levels of JSON); users rarely go past 20.
MAX_SCHEMA_DEPTH = 64

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
#: string formats xgrammar writes out as a regex, dropping minLength and maxLength beside them (as
#: beside a pattern); it enforces the limits beside any other format, which it ignores
_FORMATS_IGNORING_LENGTH = frozenset(
    {
        "date",
        "time",
        "date-time",
        "duration",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "uri",
        "uri-reference",
        "uuid",
        "json-pointer",
        "relative-json-pointer",
        "uri-template",
    }
)
#: keywords xgrammar compiles alone: a schema holding one of them has every other keyword in it
#: dropped (a random-schema probe, 2026-11-30: 0 and 1 passed ``{"anyOf": [{"type": "integer",
#: "minimum": 0, "maximum": 3}], "minimum": 2}``, strings ``{"$ref": ..., "type": "integer"}``);
#: ``enum`` and ``const`` are too, and have their values filtered instead
#: (:func:`apply_siblings_to_choices`)
_TAKEN_ALONE = ("$ref", "anyOf", "oneOf", "allOf")
#: the JSON Schema keywords that assert something of a value (annotations, containers such as
#: ``$defs`` and other dialects' keys, ``discriminator`` or ``nullable``, assert nothing)
_ASSERTIONS = frozenset(
    {
        "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
        "maxLength", "minLength", "pattern", "format", "maxItems", "minItems", "uniqueItems", "maxContains",
        "minContains", "contains", "items", "prefixItems", "additionalItems", "unevaluatedItems",
        "maxProperties", "minProperties", "required", "properties", "patternProperties",
        "additionalProperties", "unevaluatedProperties", "propertyNames", "dependentRequired",
        "dependentSchemas", "dependencies", "if", "then", "else", "not", "allOf", "anyOf", "oneOf", "$ref",
        "$dynamicRef", "$recursiveRef",
    }
)  # fmt: skip
#: seconds the patterns beside one ``enum``/``const`` may take to check its values
PATTERN_CHECK_S = 0.5
#: drafts in which ``$ref`` overrides the keywords beside it, as xgrammar reads every schema
_REF_ALONE_DRAFTS = ("draft-03", "draft-04", "draft-06", "draft-07")
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


def _refuse_what_xgrammar_gets_wrong(schema: Any) -> None:
    """GrammarError for a schema xgrammar would compile into a grammar passing output that breaks
    it: nested deeper than MAX_SCHEMA_DEPTH (checked first: the other walks recurse), a part
    accepting no value, a keyword it does not enforce."""
    deep = too_deep(schema)
    if deep is not None:
        raise GrammarError(
            f"json_schema: nested deeper than {MAX_SCHEMA_DEPTH} levels at {deep} (the xgrammar "
            "backend takes schemas in schemas up to that depth: its compile time grows with the cube "
            "of the depth)"
        )
    wrong = invalid_values(schema)
    if wrong:
        raise GrammarError("json_schema: " + _first_five(wrong))
    empty = accepting_nothing(schema)
    if empty:
        raise GrammarError(
            "json_schema: part of the schema accepts no value, as the schema false: "
            + _first_five(empty)
            + " (the answer could not be valid)"
        )
    unenforced = unenforced_keywords(schema)
    if unenforced:
        raise GrammarError(
            "json_schema: the xgrammar backend cannot enforce "
            + _first_five(unenforced)
            + " (it would pass output that breaks them): remove them from the schema"
        )


#: keywords whose value JSON Schema makes a non-negative integer: xgrammar took minLength -1 (its
#: compile then failed inside the engine) and minItems -1 (a grammar allowing only [])
_COUNT_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
#: regex features xgrammar's converter refuses, which beside "pattern" it let through unenforced
_LOOKAROUND = re.compile(r"\(\?<?[=!]")


def invalid_values(schema: Any) -> list[str]:
    """Keyword values of ``schema`` that JSON Schema does not allow or xgrammar cannot follow, each
    as "... at PATH": a count that is not a non-negative integer (xgrammar refuses 2.0 itself), a ``$ref`` to
    anything but this document (``#...``: xgrammar fetches nothing and answered with no constraint
    at all), a ``pattern`` with a lookaround (its regex converter has none), and an integer's bound
    past 64-bit integers (xgrammar refused it in its own words, or with no words for 1e400)."""
    found = _unreadable_numbers(schema)
    for sub, path, _ in _walk(schema):
        for key in _COUNT_KEYWORDS:
            value = sub.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                found.append(f"{key!r} must be a non-negative integer, got {value!r} at {path}")
        ref = sub.get("$ref")
        if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
            found.append(
                f"'$ref' {ref!r} is not in this schema (only '#...' references are followed) at {path}"
            )
        pattern = sub.get("pattern")
        if isinstance(pattern, str) and _LOOKAROUND.search(pattern):
            found.append(
                f"'pattern' {pattern!r} has a lookaround, which the xgrammar backend cannot follow, at {path}"
            )
        if _integer_only(sub):
            found += [
                f"{key!r} {_shown(sub[key])} is beyond the 64-bit integers (-2**63 to 2**63-1) the xgrammar "
                f"backend takes as an integer's bounds, at {path}"
                for key in _RANGE_KEYWORDS
                if _readable(sub.get(key)) and not _INT64_MIN <= sub[key] <= _INT64_MAX
            ]
    return found


def _readable(value: Any) -> bool:
    """Whether ``value`` is a number a 64-bit float holds (xgrammar reads every JSON number as one)."""
    if isinstance(value, float):
        return math.isfinite(value)
    return _is_number(value) and abs(value) <= _FLOAT_MAX


_FLOAT_MAX = int(sys.float_info.max)


def _unreadable_numbers(schema: Any) -> list[str]:
    """Each number in ``schema`` (a keyword's value or data: ``const``, ``enum``) past what a 64-bit
    float holds, as "'KEY' VALUE is beyond ... at PATH": xgrammar failed on 10**400 or 1e400 (which
    Python reads as infinity) with an empty message, answered "invalid json_schema grammar: "."""
    found = []
    stack: list[tuple[Any, str, str]] = [(schema, "#", "")]  # (value, path, its keyword); no recursion
    while stack:
        value, path, key = stack.pop()
        if isinstance(value, dict):
            stack += [(v, f"{path}/{k}", str(k)) for k, v in reversed(value.items())]
        elif isinstance(value, list):
            stack += [(v, f"{path}/{i}", key) for i, v in reversed(list(enumerate(value)))]
        elif _is_number(value) and not _readable(value):
            found.append(
                f"{key!r} {_shown(value)} is beyond the numbers a 64-bit float holds (xgrammar reads "
                f"every number as one), at {path}"
            )
    return found


#: the integers xgrammar takes as an integer's bounds (past them: "Integer exceeds maximum limit")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer_only(schema: dict) -> bool:
    """Whether ``schema`` allows integers and no other numbers (its bounds then bound integers)."""
    types = schema.get("type")
    return types == "integer" or (isinstance(types, list) and "integer" in types and "number" not in types)


def _shown(value: float) -> str:
    """A number for a message: an integer of hundreds of digits shortened, infinity explained."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} (or a number past a 64-bit float, such as 1e400)"
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text.lstrip('-'))} digits)"


#: how each bound of an integer rounds to the whole bound that allows the same integers
_WHOLE_BOUNDS = (
    ("minimum", math.ceil),
    ("maximum", math.floor),
    ("exclusiveMinimum", math.floor),
    ("exclusiveMaximum", math.ceil),
)


def xgrammar_regex(pattern: str, what: str = "regex") -> str:
    """A regex grammar (or a structural tag's regex) as xgrammar must be given it to read it as
    ECMA-262 does: UTF-16 surrogates as :func:`paired_surrogates` writes them, ``.`` as
    :func:`~minisgl_core.api.ecma_regex.ecma_dot` does (xgrammar's took line breaks: ``.+`` wrote
    several lines), ``\\xHH`` as :func:`xgrammar_hex_escapes` does."""
    return xgrammar_hex_escapes(ecma_dot(paired_surrogates(pattern, what=what)))


def xgrammar_pattern(pattern: str) -> str:
    """``pattern`` as xgrammar must be given it to match the JSON text of the strings ``pattern``
    matches. Two things xgrammar's converter of JSON-schema patterns (not its regex grammars) gets
    wrong are written around:

    - a group's ``?`` (or lazy ``??``) made the group's first part optional too when the group
      holds a quantifier: ``^a(x5+)?$`` took "a5", ``(\\.[0-9]+)?`` a fraction without its dot (a
      differential probe against Python's ``re``, 2026-12-01: 14 of 400 random patterns; none left
      with ``{0,1}`` written instead);
    - characters a JSON string must escape (``"``, a backslash, control characters). xgrammar
      matches the pattern against the string's JSON text: it keeps what the pattern allows
      without those characters, and where that is nothing (the pattern requires one), the pattern
      as written, raw: ``^"$`` gave three quotes (not JSON), a backslash one lone backslash, ``\\t``
      a raw tab, ``[\\x00-\\x1f]`` raw control characters. Each such character the pattern names
      is written as its JSON escape (``(?:\\\\")``, ``(?:\\\\n)``, ``(?:\\\\u001f)``), a positive class
      that names them becomes the rest of the class or'ed with their escapes, and ``.``, negated
      classes and class escapes leave them out (``\\D``, ``\\W`` and ``\\S`` inside a class spelled as
      ranges: written as they were, they let a raw quote or backslash into the JSON text,
      2026-12-01), so that the pattern holds JSON text either way. Those stay classes: or'ed with
      escapes under a bounded repetition (``.{1,80}``) xgrammar's masks took 16 ms a token. The
      rule is then compiled as a plain regex (:func:`_plain_pattern_rules`: xgrammar's own
      JSON-string regex dropped the escapes beside characters that need none, ``[a"]`` wrote "a"
      only).

    UTF-16 surrogates are handled first, as in a regex grammar (:func:`paired_surrogates`: an
    escaped pair is its character; ``^\\ud83d\\ude00$`` failed mid-answer), and ``\\xHH`` escapes
    are written ``\\u00HH`` last (:func:`xgrammar_hex_escapes`: xgrammar read ``\\x410`` as U+0410).

    :class:`GrammarError` for a lone surrogate."""
    pattern = paired_surrogates(pattern, what="json_schema pattern")
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "[":
            end = class_end(pattern, i)
            if end is None:  # unterminated: xgrammar refuses it in its own words
                out.append(pattern[i:])
                break
            out.append(_json_class(pattern[i:end]))
            i = end
            continue
        if char == "\\":
            text, code = read_escape(pattern, i, in_class=False)
            i += len(text)
            if code is not None and _must_escape(code):
                out.append(_json_escape(code))
            else:
                out.append(_JSON_CLASS_ESCAPES.get(text, text))
            continue
        i += 1
        if char == ".":
            out.append(_JSON_DOT)
        elif _must_escape(ord(char)):
            out.append(_json_escape(ord(char)))
        else:
            out.append(char)
        if char == ")" and pattern.startswith("?", i):
            out.append("{0,1}")
            i += 2 if pattern.startswith("??", i) else 1
    return xgrammar_hex_escapes("".join(out))


#: the characters a JSON string must escape, as class members
_ESCAPED_MEMBERS = '\\x00-\\x1f"\\\\'
#: ECMA-262's white space and line terminators other than control characters, as class members
_WIDE_SPACE = "\\u0020\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff"
#: the same as code point ranges
_WIDE_SPACE_RANGES = [(0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029),
                      (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)]  # fmt: skip
#: what each class escape matches among the rest, as ranges (the complements spelled out, so that
#: they can stand inside a class beside other members)
_RANGES_MATCHED = {
    "\\D": [(0x30, 0x39)],
    "\\W": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    "\\S": _WIDE_SPACE_RANGES,
}


def _escapes(codes: frozenset[int] | set[int]) -> list[str]:
    """Regexes of the JSON escapes of ``codes`` (characters JSON must escape): a short escape each
    where JSON has one, the ``\\u00XX`` escapes of the rest grouped by their third digit."""
    found = [_json_escape(code, group=False) for code in sorted(codes) if code in _SHORT_ESCAPES]
    for high in (0, 1):
        digits = "".join(
            f"{code & 15:x}" for code in sorted(codes) if code >> 4 == high and code not in _SHORT_ESCAPES
        )
        if digits:
            found.append(f"\\\\u00{high}" + (digits if len(digits) == 1 else f"[{digits}]"))
    return found


def _either(raw: str, codes: frozenset[int] | set[int]) -> str:
    """``raw`` (a regex of characters that need no escape) or'ed with the escapes of ``codes``."""
    if not codes:
        return raw
    return "(?:" + "|".join(([raw] if raw else []) + _escapes(codes)) + ")"


def _complement(ranges: list[tuple[int, int]]) -> str:
    """Class members for every character outside ``ranges`` that JSON writes raw (no character it
    must escape, no UTF-16 surrogate, which no text holds)."""
    cut = sorted([*ranges, (0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0xD800, 0xDFFF)])
    members, start = [], 0
    for low, high in cut:
        if start < low:
            members.append(_member(start) if start == low - 1 else f"{_member(start)}-{_member(low - 1)}")
        start = max(start, high + 1)
    if start <= 0x10FFFF:
        members.append(f"{_member(start)}-{_member(0x10FFFF)}")
    return "".join(members)


def _member(code: int) -> str:
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\u{{{code:x}}}"


#: JSON's short escapes of the characters a JSON string must escape (the rest are \\u00XX)
_SHORT_ESCAPES = {0x22: '"', 0x5C: "\\\\", 0x08: "b", 0x09: "t", 0x0A: "n", 0x0C: "f", 0x0D: "r"}
#: class members written escaped, wherever they end up in a rewritten class
_CLASS_SYNTAX = {"]": "\\]", "^": "\\^", "-": "\\-", "[": "\\["}


def _must_escape(code: int) -> bool:
    """Whether JSON text must escape character ``code`` inside a string."""
    return code < 0x20 or code in (0x22, 0x5C)


def _json_escape(code: int, group: bool = True) -> str:
    """A regex matching the JSON escape of character ``code`` (one of :func:`_must_escape`'s)."""
    short = _SHORT_ESCAPES.get(code)
    body = "\\\\" + (short if short is not None else f"u{code:04x}")
    return f"(?:{body})" if group else body


#: ``.`` (no line terminator) less what JSON must escape. A class, not a class or'ed with the
#: escapes of what it matches: xgrammar writes a pattern's bounded repetition of an alternation
#: (``.{1,80}``) as a grammar rule, not an automaton, and filled a 49k-token mask in 16 ms a token
#: with it against 0.6 ms with the class (SmolLM2's vocabulary, 2026-12-01)
_JSON_DOT = f"[^{_ESCAPED_MEMBERS}\\u2028\\u2029]"
#: class escapes as JSON text allows them: white space without its control characters, the
#: negated classes less what JSON must escape (classes, as ``.`` is)
_JSON_CLASS_ESCAPES = {
    "\\s": f"[{_WIDE_SPACE}]",
    "\\D": f"[^0-9{_ESCAPED_MEMBERS}]",
    "\\W": f"[^a-zA-Z0-9_{_ESCAPED_MEMBERS}]",
    "\\S": f"[^{_WIDE_SPACE}{_ESCAPED_MEMBERS}]",
}


def _json_class(text: str) -> str:
    """A class (``text``, from ``[`` to ``]``) as JSON text allows what it matches: the characters
    that need no escape (a negated class as written, less those that do; a positive one less them,
    ``\\s`` as ECMA-262's wider spaces, ``\\D``, ``\\W`` and ``\\S`` spelled as ranges: written as
    they were, a raw quote or backslash matched them), a positive class or'ed with the escapes of
    the characters it names that JSON must escape (``[a"]``: a quote as ``\\"``)."""
    negated, atoms = class_atoms(text)
    kept: list[str] = []
    escaped: set[int] = set()
    j = 0
    while j < len(atoms):
        low_text, low = atoms[j]
        if (
            j + 2 < len(atoms)
            and atoms[j + 1] == ("-", 0x2D)
            and low is not None
            and atoms[j + 2][1] is not None
        ):
            high_text, high = atoms[j + 2]
            assert high is not None
            kept += _range_without_escapes(low_text, low, high_text, high, escaped)
            j += 3
            continue
        j += 1
        if low is None:  # a class escape (or one xgrammar refuses in its own words)
            kept.append(
                _WIDE_SPACE
                if low_text == "\\s"
                else _complement(_RANGES_MATCHED[low_text])
                if low_text in _RANGES_MATCHED
                else low_text
            )
        elif _must_escape(low):
            escaped.add(low)
        else:
            kept.append(_CLASS_SYNTAX.get(low_text, low_text))
    if negated:  # (as written; a "]" opening it escaped, as it no longer opens it)
        body = text[2:-1]
        body = "\\]" + body[1:] if body.startswith("]") else body
        return f"[^{body}{_ESCAPED_MEMBERS}]"
    if not escaped and not any(t in ("\\s", "\\D", "\\W", "\\S") for t, code in atoms if code is None):
        return text  # (as written: it names nothing JSON escapes)
    return _either(f"[{''.join(kept)}]" if kept else "", escaped)


def _range_without_escapes(
    low_text: str, low: int, high_text: str, high: int, escaped: set[int]
) -> list[str]:
    """The class items for the range ``low``-``high`` less the characters JSON must escape (which
    are added to ``escaped``); the range as written when it holds none."""
    if low > high:  # xgrammar refuses it in its own words
        return [f"{low_text}-{high_text}"]
    inside = [code for code in (*range(0x20), 0x22, 0x5C) if low <= code <= high]
    if not inside:
        return [f"{low_text}-{high_text}"]
    escaped.update(inside)
    items: list[str] = []
    start = low
    for code in [*inside, high + 1]:
        if start <= code - 1:
            first = low_text if start == low else f"\\x{start:02x}"
            last = high_text if code - 1 == high else f"\\x{code - 1:02x}"
            items.append(first if start == code - 1 else f"{first}-{last}")
        start = code + 1
    return items


def exact_patterns(schema: Any) -> bool:
    """Every ``pattern`` and ``patternProperties`` name in ``schema`` as :func:`xgrammar_pattern`
    writes it, in place; whether any changed."""
    changed = False
    for sub, _, _ in _walk(schema):
        if isinstance(sub.get("pattern"), str):
            written = xgrammar_pattern(sub["pattern"])
            changed |= written != sub["pattern"]
            sub["pattern"] = written
        names = sub.get("patternProperties")
        if isinstance(names, dict):
            written_names = {xgrammar_pattern(name): value for name, value in names.items()}
            if list(written_names) != list(names):
                sub["patternProperties"], changed = written_names, True
    return changed


def whole_integer_bounds(schema: Any) -> bool:
    """Rewrite (in place) what xgrammar refuses of a number's bounds into what it takes, with the
    same meaning; whether anything changed. A fractional bound of an integer ("Integer constraint
    must be a whole number", valid JSON Schema that llguidance takes) becomes the whole one allowing
    the same integers (minimum 2.5 -> 3, maximum 2.5 -> 2, exclusiveMinimum 2.5 -> 2,
    exclusiveMaximum 2.5 -> 3), and draft 4's boolean ``exclusiveMinimum``/``exclusiveMaximum``
    ("Value must be a number") the number of draft 6 on: ``minimum: 2, exclusiveMinimum: true`` ->
    ``exclusiveMinimum: 2``. Bounds past 64-bit integers are refused first (:func:`invalid_values`)."""
    changed = False
    for sub, _, _ in _walk(schema):
        for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if isinstance(sub.get(exclusive), bool):
                if sub.pop(exclusive) and _is_number(sub.get(bound)):
                    sub[exclusive] = sub.pop(bound)
                changed = True
        types = sub.get("type")
        if isinstance(types, list) and "integer" in types and "number" in types:
            # every integer is a number: the list means what it says without "integer", whose
            # branch xgrammar would hold to integer rules (a fractional bound refused)
            sub["type"] = [t for t in types if t != "integer"]
            changed = True
        if not _integer_only(sub):
            continue
        span = _integer_span(sub)
        if isinstance(types, list) and len(types) > 1 and span is not None and span[0] > span[1]:
            # ["integer", "null"] whose bounds no integer meets: null alone (the bounds bind numbers
            # only, and none is left); a lone "integer" was refused (accepting_nothing)
            sub["type"] = [t for t in types if t != "integer"]
            for key in _RANGE_KEYWORDS:
                sub.pop(key, None)
            changed = True
            continue
        for key, whole in _WHOLE_BOUNDS:
            value = sub.get(key)
            if isinstance(value, float) and math.isfinite(value) and not value.is_integer():
                sub[key], changed = whole(value), True
    return changed


def _first_five(found: list[str]) -> str:
    more = f"; and {len(found) - 5} more" if len(found) > 5 else ""
    return "; ".join(found[:5]) + more


def _children(schema: dict, path: str) -> list[tuple[Any, str]]:
    """The schemas directly in ``schema``, each with its path (not those under a keyword xgrammar
    ignores: such a schema is refused for it)."""
    found: list[tuple[Any, str]] = []
    for key in _SCHEMA_MAPS:
        value = schema.get(key)
        if isinstance(value, dict):
            found += [(sub, f"{path}/{key}/{name}") for name, sub in value.items()]
    for key in _SCHEMA_LISTS:
        value = schema.get(key)
        if isinstance(value, list):
            found += [(sub, f"{path}/{key}/{i}") for i, sub in enumerate(value)]
    for key in _SCHEMA_VALUES:
        if isinstance(schema.get(key), dict) and key not in _IGNORED_KEYWORDS:
            found.append((schema[key], f"{path}/{key}"))
    return found


def _walk(schema: Any, path: str = "#") -> Iterator[tuple[dict, str, int]]:
    """Every schema object in ``schema`` (true and false are not objects), each with its path and
    depth (the root is 1), parents before children, in the order they are written."""
    stack = [(schema, path, 1)]
    while stack:
        sub, where, depth = stack.pop()
        if isinstance(sub, dict):
            yield sub, where, depth
            stack += [(child, at, depth + 1) for child, at in reversed(_children(sub, where))]


def too_deep(schema: Any, limit: int = MAX_SCHEMA_DEPTH) -> str | None:
    """The path of the first schema in ``schema`` nested deeper than ``limit`` levels, or None.
    Without recursion, and it stops there: a schema thousands deep costs what one at the limit does."""
    return next((path for _, path, depth in _walk(schema) if depth > limit), None)


def _length_limits(schema: dict) -> tuple[int, int | None] | None:
    """(minLength, maxLength or None) where ``schema`` limits a string's length, else None."""
    least, most = schema.get("minLength", 0), schema.get("maxLength")
    least = least if isinstance(least, int) and not isinstance(least, bool) else 0
    most = most if isinstance(most, int) and not isinstance(most, bool) else None
    return None if least <= 0 and most is None else (least, most)


def _fits(value: Any, limits: tuple[int, int | None]) -> bool:
    """Whether ``value`` keeps to length ``limits`` (characters; they say nothing of a non-string)."""
    least, most = limits
    return not isinstance(value, str) or (least <= len(value) and (most is None or len(value) <= most))


def _limit_words(schema: dict) -> str:
    return " and ".join(f"{key!r} {schema[key]}" for key in ("minLength", "maxLength") if key in schema)


def accepting_nothing(schema: Any) -> list[str]:
    """The parts of ``schema`` that accept no value, each as "... at PATH": ``anyOf`` or ``oneOf``
    of no schemas, an ``enum`` none of whose values keeps to the length limits beside it, a
    ``const`` that breaks them. xgrammar compiles each into a grammar that a server answered ""
    for (it refuses ``false`` and an empty ``enum`` itself). And an integer whose bounds leave no
    integer (``minimum`` 2.5, ``maximum`` 2.7): rounded to whole bounds for xgrammar, that read
    "minimum greater than maximum", of bounds the user never wrote."""
    found: list[str] = []
    choices = _ChoiceFilters(schema)
    for sub, path, _ in _walk(schema):
        found += [f"{key!r} of no schemas at {path}" for key in ("anyOf", "oneOf") if sub.get(key) == []]
        limits = _length_limits(sub)
        values = sub.get("enum")
        if limits is not None and "const" in sub and not _fits(sub["const"], limits):
            found.append(f"'const' that {_limit_words(sub)} rules out at {path}")
        elif (
            limits is not None
            and isinstance(values, list)
            and values
            and not any(_fits(v, limits) for v in values)
        ):
            found.append(f"'enum' with no value {_limit_words(sub)} allows at {path}")
        elif (allowed := choices(sub)) is not None:
            if "const" in sub and not allowed(sub["const"]):
                found.append(f"'const' that the keywords beside it rule out at {path}")
            elif isinstance(values, list) and values and not any(map(allowed, values)):
                found.append(f"'enum' with no value the keywords beside it allow at {path}")
    for sub, path, _ in _walk(schema):
        span = _integer_span(sub) if sub.get("type") in ("integer", ["integer"]) else None
        if span is not None and span[0] > span[1]:
            bounds = ", ".join(
                f"{key} {_shown(sub[key])}" for key in _RANGE_KEYWORDS if _is_number(sub.get(key))
            )
            found.append(f"integer bounds that no integer meets ({bounds}) at {path}")
    return found


def _integer_span(schema: dict) -> tuple[float, float] | None:
    """The least and the greatest integer the bounds of ``schema`` allow (either may be infinite),
    draft 4's boolean ``exclusiveMinimum``/``exclusiveMaximum`` read as such; None if a bound is
    not a finite number (refused or ignored elsewhere)."""
    low, high = -math.inf, math.inf
    for bound, exclusive, sign in (("minimum", "exclusiveMinimum", 1), ("maximum", "exclusiveMaximum", -1)):
        for key, strict in ((bound, schema.get(exclusive) is True), (exclusive, True)):
            value = schema.get(key)
            if not _is_number(value):
                continue
            if not _readable(value):
                return None
            # the integer nearest the bound on its allowed side: ceil/floor, one step in if strict
            edge = math.ceil(value) if sign > 0 else math.floor(value)
            if strict and edge == value:
                edge += sign
            low, high = (max(low, edge), high) if sign > 0 else (low, min(high, edge))
    return low, high


def apply_siblings_to_choices(schema: Any) -> bool:
    """Drop from each ``enum`` in ``schema`` (in place) the values that the keywords beside it rule
    out (length limits, ``type``, bounds, ``pattern``...), which xgrammar ignores there: it
    compiles an ``enum`` alone (a probe: 5 for ``{"enum": [1, 2, 5], "maximum": 2}``, 1 for
    ``{"enum": [1, "a"], "type": "string"}``); whether any was dropped. (A ``const`` they rule
    out, or an ``enum`` left empty, is refused first: :func:`accepting_nothing`.)"""
    changed = False
    choices = _ChoiceFilters(schema)
    for sub, _, _ in _walk(schema):
        limits = _length_limits(sub)
        values = sub.get("enum")
        if not isinstance(values, list):
            continue
        allowed = choices(sub)
        kept = [v for v in values if (limits is None or _fits(v, limits)) and (allowed is None or allowed(v))]
        if len(kept) < len(values):
            sub["enum"], changed = kept, True
    return changed


def _pattern_search() -> Callable[[str, str], bool] | None:
    """``search(pattern, text)``: whether ``pattern`` is found in ``text``, on the third-party
    ``regex`` engine, all the calls of one searcher under one :data:`PATTERN_CHECK_S` deadline
    counted from its first call (TimeoutError past it); None without ``regex``. Python's ``re``
    backtracks without end (an enum value of 26 a's and a "!" beside "^(a+)+$" took 3.5 s, each
    further a twice that), and this runs in the tokenizer worker. (The deadline once ran from the
    searcher's making, before the caller built its ``jsonschema`` validator: a fresh worker's
    first import of ``jsonschema`` on a busy machine used it up, and '^a.$' against "ab" was
    refused as too slow to check.)"""
    try:
        import regex
    except ImportError:
        return None
    deadline: float | None = None

    def search(pattern: str, text: str) -> bool:
        nonlocal deadline
        now = time.monotonic()
        if deadline is None:
            deadline = now + PATTERN_CHECK_S
        left = deadline - now
        if left <= 0:
            raise TimeoutError
        return regex.search(pattern, text, timeout=left) is not None

    return search


#: the GrammarErrors of a check by pattern that took longer than PATTERN_CHECK_S
_VALUES_TOO_LONG = (
    "json_schema: the patterns beside an 'enum' or 'const' took over {seconds:g} s to check against "
    "its values (the xgrammar backend applies them to the values itself)"
)
_NAMES_TOO_LONG = (
    "json_schema: 'propertyNames' took over {seconds:g} s to check against the names in 'properties' "
    "(the xgrammar backend checks them itself)"
)


def _choice_filter(schema: dict, root: Any, too_long: str | None = None) -> Callable[[Any], bool] | None:
    """For a schema listing its values (``enum``, ``const``) beside keywords that assert more:
    whether a value keeps to those keywords, read by ``jsonschema`` in the root's draft with its
    ``$ref``s (a value it cannot judge is kept); None where nothing asserts beside the values, or
    without ``jsonschema``. ``too_long``: the GrammarError's message when the check takes over
    :data:`PATTERN_CHECK_S` (``{seconds}`` in it), if not :data:`_VALUES_TOO_LONG`. For many
    schemas of one root, :class:`_ChoiceFilters`."""
    return _ChoiceFilters(root, too_long)(schema)


class _ChoiceFilters:
    """:func:`_choice_filter` for the schemas of one root, one after another (one walk, one
    thread): the root's validator is built once (``jsonschema``'s ``extend`` took 0.44 ms a call,
    once per enum in each of two walks: 300 enums beside a ``type`` took 305 ms to admit), each
    filter keeping its own pattern deadline."""

    def __init__(self, root: Any, too_long: str | None = None) -> None:
        self.root, self.too_long = root, too_long
        self._validator: Any = None
        self._built = False
        #: the pattern search of the filter being asked (the validator's keywords read it)
        self._search: Callable[[str, str], bool] | None = None

    def _root_validator(self) -> Any:
        if self._built:
            return self._validator
        self._built = True
        try:
            import jsonschema
        except ImportError:
            return None

        def pattern(validator: Any, wanted: str, instance: Any, schema: Any) -> Iterator[Any]:
            if validator.is_type(instance, "string") and not self._search(wanted, instance):
                yield jsonschema.ValidationError(f"{instance!r} does not match {wanted!r}")

        def pattern_properties(validator: Any, patterns: dict, instance: Any, schema: Any) -> Iterator[Any]:
            if validator.is_type(instance, "object"):
                for wanted, sub in patterns.items():
                    for key, value in instance.items():
                        if self._search(wanted, key):
                            yield from validator.descend(value, sub, path=key, schema_path=wanted)

        try:
            validator_cls = jsonschema.validators.extend(
                jsonschema.validators.validator_for(self.root, default=jsonschema.Draft202012Validator),
                {"pattern": pattern, "patternProperties": pattern_properties},
            )
            self._validator = validator_cls(self.root)
        except Exception:  # an unreadable schema: refused elsewhere, or not judged here
            self._validator = None
        return self._validator

    def __call__(self, schema: dict) -> Callable[[Any], bool] | None:
        if "enum" not in schema and "const" not in schema:
            return None
        beside = {key: value for key, value in schema.items() if key not in ("enum", "const")}
        if not any(key in _ASSERTIONS for key in beside):
            return None
        search = _pattern_search()
        root_validator = self._root_validator() if search is not None else None
        if root_validator is None:
            return None
        try:
            validator = root_validator.evolve(schema=beside)
        except Exception:  # an unreadable schema: refused elsewhere, or not judged here
            return None
        too_long = self.too_long

        def allowed(value: Any) -> bool:
            self._search = search
            try:
                return validator.is_valid(value)
            except TimeoutError:
                raise GrammarError((too_long or _VALUES_TOO_LONG).format(seconds=PATTERN_CHECK_S)) from None
            except Exception:
                return True

        return allowed


def _may_be_object(schema: dict) -> bool:
    types = schema.get("type", "object")
    return types == "object" or (isinstance(types, list) and "object" in types)


#: the largest ``multipleOf`` of an integer xgrammar enforces (it ignores a larger one)
MAX_INTEGER_MULTIPLE_OF = 1024

#: bounds of a number, beside which xgrammar drops an integer's ``multipleOf``
_RANGE_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def unenforced_keywords(schema: Any, path: str = "#") -> list[str]:
    """What of ``schema`` xgrammar would not enforce, each as "'keyword' at PATH": the
    :data:`_IGNORED_KEYWORDS`, ``uniqueItems: true``, ``multipleOf`` on a number that may be
    fractional (integers are enforced, but not beside a ``minimum`` or other bound, nor past
    :data:`MAX_INTEGER_MULTIPLE_OF`), ``allOf`` of several schemas (not intersected),
    ``minProperties`` above the required properties where keys outside ``properties`` are allowed
    (the grammar lets a key repeat, and a repeated key counts once in the parsed object), a
    ``required`` name outside ``properties`` (never required, whatever other keys may be: with
    none allowed, strict mode's default, ``{}`` passed), ``minLength``/``maxLength`` beside
    a ``pattern`` or a format xgrammar writes as a regex (:data:`_FORMATS_IGNORING_LENGTH`), and
    a ``pattern`` beside such a format."""
    found: list[str] = []
    for sub, where, _ in _walk(schema, path):
        found += _unenforced_here(sub, where)
        found += _overlapping_one_of(sub, where, schema)
        found += _dropped_beside(sub, where, schema)
        found += _names_ruled_out(sub, where, schema)
    return found


def _names_ruled_out(schema: dict, path: str, root: Any) -> list[str]:
    """A name in ``properties`` that the ``propertyNames`` beside it rules out, as one entry:
    xgrammar writes those names unchecked (``{"ab": 1}`` passed ``{"properties": {"ab": ...},
    "propertyNames": {"maxLength": 1}}``). Judged by ``jsonschema``; not judged without it."""
    names, rule = schema.get("properties"), schema.get("propertyNames")
    if not isinstance(names, dict) or not names or rule is None:
        return []
    # a filter of values, given objects holding one name each: what propertyNames asks of a name
    allowed = _choice_filter({"const": None, "propertyNames": rule}, root, _NAMES_TOO_LONG)
    ruled_out = [name for name in names if allowed is not None and not allowed({name: None})]
    if not ruled_out:
        return []
    return [
        f"'propertyNames' ruling out {ruled_out[0]!r} of 'properties' at {path} (it writes the names in "
        "'properties' unchecked; rename the property or loosen 'propertyNames')"
    ]


def moot_property_names(schema: Any) -> bool:
    """Drop ``propertyNames`` (in place) where ``additionalProperties`` is false and no
    ``patternProperties`` is beside it: the names are then those of ``properties``, each checked
    against it first (:func:`_names_ruled_out`), and xgrammar read such a ``propertyNames`` as
    the keys allowed, with any value (``{"j0": 538}`` passed ``{"additionalProperties": false,
    "propertyNames": {"pattern": "^[a-p][0-9]$"}}``, which takes ``{}`` only); whether any was."""
    changed = False
    for sub, _, _ in _walk(schema):
        if (
            "propertyNames" in sub
            and sub.get("additionalProperties") is False
            and "patternProperties" not in sub
        ):
            del sub["propertyNames"]
            changed = True
    return changed


def _dropped_beside(schema: dict, path: str, root: Any) -> list[str]:
    """The keywords beside one xgrammar compiles alone (:data:`_TAKEN_ALONE`), as one entry: it
    drops them, so a value they rule out passed. Not reported: ``type`` where every schema the
    keyword leads to allows only those types anyway, and under draft 7 and before, what is beside
    ``$ref`` (those drafts ignore it too)."""
    taken = [key for key in _TAKEN_ALONE if key in schema]
    draft = root.get("$schema") if isinstance(root, dict) else None
    if taken[:1] == ["$ref"] and isinstance(draft, str) and any(d in draft for d in _REF_ALONE_DRAFTS):
        taken = taken[1:]
    if not taken:
        return []
    beside = [key for key in schema if key in _ASSERTIONS and key != taken[0]]
    if "type" in beside and _types_implied(schema, taken[0], root):
        beside.remove("type")
    if not beside:
        return []
    names = ", ".join(repr(key) for key in beside)
    return [
        f"{names} beside {taken[0]!r} at {path} (it compiles {taken[0]!r} alone; move {names} into "
        f"the {'schema it refers to' if taken[0] == '$ref' else 'schemas in it'})"
    ]


def _types_implied(schema: dict, key: str, root: Any) -> bool:
    """Whether every schema ``schema[key]`` leads to allows only types its ``type`` allows."""
    declared = schema.get("type")
    allowed = (
        {declared} if isinstance(declared, str) else set(declared) if isinstance(declared, list) else None
    )
    if allowed is None:
        return False
    branches = [{"$ref": schema["$ref"]}] if key == "$ref" else schema[key]
    if not isinstance(branches, list) or not branches:
        return False
    for branch in branches:
        target = _resolve(branch, root)
        types = _types(target, _values(target), integers=True)
        if types is None or not all(t in allowed or (t == "integer" and "number" in allowed) for t in types):
            return False
    return True


#: the most ``oneOf`` branches checked pair by pair for overlap (the check is quadratic; a probe
#: of 2,000 ``const`` branches took 24 s in the tokenizer worker before it was bounded)
MAX_ONE_OF_PAIRS_CHECKED = 128


class _Branch(NamedTuple):
    """What :func:`_disjoint` reads of one ``oneOf`` branch, worked out once."""

    never: bool  # the schema false
    types: frozenset[str] | None
    values: frozenset[str] | None
    tags: dict[str, frozenset[str]]


def _branch(schema: Any, root: Any) -> _Branch:
    schema = _resolve(schema, root)
    values = _values(schema)
    return _Branch(schema is False, _types(schema, values), values, _tags(schema, root))


def _overlapping_one_of(schema: dict, path: str, root: Any) -> list[str]:
    """``oneOf`` whose branches are not provably disjoint: xgrammar compiles it as ``anyOf``, so a
    value valid under two branches passed (found by an API probe: ``{"a":1}`` for a ``oneOf`` of two
    objects, one declaring ``a``, the other ``b``). Provably disjoint, as llguidance also takes
    them: branches of different types, of different ``const``/``enum`` values, or objects with a
    required property whose ``const``/``enum`` values differ (a discriminated union)."""
    branches = schema.get("oneOf")
    if not isinstance(branches, list) or len(branches) < 2:
        return []
    facts = [_branch(branch, root) for branch in branches]
    if all(f.values is not None for f in facts):  # values only: one pass, however many branches
        seen: dict[str, int] = {}
        for j, f in enumerate(facts):
            for value in f.values or ():
                i = seen.setdefault(value, j)
                if i != j:
                    return [_overlap(path, i, j)]
        return []
    if len(facts) > MAX_ONE_OF_PAIRS_CHECKED:
        return [
            f"'oneOf' of {len(facts)} schemas at {path} (more than {MAX_ONE_OF_PAIRS_CHECKED} are not "
            "checked for overlap, and it is compiled as 'anyOf'; if no value can match two of them, "
            "write 'anyOf')"
        ]
    for i, a in enumerate(facts):
        for j in range(i + 1, len(facts)):
            if not _disjoint(a, facts[j]):
                return [_overlap(path, i, j)]
    return []


def _overlap(path: str, i: int, j: int) -> str:
    return (
        f"'oneOf' at {path} whose schemas {path}/oneOf/{i} and {path}/oneOf/{j} may both hold for "
        "one value (it is compiled as 'anyOf'; give the branches different types, or a required "
        "property with a different 'const' in each)"
    )


def _resolve(schema: Any, root: Any) -> Any:
    """``schema`` with a local ``$ref`` ("#/$defs/Name", a JSON pointer) followed, a few hops at
    most; None where it does not resolve (then nothing about it is provable)."""
    for _ in range(8):
        ref = schema.get("$ref") if isinstance(schema, dict) else None
        if ref is None:
            return schema
        if not isinstance(ref, str) or not ref.startswith("#"):
            return None
        target = root
        for part in ref[1:].split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                return None
        schema = target
    return None


def _value_key(value: Any) -> str:
    """A JSON value as a comparable text: 1 and 1.0 alike, True apart from 1, integers of any size
    exact (a float of them overflowed past 1e308)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value, sort_keys=True)


def _values(schema: Any) -> frozenset[str] | None:
    """The values ``schema`` allows when it lists them (``const``, ``enum``), else None."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return frozenset({_value_key(schema["const"])})
    if isinstance(schema.get("enum"), list):
        return frozenset(_value_key(v) for v in schema["enum"])
    return None


def _types(schema: Any, values: frozenset[str] | None, *, integers: bool = False) -> frozenset[str] | None:
    """The JSON types ``schema`` allows, or None where it does not say; ``values``: its listed
    values (:func:`_values`); integer counted as number unless ``integers``."""
    if values is not None:
        return frozenset(_type_of(v, integers) for v in values)
    declared = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(declared, str):
        declared = [declared]
    if not isinstance(declared, list) or not all(isinstance(t, str) for t in declared):
        return None
    return frozenset("number" if t == "integer" and not integers else t for t in declared)


def _type_of(key: str, integers: bool = False) -> str:
    """The JSON type of a :func:`_value_key` text (integer counted as number unless ``integers``;
    a whole float's key is an integer's)."""
    first = key[0]
    if first == "n":
        return "null"
    if first in "tf":
        return "boolean"
    if integers and key.lstrip("-").isdigit():
        return "integer"
    return {'"': "string", "[": "array", "{": "object"}.get(first, "number")  # digits, -, Infinity, NaN


def _tags(schema: Any, root: Any) -> dict[str, frozenset[str]]:
    """An object schema's required properties that list their values: name -> values."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    required = schema.get("required") if isinstance(schema, dict) else None
    if not isinstance(properties, dict) or not isinstance(required, list):
        return {}
    tags = {}
    for name in required:
        values = _values(_resolve(properties.get(name), root)) if isinstance(name, str) else None
        if values is not None:
            tags[name] = values
    return tags


def _disjoint(a: _Branch, b: _Branch) -> bool:
    """Whether no value can be valid under both branches, as far as their types and listed values
    tell (False where they do not)."""
    if a.never or b.never:
        return True
    if a.types is not None and b.types is not None and not a.types & b.types:
        return True
    if a.values is not None and b.values is not None and not a.values & b.values:
        return True
    if a.types == frozenset({"object"}) == b.types:
        return any(not a.tags[name] & b.tags[name] for name in a.tags.keys() & b.tags.keys())
    return False


def _unenforced_here(schema: dict, path: str) -> list[str]:
    """:func:`unenforced_keywords` of ``schema`` itself, not of the schemas in it."""
    found = [f"{key!r} at {path}" for key in _IGNORED_KEYWORDS if key in schema]
    if schema.get("uniqueItems") is True:
        found.append(f"'uniqueItems' at {path}")
    types = schema.get("type")
    if "multipleOf" in schema and not (
        types == "integer" or (isinstance(types, list) and "number" not in types)
    ):
        found.append(f"'multipleOf' on a number at {path} (only on integers)")
    elif "multipleOf" in schema:
        # xgrammar 0.2.8 logs "range + multipleOf combination not yet supported; ignoring
        # multipleOf" and lets 101 through {"multipleOf": 5, "maximum": 1000}
        ranges = [key for key in _RANGE_KEYWORDS if key in schema]
        step = schema["multipleOf"]
        if ranges:
            found.append(f"'multipleOf' beside {ranges[0]!r} at {path} (only alone)")
        elif isinstance(step, float) and math.isfinite(step) and not step.is_integer():
            # and lets any integer through {"type": "integer", "multipleOf": 2.5} (a probe)
            found.append(f"'multipleOf' {step!r} at {path} (only a whole number)")
        elif _is_number(step) and step > MAX_INTEGER_MULTIPLE_OF:
            # xgrammar 0.2.8 logs "multipleOf for type:integer must be > 0 and <= 1024; ignoring
            # multipleOf" and lets 1 through {"type": "integer", "multipleOf": 2000}
            found.append(f"'multipleOf' {_shown(step)} at {path} (only up to {MAX_INTEGER_MULTIPLE_OF})")
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:
        found.append(f"'allOf' of {len(schema['allOf'])} schemas at {path} (one at most)")
    # (strict mode: no keys outside 'properties' unless 'additionalProperties' says so)
    if repeatable_key_count(schema, additional_properties_default=False):
        found.append(f"'minProperties' with keys outside 'properties' at {path}")
    required = schema.get("required")
    properties = schema.get("properties")
    if isinstance(required, list) and _may_be_object(schema):
        declared = properties if isinstance(properties, dict) else {}
        outside = [name for name in dict.fromkeys(map(str, required)) if name not in declared]
        if outside:
            names = ", ".join(repr(name) for name in outside)
            found.append(f"'required' {names} (not in 'properties') at {path}")
    limits = _length_limits(schema)
    if limits is not None:
        what = " and ".join(
            repr(key) for key, limit in zip(("minLength", "maxLength"), limits) if limit not in (0, None)
        )
        if "pattern" in schema:
            found.append(f"{what} beside 'pattern' at {path}")
        if schema.get("format") in _FORMATS_IGNORING_LENGTH:
            found.append(f"{what} beside 'format' {schema['format']!r} at {path}")
    for pattern, name in _names_patterns_match(schema):
        # xgrammar gives a name in 'properties' its schema there alone: {"xa": "s"} passed
        # {"properties": {"xa": {"type": "string"}}, "patternProperties": {"^x": {"type": "integer"}}}
        found.append(
            f"'patternProperties' {pattern!r} matching {name!r} of 'properties' at {path} (it applies "
            f"only 'properties' to {name!r}; put what {pattern!r} asks into the schema of {name!r})"
        )
    if "pattern" in schema and schema.get("format") in _FORMATS_IGNORING_LENGTH:
        # the format's regex wins: "2024-01-01" passed {"format": "date", "pattern": "^1"}
        found.append(f"'pattern' beside 'format' {schema['format']!r} at {path} (it writes the format alone)")
    return found


def _names_patterns_match(schema: dict) -> list[tuple[str, str]]:
    """(pattern, name) for each ``patternProperties`` pattern of ``schema`` that matches a name in
    its ``properties`` (JSON Schema applies both schemas to that property's value), matched by
    the ``regex`` engine under :data:`PATTERN_CHECK_S`; past the deadline, or without ``regex``, a
    pattern is taken to match (the schema is refused rather than risk it)."""
    names, patterns = schema.get("properties"), schema.get("patternProperties")
    if not isinstance(names, dict) or not isinstance(patterns, dict) or not names or not patterns:
        return []
    search = _pattern_search()
    found = []
    for pattern in patterns:
        for name in names:
            try:
                hit = search is None or search(pattern, name)
            except TimeoutError:
                hit = True
            except Exception:  # a pattern Python cannot read: refused elsewhere, or not judged here
                hit = False
            if hit:
                found.append((pattern, name))
                break
    return found


def exact_formats(schema: Any) -> bool:
    """Write each ``format`` in ``schema`` that xgrammar's own regex lets invalid strings through
    (:data:`~minisgl_core.api.grammar.FORMAT_REGEXES`: day 31 of November, February 29 of 2023,
    second 60, an IPv4 octet "069") as that format's exact ``pattern`` instead, in place; whether
    any was. (A ``pattern`` already beside the format is refused first: xgrammar keeps one of the
    two, so the rewrite never meets one.)"""
    changed = False
    for sub, _, _ in _walk(schema):
        regex = FORMAT_REGEXES.get(sub["format"]) if isinstance(sub.get("format"), str) else None
        if regex is not None and "pattern" not in sub:
            del sub["format"]
            sub["pattern"], changed = regex, True
    return changed


class _Compiled(NamedTuple):
    grammar: Any
    #: JSON output: the matcher takes the JSON guard (a ByteGuard that also forbids control bytes)
    json: bool


#: lead byte -> the second bytes UTF-8 does not allow after it: overlong forms (0xE0, 0xF0), a
#: surrogate (0xED), past U+10FFFF (0xF4)
_BAD_SECOND_BYTES = {
    0xE0: frozenset(range(0x80, 0xA0)),
    0xED: frozenset(range(0xA0, 0xC0)),
    0xF0: frozenset(range(0x80, 0x90)),
    0xF4: frozenset(range(0x90, 0xC0)),
}
#: bytes or byte pairs no UTF-8 text holds: those of _BAD_SECOND_BYTES, and the bytes that never
#: appear (0xC0, 0xC1: overlong two-byte forms; 0xF5-0xFF)
_NOT_UTF8 = re.compile(
    rb"[\xc0\xc1\xf5-\xff]|"
    + b"|".join(
        re.escape(bytes([lead]))
        + b"["
        + re.escape(bytes([min(seconds)]))
        + b"-"
        + re.escape(bytes([max(seconds)]))
        + b"]"
        for lead, seconds in _BAD_SECOND_BYTES.items()
    )
)


def _not_utf8(raw: bytes) -> bool:
    return _NOT_UTF8.search(raw) is not None


def _json_unsafe(raw: bytes) -> bool:
    return any(b < 0x20 for b in raw) or _not_utf8(raw)


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
    """xgrammar's error message without its time stamp, source location and assertion text; where
    that leaves nothing (10**400 in a schema raised RuntimeError('')), what was raised."""
    return _LIBRARY_NOISE.sub("", str(exc)).strip() or f"xgrammar raised {type(exc).__name__} with no message"


def _check_json(text: str, what: str) -> None:
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise GrammarError(f"{what} is not valid JSON: {exc}") from exc
