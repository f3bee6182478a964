"""Walking and reading a JSON schema for the checks and rewrites: every schema object with its path
and depth (:func:`_walk`), listed values, types and bounds, and whether a value keeps to the
keywords beside an ``enum`` (:class:`_ChoiceFilters`, by ``jsonschema`` under a deadline)."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any
from urllib.parse import unquote

from minisgl_core.api import GrammarError
from minisgl_core.api.grammar import FORMAT_REGEXES

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
    "$dynamicRef",
    "$recursiveRef",
)


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


def _readable(value: Any) -> bool:
    """Whether ``value`` is a number a 64-bit float holds (xgrammar reads every JSON number as one)."""
    if isinstance(value, float):
        return math.isfinite(value)
    return _is_number(value) and abs(value) <= _FLOAT_MAX


_FLOAT_MAX = int(sys.float_info.max)


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
    depth (the root is 1), parents before children, in the order they are written; then, walking
    from the root (``path`` "#"), each schema a ``$ref`` points at outside them (under a keyword
    none of them names, such as ``#/components/schemas/A``, or ``x-defs``), from its own path and
    depth 1, as a definition: xgrammar follows such a pointer, and what it finds there must be
    checked and rewritten as the rest (``{"maxItems": 1}`` under ``x-defs`` took any value)."""
    #: the objects yielded, by id (kept: an object freed mid-walk could pass its id to a new one)
    walked: dict[int, dict] = {}
    pending = [(schema, path)]
    while pending:
        holders = []
        stack = [(*pending.pop(0), 1)]
        while stack:
            sub, where, depth = stack.pop()
            if isinstance(sub, dict) and id(sub) not in walked:
                walked[id(sub)] = sub
                yield sub, where, depth
                holders += [sub] if "$ref" in sub else []
                stack += [(child, at, depth + 1) for child, at in reversed(_children(sub, where))]
        for holder in holders if path == "#" else ():
            tokens = _pointer(holder.get("$ref"))
            found = _at_pointer(schema, tokens) if tokens is not None else None
            if found is not None and isinstance(found[0], dict) and id(found[0]) not in walked:
                pending.append((found[0], _pointer_text(tokens)))


def too_deep(schema: Any, limit: int = MAX_SCHEMA_DEPTH) -> str | None:
    """The path of the first schema in ``schema`` nested deeper than ``limit`` levels, or None.
    Without recursion, and it stops there: a schema thousands deep costs what one at the limit does."""
    return next((path for _, path, depth in _walk(schema) if depth > limit), None)


#: the most optional properties the xgrammar backend compiles, as the sum of the squares of each
#: object's count (its compile time and memory grow so: on two cores one object of 1,000 took
#: 1.7 s, of 2,000 10-16 s and 0.4 GB, of 3,000 31-43 s and 1.5 GB, of 4,000 57 s and 1.8 GB, four
#: of 1,000 20 s, four of 1,500 43 s and 1 GB): that of one object of 2,000. Past it, a few
#: requests could hold gigabytes of the scheduler's memory for minutes each, as a compile past
#: its timeout cannot be stopped, and one object of 20,000 would need some 45 GB.
MAX_OPTIONAL_WEIGHT = 2000**2


def optional_properties(schema: Any) -> list[tuple[str, int]]:
    """(path, how many of its properties are not required) of each object schema in ``schema``
    that has any, in the order written; a definition counts once, however often it is referred to
    (xgrammar makes one rule of it)."""
    found = []
    for sub, path, _ in _walk(schema):
        properties = sub.get("properties")
        if not isinstance(properties, dict):
            continue
        required = sub.get("required")
        named = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
        optional = sum(1 for key in properties if key not in named)
        if optional:
            found.append((path, optional))
    return found


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

        def exact_format(regex: str, instance: Any) -> bool:
            return not isinstance(instance, str) or self._search(regex.removesuffix("$") + r"\Z", instance)

        try:
            base = jsonschema.validators.validator_for(self.root, default=jsonschema.Draft202012Validator)
            validator_cls = jsonschema.validators.extend(
                base, {"pattern": pattern, "patternProperties": pattern_properties}
            )
            # a format checked as the backend writes it alone (FORMAT_REGEXES), else as jsonschema
            # checks it here (email, uuid, ipv6...); one it cannot check asserts nothing
            formats = jsonschema.FormatChecker(formats=())
            formats.checkers.update(base.FORMAT_CHECKER.checkers)
            for name, regex in FORMAT_REGEXES.items():
                formats.checks(name)(partial(exact_format, regex))
            self._validator = validator_cls(self.root, format_checker=formats)
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


def _typed(schema: dict, name: str) -> bool:
    """Whether ``schema``'s ``type`` names ``name`` (alone or in a list), or it names no type but
    holds keywords of some (:func:`_types_left_open`): it is then written as one schema per type,
    one of ``name`` among them."""
    types = schema.get("type")
    return types == name or (isinstance(types, list) and name in types) or _types_left_open(schema)


