"""Regexes and printed EBNF as xgrammar must be given them to read them as ECMA-262 and JSON do:
regex grammars (:func:`xgrammar_regex`), JSON-schema patterns (:func:`xgrammar_pattern`), and
the grammar text xgrammar prints and parses again (:func:`unambiguous_hex`,
:func:`strict_limited_strings`)."""

from __future__ import annotations

import re

from minisgl_core.api.ecma_regex import class_atoms, class_end, ecma_dot, paired_surrogates, read_escape

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


def rewrite_printed(ebnf: str) -> str:
    """A JSON schema's grammar as xgrammar printed it, with the rules it gets wrong rewritten
    (:func:`_plain_pattern_rules`, :func:`strict_limited_strings`, :func:`plain_extra_keys`);
    parse it again only after :func:`unambiguous_hex`."""
    return plain_extra_keys(strict_limited_strings(_plain_pattern_rules(ebnf)))


#: an escape in a rule of the keys ``additionalProperties`` allows, as xgrammar (0.2.9) prints it
_EXTRA_KEY_ESCAPE = re.compile(r"^(\w*_addl_key\w* ::= .*)$", re.M)


#: the escapes an extra key may hold: those of the characters JSON must escape (a quote, a
#: backslash, control characters), never another character's (``\/``, ``\u0061``)
_KEY_ESCAPE_RULE = 'json_key_escape ::= ((["\\\\bfnrt]) | ("u" "0" "0" [01] [A-Fa-f0-9]))'


def plain_extra_keys(ebnf: str) -> str:
    """``ebnf`` (a JSON schema's grammar as xgrammar printed it) with the keys that
    ``additionalProperties`` allows taking no escape of a character JSON need not escape.
    xgrammar writes such a key as any string but the names in ``properties``, character by
    character, and let an escape stand for the next one: ``{"\\u0061":"x"}`` passed
    ``{"properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}}``,
    and parses to ``{"a": "x"}``. With only a quote's, a backslash's or a control character's
    escape, a key with an escape holds a character no name in ``properties`` does (the schema
    checks refuse names that need escapes beside such keys), and a key without one is read as
    written; every key stays possible, written as JSON writes it."""
    if not _EXTRA_KEY_ESCAPE.search(ebnf):
        return ebnf
    rewritten = _EXTRA_KEY_ESCAPE.sub(
        lambda m: m.group(1).replace('"\\\\" basic_escape', '"\\\\" json_key_escape'), ebnf
    )
    return rewritten if rewritten == ebnf else rewritten.rstrip("\n") + "\n" + _KEY_ESCAPE_RULE + "\n"


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


def xgrammar_regex(pattern: str, what: str = "regex") -> str:
    """A regex grammar (or a structural tag's regex) as xgrammar must be given it to read it as
    ECMA-262 does: UTF-16 surrogates as :func:`paired_surrogates` writes them, ``.`` as
    :func:`~minisgl_core.api.ecma_regex.ecma_dot` does (xgrammar's took line breaks: ``.+`` wrote
    several lines), ``\\xHH`` as :func:`xgrammar_hex_escapes` does."""
    return xgrammar_hex_escapes(ecma_dot(paired_surrogates(pattern, what=what)))


