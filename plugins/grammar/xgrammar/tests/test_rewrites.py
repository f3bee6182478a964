"""What the backend rewrites before xgrammar compiles it, each beside a witness that xgrammar
itself still needs it (if a new xgrammar gets one right, its witness test fails: drop the rewrite):

- special tokens: xgrammar reads ``<|im_end|>`` as ten characters, which ``.+`` matches, so the
  stop token was allowed where the grammar could not end (an empty answer to ``.+``);
- patterns: a group's ``?`` made the group's first part optional too where the group holds a
  quantifier (``^a(x5+)?$`` took "a5"); the backend writes ``{0,1}`` instead;
- formats: ``date``, ``time``, ``date-time`` and ``ipv4`` are written as exact patterns
  (``FORMAT_REGEXES``): xgrammar's took November 31, second 60 and "1.02.3.4"."""

from __future__ import annotations

import itertools
import json
import random
import re

import pytest
import xgrammar as xgr
from minisgl_plugin_xgrammar.backend import XGrammarBackend
from minisgl_plugin_xgrammar.patterns import _plain_pattern_rules, xgrammar_pattern
from minisgl_plugin_xgrammar.schema_rewrites import exact_patterns

from minisgl_core.api import GrammarError, GrammarSpec, allocate_token_bitmask, allowed_tokens
from minisgl_core.api.grammar import FORMAT_REGEXES
from minisgl_core.testing.grammar_suite import FORMAT_CASES, ecma_reference

_BYTES = xgr.TokenizerInfo(
    [bytes([b]) for b in range(256)] + [b"</s>"], vocab_type=xgr.VocabType.RAW, stop_token_ids=[256]
)
_COMPILER = xgr.GrammarCompiler(_BYTES, max_threads=1, cache_enabled=False)


def _schema_grammar(schema: dict) -> object:
    grammar = xgr.Grammar.from_json_schema(
        json.dumps(schema), any_whitespace=False, separators=(",", ":"), strict_mode=True
    )
    return _COMPILER.compile_grammar(grammar)


def _takes(compiled: object, text: str) -> bool:
    matcher = xgr.GrammarMatcher(compiled)
    return all(matcher.accept_token(b) for b in text.encode()) and matcher.accept_token(256)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from minisgl_core.demo.factories import train_tokenizer

    return AutoTokenizer.from_pretrained(str(train_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=400)))


def test_xgrammar_reads_a_special_token_as_its_spelling(tokenizer):
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer), stop_token_ids=[stop])
    assert info.decoded_vocab[stop] == b"<|im_end|>"
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_grammar(xgr.Grammar.from_regex(".+")))
    assert matcher.accept_token(stop) and matcher.is_terminated(), (
        "xgrammar no longer ends .+ empty: drop the fix"
    )
    backend = XGrammarBackend(tokenizer, vocab_size=len(tokenizer), stop_token_ids=[stop])
    ours = backend.matcher(backend.compile(GrammarSpec("regex", ".+")))
    mask = allocate_token_bitmask(1, len(tokenizer))
    ours.fill_bitmask(mask, 0)
    assert not allowed_tokens(mask[0], len(tokenizer))[stop]


def test_xgrammar_drops_what_begins_an_optional_group_with_a_quantifier():
    assert _takes(_schema_grammar({"type": "string", "pattern": "^a(x5+)?$"}), '"a5"'), (
        "xgrammar now reads (x5+)? right: drop xgrammar_pattern"
    )
    assert not _takes(_schema_grammar({"type": "string", "pattern": "^a(x5+){0,1}$"}), '"a5"')


@pytest.mark.parametrize(
    ("pattern", "written"),
    [
        ("^a(x5+)?$", "^a(x5+){0,1}$"),
        ("(a)??b", "(a){0,1}b"),
        ("((a)?b+)?", "((a){0,1}b+){0,1}"),
        ("(?:a+)?", "(?:a+){0,1}"),
        ("\\(a+\\)?", "\\(a+\\)?"),  # escaped parentheses are characters
        ("[)?]+", "[)?]+"),  # so are they in a class
        ("[]?)](a)?", "[]?)](a){0,1}"),  # a "]" first in a class is one too
        (
            "[^]?)](a)?",
            '[^\\]?)\\u0000-\x1f"\\\\](a){0,1}',
        ),  # (less what JSON escapes)  # (what JSON escapes escaped)
        ("(a)+?(b)*?", "(a)+?(b)*?"),  # lazy repetitions are no optional groups
    ],
)
def test_optional_groups_are_written_as_zero_or_one(pattern, written):
    # (anchored: an unanchored pattern gets any text around it, test_unanchored_patterns_*)
    assert xgrammar_pattern(f"^{pattern}$") == f"^{written}$"
    assert re.fullmatch(pattern, "ab") is None or re.fullmatch(written, "ab") is not None


