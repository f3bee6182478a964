"""Reading ECMA-262 regexes (JSON Schema's ``pattern``, the regex grammars requests send) for
grammar backends, whose libraries read some of their escapes otherwise.

- :func:`read_escape`: the escape at a backslash, and the character it stands for;
- :func:`class_end`: where a class (``[...]``) ends; :func:`class_atoms`: its members;
- :func:`paired_surrogates`: a pattern naming UTF-16 surrogates rewritten as text can match it
  (an escaped pair as its character, classes without surrogates), or a :class:`GrammarError`
  naming a lone one. Both first-party backends (xgrammar, llguidance) apply it.
- :func:`ecma_dot`: ``.`` written as the class it is in ECMA-262 (no line terminator), for
  libraries whose ``.`` takes some (xgrammar's all four, llguidance's all but a line feed).

Free of torch, as the rest of the grammar API. Import from ``minisgl_core.api.ecma_regex``.
"""

from __future__ import annotations

from minisgl_core.api.grammar import GrammarError

#: a single-character escape of a regex and the character it stands for (ECMA-262)
_CHARACTER_ESCAPES = {"n": 0x0A, "r": 0x0D, "t": 0x09, "f": 0x0C, "v": 0x0B}


def read_escape(pattern: str, i: int, *, in_class: bool) -> tuple[str, int | None]:
    """The escape at ``pattern[i]`` (a backslash): its text, and the one character it stands for
    (None for a class such as ``\\d``, an assertion, a back-reference)."""
    rest = pattern[i + 1 : i + 2]
    hex_digits = "0123456789abcdefABCDEF"

    def hex_run(start: int, length: int) -> str | None:
        run = pattern[start : start + length]
        return run if len(run) == length and all(c in hex_digits for c in run) else None

    if not rest:
        return "\\", None
    if rest == "x" and (digits := hex_run(i + 2, 2)):
        return pattern[i : i + 4], int(digits, 16)
    if rest == "u":
        if pattern.startswith("{", i + 2):
            close = pattern.find("}", i + 3)
            body = pattern[i + 3 : close] if close > 0 else ""
            if body and all(c in hex_digits for c in body) and int(body, 16) <= 0x10FFFF:
                return pattern[i : close + 1], int(body, 16)
        elif digits := hex_run(i + 2, 4):
            return pattern[i : i + 6], int(digits, 16)
    if rest == "c" and pattern[i + 2 : i + 3].isascii() and pattern[i + 2 : i + 3].isalpha():
        return pattern[i : i + 3], ord(pattern[i + 2]) % 32
    if rest == "0" and not pattern[i + 2 : i + 3].isdigit():
        return pattern[i : i + 2], 0
    if rest in _CHARACTER_ESCAPES:
        return pattern[i : i + 2], _CHARACTER_ESCAPES[rest]
    if rest == "b":  # a backspace in a class, a word boundary outside one
        return pattern[i : i + 2], 0x08 if in_class else None
    if rest in "dDwWsSB":
        return pattern[i : i + 2], None
    if rest.isdigit():  # a back-reference
        end = i + 1
        while pattern[end : end + 1].isdigit():
            end += 1
        return pattern[i:end], None
    if rest in "pP" and pattern.startswith("{", i + 2):  # a Unicode property
        close = pattern.find("}", i + 3)
        return (pattern[i : close + 1], None) if close > 0 else (pattern[i : i + 2], None)
    return pattern[i : i + 2], ord(rest)  # an identity escape: \", \\, \/, \. ...


def paired_surrogates(pattern: str, what: str = "regex") -> str:
    """``pattern`` as a grammar library must be given it when it names UTF-16 surrogates, which no
    UTF-8 text holds:

    - an escaped pair (``\\ud83d\\ude00``, how ECMA-262 and JSON write a character above U+FFFF)
      is written as the one character it stands for (``\\u{1f600}``, which xgrammar and
      llguidance both read): xgrammar read each half as a code point of its own (admitted, then
      no next token mid-answer), llguidance refused the pattern;
    - a class leaves out the surrogates it names (``[a\\ud800]`` is ``[a]``, a range across
      U+D800-U+DFFF is cut around them): in xgrammar a model's token of a surrogate's first byte
      (0xED, which also begins U+D000-U+D7FF) let the grammar go on only with the surrogate;
      llguidance refused such a class. A negated class loses them too (the same text matches
      it), and one naming only surrogates (``[^\\ud800-\\udfff]``) matches any character.

    :class:`GrammarError` for a lone surrogate outside a class, or a class naming nothing else
    (not negated)
    (``what`` names the pattern in its message)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern[i] == "[":
            end = class_end(pattern, i) or len(pattern)
            out.append(_class_without_surrogates(pattern, i, end, what))
            i = end
            continue
        if pattern[i] != "\\":
            out.append(pattern[i])
            i += 1
            continue
        text, code = _pair_escape(pattern, i, in_class=False)
        if code is not None and 0xD800 <= code < 0xE000:
            raise GrammarError(
                f"{what}: {text} (character {i}) is a lone UTF-16 surrogate, which no text holds; "
                "write a character above U+FFFF as a surrogate pair (\\ud83d\\ude00) or \\u{1f600}"
            )
        out.append(f"\\u{{{code:x}}}" if code is not None and code > 0xFFFF else text)
        i += len(text)
    return "".join(out)


#: what ``.`` matches in ECMA-262 (no ``s`` flag): any character but a line terminator
ECMA_DOT = "[^\\n\\r\\u2028\\u2029]"


def ecma_dot(pattern: str) -> str:
    """``pattern`` with each ``.`` outside a class written :data:`ECMA_DOT`: xgrammar's ``.`` took
    a line feed, a carriage return, U+2028 and U+2029, llguidance's all but the line feed (a
    differential probe against ECMA-262's reading, 2026-12-01); an escaped dot stays one."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "[":
            end = class_end(pattern, i) or len(pattern)
            out.append(pattern[i:end])
            i = end
        elif char == "\\":
            text = read_escape(pattern, i, in_class=False)[0]
            out.append(text)
            i += len(text)
        else:
            out.append(ECMA_DOT if char == "." else char)
            i += 1
    return "".join(out)


