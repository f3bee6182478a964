"""JSON schemas rewritten, in place and with the same meaning, into what xgrammar compiles right
(:func:`rewrite_for_xgrammar`): an ``enum`` filtered by the keywords beside it, whole integer
bounds, exact formats and patterns, a moot ``propertyNames`` dropped, an array or object that
counts its items or properties without describing them given ``items: {}`` or
``additionalProperties: {}``, a schema naming no type but holding keywords of some written as one
schema per type."""

from __future__ import annotations

import math
from typing import Any

from minisgl_core.api.grammar import FORMAT_REGEXES
from minisgl_plugin_xgrammar.patterns import xgrammar_pattern
from minisgl_plugin_xgrammar.schema_refs import refs_through_definitions, refuse_moved_refs
from minisgl_plugin_xgrammar.schema_walk import (
    _RANGE_KEYWORDS,
    _TYPE_KEYWORDS,
    _ChoiceFilters,
    _counts_items_of_none,
    _counts_properties_of_none,
    _fits,
    _integer_only,
    _integer_span,
    _is_number,
    _length_limits,
    _meets_no_value,
    _name_schemas,
    _types_left_open,
    _walk,
)


def rewrite_for_xgrammar(schema: Any) -> bool:
    """The rewrites a checked schema gets before xgrammar compiles it, in place; whether any
    changed it. The schemas ``$ref``s point into first become definitions, which no rewrite moves
    (a ``$ref`` into what one moves is refused); then types: the others read each schema's type."""
    refs, moved = refs_through_definitions(schema)
    changed = (
        moved
        | one_schema_per_type(schema)
        | apply_siblings_to_choices(schema)
        | whole_integer_bounds(schema)
        | exact_formats(schema)
        | exact_patterns(schema)
        | moot_property_names(schema)
        | open_counted_containers(schema)
    )
    refuse_moved_refs(schema, refs)
    return changed


#: how each bound of an integer rounds to the whole bound that allows the same integers
_WHOLE_BOUNDS = (
    ("minimum", math.ceil),
    ("maximum", math.floor),
    ("exclusiveMinimum", math.floor),
    ("exclusiveMaximum", math.ceil),
)


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


def open_counted_containers(schema: Any) -> bool:
    """Give each array schema in ``schema`` that counts items strict mode would not let it have
    (:func:`~minisgl_plugin_xgrammar.schema_walk._counts_items_of_none`) ``items: {}``, and each
    object schema that counts properties while naming none
    (:func:`~minisgl_plugin_xgrammar.schema_walk._counts_properties_of_none`)
    ``additionalProperties: {}``, in place: what JSON Schema says they allow, where xgrammar's
    strict mode allowed ``[]`` or ``{}`` alone, or refused the schema; whether any was. (An array
    with ``prefixItems`` and no ``minItems`` past them stays a closed tuple, as strict mode closes
    an object with ``properties``.)"""
    changed = False
    for sub, _, _ in _walk(schema):
        if _counts_items_of_none(sub):
            sub["items"], changed = {}, True
        if _counts_properties_of_none(sub):
            sub["additionalProperties"], changed = {}, True
    return changed


def one_schema_per_type(schema: Any) -> bool:
    """Write each schema in ``schema`` that names no type but holds keywords of some
    (:func:`~minisgl_plugin_xgrammar.schema_walk._types_left_open`, which xgrammar read as any value,
    dropping them, or as an object or array alone) as JSON Schema reads it, in place: an ``anyOf``
    of one schema per JSON type, each with that type's keywords (:data:`_TYPE_KEYWORDS`) and
    nothing else, the other keywords (``$defs``, ``title``...) left beside it. ``{"maxItems": 2}``
    becomes ``{"anyOf": [{"type": "object"}, {"type": "array", "maxItems": 2}, {"type":
    "string"}, ...]}``. A schema of property names (a ``propertyNames``, its branches, what they
    refer to) gets ``"type": "string"`` instead: a name is a string, and xgrammar writes a name as
    whatever its schema allows (``{1:1}`` for a number). Whether any was rewritten."""
    names = _name_schemas(schema)
    written: list[dict] = []
    for sub, _, _ in _walk(schema):  # (a schema is walked as rewritten: into its new branches)
        if not _types_left_open(sub):
            continue
        if id(sub) in names:
            sub["type"] = "string"
        else:
            branches = [
                {"type": name, **{key: sub.pop(key) for key in keys if key in sub}}
                for name, keys in _TYPE_KEYWORDS.items()
            ]
            # boolean and null have no keywords of their own: some branch is always left
            sub["anyOf"] = [branch for branch in branches if not _meets_no_value(branch)]
        written.append(sub)
    _branches_as_definitions(schema, [sub for sub in written if "anyOf" in sub and sub is not schema])
    return bool(written)


#: the name of the definitions :func:`_branches_as_definitions` adds, numbered
_BRANCHES_NAME = "minisgl_types_{}"


def _branches_as_definitions(root: Any, written: list[dict]) -> None:
    """Move the branches of each schema in ``written`` (rewritten by :func:`one_schema_per_type`,
    inside ``root``) into a definition of ``root``'s ``$defs``, the schema referring to it. xgrammar
    names a schema's rules by its path from the nearest definition, each branch and property a
    step longer: in 63 objects in objects naming no type, the names grew to 900 characters and
    the grammar's text with the square of the depth (117 KB), which xgrammar took 0.32 s to
    convert (0.02 s with a type); from a definition, each path starts anew."""
    definitions = root.setdefault("$defs", {}) if written and isinstance(root, dict) else None
    if not isinstance(definitions, dict):
        return
    number = 0
    for sub in written:
        while _BRANCHES_NAME.format(number) in definitions:
            number += 1
        name = _BRANCHES_NAME.format(number)
        definitions[name] = {"anyOf": sub.pop("anyOf")}
        sub["$ref"] = f"#/$defs/{name}"