def _random_pattern(rng: random.Random, depth: int = 0) -> str:
    def atom() -> str:
        r = rng.random()
        if r < 0.45 or depth > 1:
            return rng.choice(["a", "x", "5", "\\.", "[ax]", "[^a]", ".", "[5.]"])
        inner = _random_pattern(rng, depth + 1)
        if r < 0.75:
            return f"({inner})"
        if r < 0.85:
            return f"(?:{inner})"
        return f"({inner}|{_random_pattern(rng, depth + 1)})"

    quantifiers = ["", "", "", "?", "*", "+", "{2}", "{0,1}", "{1,2}", "{0,}", "??", "+?"]
    return "".join(atom() + rng.choice(quantifiers) for _ in range(rng.randint(1, 2)))


def test_rewritten_patterns_match_what_python_matches():
    """60 random patterns (groups, alternations, classes, every quantifier), rewritten as the
    backend writes them, take exactly the strings of up to 4 characters over "ax5." that Python's
    ``re`` takes (14 of 400 such patterns did not, unwritten)."""
    rng = random.Random(20261201)
    strings = ["".join(c) for n in range(5) for c in itertools.product("ax5.", repeat=n)]
    wrong = []
    for _ in range(60):
        pattern = _random_pattern(rng)
        schema = {"type": "string", "pattern": f"^{pattern}$"}
        exact_patterns(schema)
        compiled = _schema_grammar(schema)
        missed = [
            s for s in strings if _takes(compiled, json.dumps(s)) != bool(re.fullmatch(pattern, s, re.S))
        ]
        if missed:
            wrong.append(f"{pattern!r} on {missed[:3]}")
    assert wrong == []


def test_pattern_property_names_are_rewritten_too():
    schema = {
        "type": "object",
        "patternProperties": {"^a(x5+)?$": {"type": "integer"}},
        "additionalProperties": False,
    }
    assert _takes(_schema_grammar(schema), '{"a5":1}'), "xgrammar now reads (x5+)? right in names too"
    assert exact_patterns(schema)
    assert not _takes(_schema_grammar(schema), '{"a5":1}') and _takes(_schema_grammar(schema), '{"ax5":1}')


@pytest.mark.parametrize("name", sorted(FORMAT_REGEXES))
def test_each_format_written_as_a_pattern_is_one_xgrammar_writes_loosely(name):
    valid, invalid = FORMAT_CASES[name]
    compiled = _schema_grammar({"type": "string", "format": name})
    assert any(_takes(compiled, json.dumps(text)) for text in invalid), (
        f"xgrammar's format {name!r} now refuses every invalid case: it may leave FORMAT_REGEXES' use"
    )
    assert all(_takes(compiled, json.dumps(text)) for text in valid)


def test_xgrammar_writes_a_character_a_pattern_requires_raw():
    assert _takes(_schema_grammar({"type": "string", "pattern": '^"$'}), '"""'), (
        "xgrammar now escapes a quote a pattern requires: the escapes xgrammar_pattern writes may go"
    )
    assert _takes(_schema_grammar({"type": "string", "pattern": "^\\t$"}), '"\t"')  # a raw tab


@pytest.mark.parametrize(
    ("pattern", "written"),
    [
        ('^"$', '^(?:\\\\")$'),
        ("^\\\\$", "^(?:\\\\\\\\)$"),  # a backslash
        ("^\\x22\\u0022\\cJ\\0$", '^(?:\\\\")(?:\\\\")(?:\\\\n)(?:\\\\u0000)$'),
        ("^[\\b]$", "^(?:\\\\b)$"),  # a backspace in a class (a word boundary outside one)
        ('^[a"]$', '^(?:[a]|\\\\")$'),
        ("^[!-#]$", '^(?:[!\\u0023]|\\\\")$'),  # a range split around the quote
        ("^[^a]$", '^[^a\\u0000-\x1f"\\\\]$'),
        ("^.\\D$", '^[^\\u0000-\x1f"\\\\\\u2028\\u2029][^0-9\\u0000-\x1f"\\\\]$'),
        ("^[a-z]\\d\\w$", "^[a-z]\\d\\w$"),  # nothing to escape: as written
    ],
)
def test_characters_json_escapes_are_written_as_their_escapes(pattern, written):
    assert xgrammar_pattern(pattern) == written