#: the keywords that assert something of the values of one JSON type only: JSON Schema applies each
#: to a value of its type and lets a value of any other type pass it
_TYPE_KEYWORDS = {
    "object": (
        "properties", "patternProperties", "additionalProperties", "unevaluatedProperties",
        "propertyNames", "required", "minProperties", "maxProperties", "dependentRequired",
        "dependentSchemas", "dependencies",
    ),
    "array": (
        "items", "prefixItems", "additionalItems", "unevaluatedItems", "contains", "minContains",
        "maxContains", "minItems", "maxItems", "uniqueItems",
    ),
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "boolean": (),
    "null": (),
}  # fmt: skip


#: keywords xgrammar compiles before, and instead of, a schema's type: the type's keywords beside
#: them are filtered or refused by their own rules (apply_siblings_to_choices, _dropped_beside)
_COMPILED_BEFORE_TYPE = ("$ref", "const", "enum", "anyOf", "oneOf", "allOf")


def _types_left_open(schema: dict) -> bool:
    """Whether ``schema`` names no ``type`` yet holds keywords of some types (:data:`_TYPE_KEYWORDS`).
    xgrammar reads such a schema by its own rule, not JSON Schema's (any value, where each type's
    keywords bind the values of that type): as any value with the keywords dropped (``[1,2,3]``
    passed ``{"maxItems": 2}``, 3 ``{"minimum": 5}``, ``"abcd"`` ``{"maxLength": 3}``), or as an
    object alone beside ``properties`` or ``additionalProperties`` and an array alone beside
    ``items`` or ``prefixItems`` (5, which ``{"properties": {...}}`` allows, was refused).
    :func:`~minisgl_plugin_xgrammar.schema_rewrites.one_schema_per_type` rewrites it."""
    return (
        "type" not in schema
        and not any(key in schema for key in _COMPILED_BEFORE_TYPE)
        and any(key in schema for keys in _TYPE_KEYWORDS.values() for key in keys)
    )


#: the count keywords of each type, as (at least, at most)
_COUNT_LIMITS = (("minItems", "maxItems"), ("minLength", "maxLength"), ("minProperties", "maxProperties"))


def _meets_no_value(schema: dict) -> bool:
    """Whether ``schema``'s counts or bounds leave no value they bind: a least count above the
    most (``minItems`` 2, ``maxItems`` 1), or number bounds with no number between them
    (``minimum`` 5, ``maximum`` 1; ``exclusiveMinimum`` 1, ``maximum`` 1; draft 4's boolean
    ``exclusiveMinimum`` read as such). Each binds values of one type only: of a schema naming no
    type, it rules out that type's branch (:func:`one_schema_per_type`), not every value."""
    for least, most in _COUNT_LIMITS:
        if _is_number(schema.get(least)) and _is_number(schema.get(most)) and schema[least] > schema[most]:
            return True
    lows = [(schema[key], strict) for key, strict in (("minimum", schema.get("exclusiveMinimum") is True),
            ("exclusiveMinimum", True)) if _is_number(schema.get(key))]  # fmt: skip
    highs = [(schema[key], strict) for key, strict in (("maximum", schema.get("exclusiveMaximum") is True),
             ("exclusiveMaximum", True)) if _is_number(schema.get(key))]  # fmt: skip
    return any(low > high or (low == high and (a or b)) for low, a in lows for high, b in highs)


def _counts_items_of_none(schema: dict) -> bool:
    """Whether xgrammar's strict mode would read the array schema ``schema`` as allowing fewer
    items than its counts speak of: without ``items``, strict mode allows no item past
    ``prefixItems``, so ``minItems`` or ``maxItems`` with no ``prefixItems`` left ``[]`` alone
    (``{"type": "array", "maxItems": 3}`` refused ``[1]``; a bare ``{"type": "array"}`` is any
    array), and ``minItems`` past the ``prefixItems`` was refused as "additional items are not
    allowed", which the schema allows. :func:`open_counted_containers` gives it ``items: {}``.
    Not one with ``unevaluatedItems``: strict mode reads that as the items past ``prefixItems``
    (as JSON Schema does there), which ``items: {}`` would have let any value through."""
    if not _typed(schema, "array") or "items" in schema or "unevaluatedItems" in schema:
        return False
    prefix = schema.get("prefixItems")
    least = schema.get("minItems", 0)
    if prefix is None:
        return "minItems" in schema or "maxItems" in schema
    return isinstance(prefix, list) and isinstance(least, int) and least > len(prefix)


def _counts_properties_of_none(schema: dict) -> bool:
    """Whether xgrammar's strict mode would read the object schema ``schema`` as allowing no
    property although it counts them: ``minProperties`` or ``maxProperties`` with nothing naming
    keys (no ``properties``, ``patternProperties``, ``additionalProperties``, ``propertyNames``).
    ``{"type": "object", "maxProperties": 2}`` took ``{}`` alone and ``minProperties: 1`` was refused as
    "additional properties aren't allowed", where a bare ``{"type": "object"}`` is any object.
    :func:`open_counted_containers` gives it ``additionalProperties: {}`` (so a ``minProperties``
    above 1 is refused: a repeated key could meet it)."""
    named = ("properties", "patternProperties", "additionalProperties", "propertyNames")
    return (
        _typed(schema, "object")
        and not any(key in schema for key in named)
        and ("minProperties" in schema or "maxProperties" in schema)
    )