def xgrammar_pattern(pattern: str) -> str:
    """``pattern`` as xgrammar must be given it to match the JSON text of the strings ``pattern``
    matches. Three things xgrammar's converter of JSON-schema patterns (not its regex grammars)
    gets wrong are written around:

    - it matches the whole string, where JSON Schema searches for the pattern in it (ECMA-262's
      ``search``): ``"ba"`` was refused by ``"pattern": "a"``, the same in ``propertyNames`` and
      ``patternProperties``. Each top-level alternative not anchored by ``^`` or ``$``
      (:func:`anchored_alternatives`) gets any JSON string text before or after it
      (:data:`_JSON_ANY`); a pattern anchored at both ends is written as before. (One with an
      anchor elsewhere, which xgrammar ignored, is refused first:
      :func:`~minisgl_plugin_xgrammar.schema_checks.invalid_values`.)

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
    parts = anchored_alternatives(pattern)
    if parts is None or all(start and end for start, _, end in parts):
        return xgrammar_hex_escapes(_json_text(pattern))
    return xgrammar_hex_escapes("|".join(_searched(start, body, end) for start, body, end in parts))


def _searched(start: bool, body: str, end: bool) -> str:
    """The JSON text of the strings in which ``body`` is found, at their start if ``start``, at
    their end if ``end``."""
    if not body:
        return "" if start and end else _JSON_ANY
    return ("" if start else _JSON_ANY) + f"(?:{_json_text(body)})" + ("" if end else _JSON_ANY)


def _json_text(pattern: str) -> str:
    """:func:`xgrammar_pattern`'s JSON-text rewrite of ``pattern`` (surrogates already paired, hex
    escapes written after): what JSON must escape as its escapes, ``)?`` as ``){0,1}``."""
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
    return "".join(out)


#: any JSON string text (the content between the quotes): a character JSON writes raw, or the
#: escape of one it must escape (the escapes JSON requires only: every string can be written so)
_JSON_ANY = '(?:[^\\x00-\\x1f"\\\\]|\\\\["\\\\bfnrt]|\\\\u00[01][0-9a-fA-F])*'


def _tokens(pattern: str) -> list[tuple[str, int]]:
    """``pattern`` (ECMA-262) as its tokens, each with the depth of groups it stands in: an escape,
    a class, or one character (a group's ``(`` and ``)`` stand at the depth outside it)."""
    tokens: list[tuple[str, int]] = []
    i = depth = 0
    while i < len(pattern):
        if pattern[i] == "\\":
            text = read_escape(pattern, i, in_class=False)[0]
        elif pattern[i] == "[":
            text = pattern[i : class_end(pattern, i) or len(pattern)]
        else:
            text = pattern[i]
        depth -= text == ")"
        tokens.append((text, depth))
        depth += text == "("
        i += len(text)
    return tokens


def anchored_alternatives(pattern: str) -> list[tuple[bool, str, bool]] | None:
    """``pattern``'s top-level alternatives, each as (anchored at the start by ``^``, the rest,
    anchored at the end by ``$``), a group that is a whole alternative read as its own
    alternatives (``(^a|b)$`` is ``^a$`` or ``b$``); None where an anchor stands anywhere else
    (``a^b``, ``(^a)b``), which xgrammar ignored. Unbalanced groups: the whole pattern, anchored
    (xgrammar refuses it in its own words)."""
    tokens = _tokens(pattern)
    if any(depth < 0 for _, depth in tokens) or sum((t == "(") - (t == ")") for t, _ in tokens):
        return [(True, pattern, True)]
    alternatives: list[list[str]] = [[]]
    for text, depth in tokens:
        if text == "|" and depth == 0:
            alternatives.append([])
        else:
            alternatives[-1].append(text)
    parts: list[tuple[bool, str, bool]] = []
    for alternative in alternatives:
        start = end = False
        while alternative[:1] == ["^"]:
            start, alternative = True, alternative[1:]
        while alternative[-1:] == ["$"]:
            end, alternative = True, alternative[:-1]
        body = "".join(alternative)
        inner = _whole_group(alternative)
        if inner is not None and any(text in ("^", "$") for text, _ in _tokens(inner)):
            found = anchored_alternatives(inner)
            if found is None:
                return None
            parts += [(start or first, rest, end or last) for first, rest, last in found]
        elif any(text in ("^", "$") for text in alternative):
            return None
        else:
            parts.append((start, body, end))
    return parts


def _whole_group(tokens: list[str]) -> str | None:
    """What is inside the group that ``tokens`` are, if they are one group (``(...)``,
    ``(?:...)``, ``(?<name>...)``, no quantifier after it); else None."""
    if tokens[:1] != ["("] or tokens[-1:] != [")"]:
        return None
    depth = 0
    for i, text in enumerate(tokens):
        depth += (text == "(") - (text == ")")
        if depth == 0 and i < len(tokens) - 1:
            return None  # the first group closes before the end: "(a)(b)"
    inner = "".join(tokens[1:-1])
    if inner.startswith("?:"):
        return inner[2:]
    if inner.startswith("?<") and not inner.startswith(("?<=", "?<!")) and ">" in inner:
        return inner[inner.index(">") + 1 :]
    return None if inner.startswith("?") else inner


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