@pytest.mark.parametrize(
    ("pattern", "taken", "refused"),
    [
        ("^[a\\S]+$", ['"ab"', '"a!é"'], ['"a"b"', '"a\\tb"', '"a\\mb"', '"a b"', '"a\\"b"']),
        ("^[\\Da]{1,3}$", ['"x y"', '"a%"'], ['"""', '"1"', '"x\\\\"']),
        ('^[a\\W]"$', ['"a\\""', '"%\\""'], ['"b\\""', '"a""', '"\\"\\""']),
        ("^[\\s\\d]+$", ['" 1"', '"2\u3000"'], ['"a"', '"\\u0001"', '"\\t1"']),
    ],
)
def test_class_escapes_inside_a_class_take_no_raw_quote(pattern, taken, refused, takes):
    """``\\D``, ``\\W`` and ``\\S`` inside a class were written as they were: a raw quote or
    backslash then matched them in the JSON text (``"a"b"``, ``"a\\mb"``: not JSON), and an escaped
    tab matched ``\\S`` as a backslash and a "t" (a probe, 2026-12-01). They are spelled as ranges
    now, less what JSON must escape (as ``.`` and negated classes are: those characters are not
    written there); such a class beside an escaped character was refused before."""
    schema = {"type": "string", "pattern": pattern}
    for text in taken:
        assert takes("json_schema", schema, text), text
        assert ecma_reference(pattern).search(json.loads(text)), text
    for text in refused:
        assert not takes("json_schema", schema, text), text


def test_classes_of_a_bounded_repetition_stay_classes():
    """``.``, negated classes and class escapes are written as one class each, not or'ed with the
    escapes of what JSON must escape: xgrammar writes a bounded repetition of an alternation
    (``.{1,80}``) as grammar rules, whose masks took 16 ms a token over a 49k-token vocabulary
    against 0.6 ms for the class (2026-12-01)."""
    for pattern in ["^.{1,80}$", "^[^a]{0,9}$", "^\\S{2}$", "^[a\\W]{3}$"]:
        assert "|" not in xgrammar_pattern(pattern), pattern


_JSON_ATOMS = ["a", "b", '"', "\\\\", "\\n", "\\t", "\\x01", '[a"]', "[^a]", ".", "\\d", "\\D", "\\W",
               "[\\x00-\\x1f]", "[!-#]", "[ -~]", "\\u0022", '[\\\\"]', "\\/", "\\s", "\\S", "[a\\S]",
               '[\\D"]', "[\\s\\d]", "[^\\s]", "[a\\W]"]  # fmt: skip


def _random_json_pattern(rng: random.Random, depth: int = 0) -> str:
    parts = []
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.2 and depth < 2:
            atom = (
                "(" + "|".join(_random_json_pattern(rng, depth + 1) for _ in range(rng.randint(1, 2))) + ")"
            )
        else:
            atom = rng.choice(_JSON_ATOMS)
        parts.append(atom + rng.choice(["", "", "?", "*", "+", "{1,2}"]))
    return "".join(parts)


def test_walks_through_patterns_naming_escaped_characters_give_json_that_matches():
    """60 random patterns mixing quotes, backslashes, control characters, classes (class escapes
    inside them too) and alternations, walked byte by byte 6 times each: every walk that ends is a
    JSON string (valid UTF-8 aside: xgrammar's classes take encoded surrogates byte by byte) that
    the pattern matches as ECMA-262 reads it (:func:`ecma_reference`). Unwritten, 52 of 614 such
    walks were not (a probe, 2026-12-01)."""
    rng = random.Random(20261201)
    mask = xgr.allocate_token_bitmask(1, 257)
    wrong, walked, escaped = [], 0, 0
    for _ in range(60):
        pattern = _random_json_pattern(rng)
        schema = {"type": "string", "pattern": f"^{pattern}$"}
        exact_patterns(schema)
        grammar = xgr.Grammar.from_json_schema(
            json.dumps(schema, ensure_ascii=False),
            any_whitespace=False,
            separators=(",", ":"),
            strict_mode=True,
        )
        compiled = _COMPILER.compile_grammar(xgr.Grammar.from_ebnf(_plain_pattern_rules(str(grammar))))
        for _ in range(6):
            matcher, out = xgr.GrammarMatcher(compiled), b""
            for _ in range(60):
                if matcher.is_terminated():
                    break
                matcher.fill_next_token_bitmask(mask)
                allowed = allowed_tokens(mask[0], 257).nonzero().flatten().tolist()
                if not allowed:  # (a dead end of xgrammar's byte-level classes: no walk)
                    break
                token = 256 if 256 in allowed and rng.random() < 0.3 else rng.choice(allowed)
                assert matcher.accept_token(token)
                out += bytes([token]) if token != 256 else b""
            try:
                text = out.decode()
            except UnicodeDecodeError:
                continue
            if not matcher.is_terminated():
                continue
            walked += 1
            value = json.loads(text) if _is_json(text) else None
            if not isinstance(value, str) or not ecma_reference(pattern).fullmatch(value):
                wrong.append(f"{pattern!r} gave {text!r}")
            escaped += "\\" in text
    # the walks took JSON escapes too
    assert walked > 200 and wrong == [] and escaped > 20, (walked, escaped, wrong[:5])


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _regex_takes(pattern: str, text: str) -> bool:
    """Whether ``pattern``'s grammar takes ``text``'s UTF-8 (a surrogate's own bytes too) and ends."""
    matcher = xgr.GrammarMatcher(_COMPILER.compile_grammar(xgr.Grammar.from_regex(pattern)))
    return all(
        matcher.accept_token(b) for b in text.encode("utf-8", "surrogatepass")
    ) and matcher.accept_token(256)