def _may_be_object(schema: dict) -> bool:
    types = schema.get("type", "object")
    return types == "object" or (isinstance(types, list) and "object" in types)


#: bounds of a number, beside which xgrammar drops an integer's ``multipleOf``
_RANGE_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _resolve(schema: Any, root: Any) -> Any:
    """``schema`` with a local ``$ref`` ("#/$defs/Name", a JSON pointer) followed, a few hops at
    most; None where it does not resolve (then nothing about it is provable)."""
    for _ in range(8):
        ref = schema.get("$ref") if isinstance(schema, dict) else None
        if ref is None:
            return schema
        tokens = _pointer(ref)
        found = _at_pointer(root, tokens) if tokens is not None else None
        if found is None:
            return None
        schema = found[0]
    return None


def _pointer(ref: Any) -> list[str] | None:
    """The tokens of a local ``$ref``'s JSON pointer, decoded as ``jsonschema`` decodes them
    (percent-escapes, then ``~1`` and ``~0``): "#/$defs/a~1b" -> ["$defs", "a/b"], "#" and "" ->
    []; None for a ref that is no such pointer (another document, an anchor)."""
    if not isinstance(ref, str) or not (ref == "" or ref.startswith("#")):
        return None
    text = unquote(ref[1:])
    if text == "":
        return []
    if not text.startswith("/"):
        return None
    return [token.replace("~1", "/").replace("~0", "~") for token in text[1:].split("/")]


def _at_pointer(root: Any, tokens: list[str]) -> tuple[Any] | None:
    """``(value,)`` at ``tokens`` (:func:`_pointer`) in ``root``, or None where nothing is there."""
    target = root
    for token in tokens:
        if isinstance(target, dict) and token in target:
            target = target[token]
        elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
            target = target[int(token)]
        else:
            return None
    return (target,)


def _deepest_on_pointer(root: Any, tokens: list[str]) -> tuple[Any, Any, int] | None:
    """(container, key, tokens read) of the deepest schema on the JSON pointer ``tokens`` reached
    from the root through schemas alone (a property's, an item's, a branch's...): where a rewrite
    may move it; None where that is the root."""
    node, place, read = root, None, 0
    while isinstance(node, dict) and read < len(tokens):
        keyword, value = tokens[read], node.get(tokens[read])
        name = tokens[read + 1] if read + 1 < len(tokens) else None
        if keyword in _SCHEMA_MAPS and isinstance(value, dict) and name in value:
            step = (value, name, read + 2)
        elif keyword in _SCHEMA_LISTS and isinstance(value, list) and name and name.isdigit():
            step = (value, int(name), read + 2)
        elif keyword in _SCHEMA_VALUES and isinstance(value, (dict, bool)):
            step = (node, keyword, read + 1)
        else:
            break
        container, key, read_then = step
        if isinstance(container, list) and key >= len(container):
            break
        if not isinstance(container[key], (dict, bool)):  # (not a schema: the pointer goes on in data)
            break
        place, read, node = step, read_then, container[key]
    return place


def _pointer_text(tokens: list[str]) -> str:
    """The ``$ref`` of a JSON pointer's ``tokens``, each escaped (``~0``, ``~1``, ``%25``): what
    :func:`_pointer` reads back into ``tokens``."""
    escaped = (token.replace("%", "%25").replace("~", "~0").replace("/", "~1") for token in tokens)
    return "#" + "".join("/" + token for token in escaped)


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


def _name_schemas(root: Any) -> set[int]:
    """The ``id`` of each schema in ``root`` that property names are checked against: every
    ``propertyNames``, and what its ``anyOf``, ``oneOf``, ``allOf`` and ``$ref`` lead to."""
    found: set[int] = set()
    stack = [sub["propertyNames"] for sub, _, _ in _walk(root) if isinstance(sub.get("propertyNames"), dict)]
    while stack:
        sub = stack.pop()
        if not isinstance(sub, dict) or id(sub) in found:
            continue
        found.add(id(sub))
        if "$ref" in sub:
            stack.append(_resolve({"$ref": sub["$ref"]}, root))
        for key in ("anyOf", "oneOf", "allOf"):
            if isinstance(sub.get(key), list):
                stack += sub[key]
    return found


def _value_schemas(root: Any) -> set[int]:
    """The ``id`` of each schema in ``root`` that values are checked against: the root, the schemas
    in it other than property names and definitions, and what their ``$ref``s lead to."""
    found: set[int] = set()
    stack = [root]
    while stack:
        sub = stack.pop()
        if not isinstance(sub, dict) or id(sub) in found:
            continue
        found.add(id(sub))
        kept = [child for child, where in _children(sub, "") if not where.startswith(_NOT_VALUES)]
        stack += kept + ([_resolve({"$ref": sub["$ref"]}, root)] if "$ref" in sub else [])
    return found


#: where a schema holds schemas that its value is not checked against
_NOT_VALUES = ("/propertyNames", "/$defs/", "/definitions/")