def _pair_escape(pattern: str, i: int, *, in_class: bool) -> tuple[str, int | None]:
    """The escape at ``pattern[i]`` as :func:`read_escape` reads it, an escaped surrogate pair as
    one character."""
    text, code = read_escape(pattern, i, in_class=in_class)
    after = i + len(text)
    if code is not None and 0xD800 <= code < 0xDC00 and pattern.startswith("\\", after):
        low_text, low = read_escape(pattern, after, in_class=in_class)
        if low is not None and 0xDC00 <= low < 0xE000:
            return text + low_text, 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
    return text, code


def _class_without_surrogates(pattern: str, start: int, end: int, what: str) -> str:
    """The class ``pattern[start:end]`` without the surrogates it names, pairs written as their
    characters. A negated class matches the same text without them (llguidance refused the
    escapes, xgrammar took them); one that named nothing else matches any character."""
    negated = pattern.startswith("^", start + 1)
    j = start + 1 + negated
    members: list[tuple[str, int | None, int | None]] = []  # (text, first, last)
    body_end = end - 1 if pattern[end - 1 : end] == "]" and end - 1 > j else end
    while j < body_end:
        text, first = (
            _pair_escape(pattern, j, in_class=True) if pattern[j] == "\\" else (pattern[j], ord(pattern[j]))
        )
        j += len(text)
        last = first
        if pattern[j : j + 1] == "-" and j + 1 < body_end and first is not None:
            k = j + 1
            high_text, high = (
                _pair_escape(pattern, k, in_class=True)
                if pattern[k] == "\\"
                else (pattern[k], ord(pattern[k]))
            )
            if high is not None:
                text, last, j = pattern[j - len(text) : k + len(high_text)], high, k + len(high_text)
        members.append((text, first, last))
    touched = any(a is not None and b is not None and a <= 0xDFFF and b >= 0xD800 for _, a, b in members)
    paired = any(a is not None and b is not None and max(a, b) > 0xFFFF for _, a, b in members)
    opening, closing = pattern[start : start + 1 + negated], pattern[body_end:end]
    if not touched:
        return _written_class(opening, members, closing) if paired else pattern[start:end]
    kept = []
    for text, a, b in members:
        if a is None or b is None:
            kept.append((text, a, b))
            continue
        for lo, hi in ((a, min(b, 0xD7FF)), (max(a, 0xE000), b)):
            if lo <= hi:
                kept.append(("", lo, hi))
    if not kept and negated:  # [^\ud800-\udfff]: every character
        return _written_class("[", [("", 0, 0xD7FF), ("", 0xE000, 0x10FFFF)], closing)
    if not kept:
        raise GrammarError(
            f"{what}: the class {pattern[start:end]} (character {start}) names only lone UTF-16 "
            "surrogates, which no text holds"
        )
    return _written_class(opening, kept, closing)


def _written_class(opening: str, members: list[tuple[str, int | None, int | None]], closing: str) -> str:
    """A class from its members: a class escape as written, characters and ranges as ``\\u{...}``."""

    def char(code: int) -> str:
        return f"\\u{{{code:x}}}"

    parts = [
        text if a is None or b is None else char(a) if a == b else f"{char(a)}-{char(b)}"
        for text, a, b in members
    ]
    return opening + "".join(parts) + closing


def class_atoms(text: str) -> tuple[bool, list[tuple[str, int | None]]]:
    """The class ``text`` (from ``[`` to its ``]``, :func:`class_end`) read atom by atom: whether it
    is negated, and each member as :func:`read_escape` reads it, (its text, its character or None
    for a class escape), a ``-`` between two atoms being a range. A ``]`` first is a literal one."""
    negated = text.startswith("[^")
    i = 2 if negated else 1
    atoms: list[tuple[str, int | None]] = []
    if text.startswith("]", i):
        atoms.append(("]", 0x5D))
        i += 1
    while i < len(text) - 1:
        atom = read_escape(text, i, in_class=True) if text[i] == "\\" else (text[i], ord(text[i]))
        atoms.append(atom)
        i += len(atom[0])
    return negated, atoms


def class_end(pattern: str, start: int) -> int | None:
    """The index after the ``]`` closing the class that opens at ``pattern[start]``, or None."""
    i = start + 1
    if pattern.startswith("^", i):
        i += 1
    if pattern.startswith("]", i):  # a "]" first in a class is a literal one
        i += 1
    while i < len(pattern):
        if pattern[i] == "\\":
            i += len(read_escape(pattern, i, in_class=True)[0])
        elif pattern[i] == "]":
            return i + 1
        else:
            i += 1
    return None