def test_xgrammar_reads_an_escaped_surrogate_pair_as_two_code_points():
    """The witness: ``\\ud83d\\ude00`` (how ECMA-262 and JSON write U+1F600) takes the two
    surrogates' own (invalid) UTF-8, not the emoji's, so no text matched it."""
    assert not _regex_takes("\\ud83d\\ude00", "😀"), "xgrammar now pairs the escapes: drop paired_surrogates"
    matcher = xgr.GrammarMatcher(_COMPILER.compile_grammar(xgr.Grammar.from_regex("\\ud83d\\ude00")))
    assert all(matcher.accept_token(b) for b in "\ud83d\ude00".encode("utf-8", "surrogatepass"))


@pytest.mark.parametrize(
    "pattern, written, matches, refused",
    [
        ("\\ud83d\\ude00", "\\u{1f600}", ["😀"], "\ud83d\ude00"),
        ("a\\uD83D\\uDE00+b", "a\\u{1f600}+b", ["a😀b", "a😀😀b"], "ab"),
        ("[\\ud83d\\ude00-\\ud83d\\ude4f]{2}", "[\\u{1f600}-\\u{1f64f}]{2}", ["😀🙏", "😃😄"], "😀a"),
        # negated: the same text without the surrogates; naming only them, any character
        ("[^\\ud800-\\udfff]", "[\\u{0}-\\u{d7ff}\\u{e000}-\\u{10ffff}]", ["a", "😀", "\n"], "ab"),
        ("[^a\\ud800]{2}", "[^\\u{61}]{2}", ["bc", "😀\ue000"], "ab"),
        ("[a\\ud800]{3}", "[\\u{61}]{3}", ["aaa"], "\ud800aa"),  # a surrogate member left out
        (
            "[\\u0000-\\uffff]{2}",
            "[\\u{0}-\\u{d7ff}\\u{e000}-\\u{ffff}]{2}",
            ["\x00é", "\ud7ff\ue000"],
            "a\udfff",
        ),
        ("[\\d\\ud800-\\udbff]", "[\\d]", ["5"], "\udbff"),
        ("\\\\ud800", "\\\\ud800", ["\\ud800"], "\ud800"),  # an escaped backslash, then text
        ("\\u{1F600}|x", "\\u{1f600}|x", ["😀", "x"], "y"),
    ],
)
def test_escaped_surrogate_pairs_are_written_as_their_character(pattern, written, matches, refused):
    """Pairs become their characters and a class loses its surrogates; each rewritten pattern
    takes the texts given and not ``refused`` (its surrogates' bytes, where it names some)."""
    from minisgl_core.api.ecma_regex import paired_surrogates

    assert paired_surrogates(pattern) == written
    for text in matches:
        assert _regex_takes(written, text), (written, text)
    assert not _regex_takes(written, refused)


@pytest.mark.parametrize(
    "pattern", [" \\ud800", "a|\\udc00", "\\ude00\\ud83d", "x\\u{d800}?", "[\\ud800-\\udfff]+", "a[\\udc00]?"]
)
def test_a_lone_surrogate_is_refused_at_admission(tokenizer, pattern):
    """No text holds one: admitted, the request failed mid-answer with a 400 (the grammar allowed
    no next token once it was due); now ``check`` refuses it, as a class naming nothing else."""
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    backend = XGrammarBackend(tokenizer, vocab_size=len(tokenizer), stop_token_ids=[stop])
    with pytest.raises(GrammarError, match="lone UTF-16 surrogate"):
        backend.check(GrammarSpec("regex", pattern))
    backend.check(GrammarSpec("regex", "\\ud83d\\ude00"))  # a pair is a character


def test_xgrammar_drops_the_escape_branches_of_a_json_string_pattern():
    """The witness: xgrammar compiles a string ``pattern`` into a ``json_string`` regex rule that
    never takes a branch naming a JSON escape, even written as :func:`xgrammar_pattern` writes it."""
    written = xgrammar_pattern('^[a"]+$')
    assert written == '^(?:[a]|\\\\")+$'
    assert _takes(_schema_grammar({"type": "string", "pattern": written}), '"a"')
    assert not _takes(_schema_grammar({"type": "string", "pattern": written}), '"a\\"a"'), (
        "xgrammar now takes escapes in a pattern's JSON string: drop _plain_pattern_rules"
    )


@pytest.mark.parametrize(
    "schema, takes, refuses",
    [
        ({"type": "string", "pattern": '^[a"]+$'}, ['"a"', '"\\""', '"a\\"a"'], ['"b"', '"a\\\\"']),
        ({"type": "string", "pattern": "^(?:b|\\\\)+$"}, ['"b"', '"\\\\"', '"b\\\\b"'], ['"\\""', '"a"']),
        ({"type": "string", "pattern": "^x[\\t y]$"}, ['"x\\t"', '"xy"', '"x "'], ['"x\t"', '"xz"']),
        (
            {
                "type": "object",
                "properties": {"q": {"type": "string", "pattern": '^"[a-z]+"$'}},
                "required": ["q"],
            },
            ['{"q":"\\"ab\\""}'],
            ['{"q":"ab"}', '{"q":""ab""}'],
        ),
        ({"type": "string", "pattern": "^[ab]{2}$"}, ['"ab"', '"ba"'], ['"a"', '"abc"']),
    ],
)
def test_a_pattern_naming_json_escapes_takes_them(tokenizer, schema, takes, refuses):
    """Through the backend (the pattern written for JSON text, its rule a plain regex): a pattern
    that allows a quote, a backslash or a tab beside plain characters takes their JSON escapes,
    and what it takes Python's ``re`` matches once decoded."""
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    backend = XGrammarBackend(tokenizer, vocab_size=len(tokenizer), stop_token_ids=[stop])
    compiled = _COMPILER.compile_grammar(backend._parse(GrammarSpec("json_schema", json.dumps(schema))))
    pattern = schema.get("pattern") or schema["properties"]["q"]["pattern"]
    for text in takes:
        assert _takes(compiled, text), text
        value = json.loads(text)
        assert re.search(pattern, value if isinstance(value, str) else value["q"]), text
    for text in refuses:
        assert not _takes(compiled, text), text


@pytest.mark.parametrize(
    "pattern, takes, refuses",
    [
        ("^\\ud83d\\ude00$", ['"😀"'], ['"a"']),
        ('^[\\ud83d\\ude00-\\ud83d\\ude4f"]+$', ['"😀\\"🙏"', '"🙂"'], ['"a"']),
        ("^[a\\ud800]+$", ['"aa"'], ['"\\ud800"']),
    ],
)
def test_a_schema_pattern_naming_surrogates_is_written_as_a_regex_grammar_is(
    tokenizer, pattern, takes, refuses
):
    """A JSON schema's ``pattern`` (ECMA-262, where ``\\ud83d\\ude00`` is U+1F600) gets the regex
    grammar's surrogate handling: ``^\\ud83d\\ude00$`` was admitted and failed mid-answer."""
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    backend = XGrammarBackend(tokenizer, vocab_size=len(tokenizer), stop_token_ids=[stop])
    schema = {"type": "string", "pattern": pattern}
    compiled = _COMPILER.compile_grammar(backend._parse(GrammarSpec("json_schema", json.dumps(schema))))
    for text in takes:
        assert _takes(compiled, text), text
    for text in refuses:
        matcher = xgr.GrammarMatcher(compiled)
        assert not (
            all(matcher.accept_token(b) for b in text.encode("utf-8", "surrogatepass"))
            and matcher.accept_token(256)
        ), text


@pytest.mark.parametrize("pattern", ["^a\\ud800$", "^[\\udc00-\\udfff]$"])
def test_a_schema_pattern_naming_a_lone_surrogate_is_refused(tokenizer, pattern):
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    backend = XGrammarBackend(tokenizer, vocab_size=len(tokenizer), stop_token_ids=[stop])
    schema = {"type": "object", "properties": {"q": {"type": "string", "pattern": pattern}}}
    with pytest.raises(GrammarError, match="json_schema pattern: .*lone UTF-16 surrogate"):
        backend.check(GrammarSpec("json_schema", json.dumps(schema)))
