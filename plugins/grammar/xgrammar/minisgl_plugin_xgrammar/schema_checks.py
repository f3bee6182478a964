"""The JSON schemas the xgrammar backend refuses, each with a GrammarError naming where and why:
those xgrammar would compile into a grammar passing output that breaks them (a keyword it does
not enforce, a part accepting no value, an overlapping ``oneOf``) or nests too deep or holds too many optional
properties to compile in time (:func:`refuse_what_xgrammar_gets_wrong`)."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any, NamedTuple

from minisgl_core.api import GrammarError
from minisgl_core.api.grammar import repeatable_key_count
from minisgl_plugin_xgrammar.patterns import anchored_alternatives
from minisgl_plugin_xgrammar.schema_walk import (
    _ASSERTIONS,
    _IGNORED_KEYWORDS,
    _INT64_MAX,
    _INT64_MIN,
    _NAMES_TOO_LONG,
    _RANGE_KEYWORDS,
    MAX_OPTIONAL_WEIGHT,
    MAX_SCHEMA_DEPTH,
    _at_pointer,
    _choice_filter,
    _ChoiceFilters,
    _counts_properties_of_none,
    _deepest_on_pointer,
    _first_five,
    _fits,
    _integer_only,
    _integer_span,
    _is_number,
    _length_limits,
    _limit_words,
    _may_be_object,
    _name_schemas,
    _pattern_search,
    _pointer,
    _readable,
    _resolve,
    _shown,
    _tags,
    _types,
    _types_left_open,
    _value_schemas,
    _values,
    _walk,
    optional_properties,
    too_deep,
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


#: drafts in which ``$ref`` overrides the keywords beside it, as xgrammar reads every schema
_REF_ALONE_DRAFTS = ("draft-03", "draft-04", "draft-06", "draft-07")


def refuse_what_xgrammar_gets_wrong(schema: Any) -> None:
    """GrammarError for a schema xgrammar would compile into a grammar passing output that breaks
    it: nested deeper than MAX_SCHEMA_DEPTH (checked first: the other walks recurse), a part
    accepting no value, a keyword it does not enforce; or one too costly to compile (more optional
    properties than MAX_OPTIONAL_WEIGHT)."""
    deep = too_deep(schema)
    if deep is not None:
        raise GrammarError(
            f"json_schema: nested deeper than {MAX_SCHEMA_DEPTH} levels at {deep} (the xgrammar "
            "backend takes schemas in schemas up to that depth: its compile time grows with the cube "
            "of the depth)"
        )
    _refuse_too_many_optional(schema)
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


def _refuse_too_many_optional(schema: Any) -> None:
    """GrammarError for a schema whose optional properties would cost xgrammar's compile more than
    MAX_OPTIONAL_WEIGHT (minutes and gigabytes, which a compile past its timeout goes on using)."""
    objects = optional_properties(schema)
    weight = sum(count * count for _, count in objects)
    if weight <= MAX_OPTIONAL_WEIGHT:
        return
    path, most = max(objects, key=lambda found: found[1])
    others = f" and {len(objects) - 1:,} more object(s)" if len(objects) > 1 else ""
    raise GrammarError(
        f"json_schema: too many optional properties for the xgrammar backend: {most:,} in the object "
        f"at {path}{others}. Its compile time and memory grow with the square of an object's optional "
        f"properties (an object of 4,000 took a minute and 1.8 GB on two cores); it takes at most as "
        f"many as one object of {math.isqrt(MAX_OPTIONAL_WEIGHT):,} (the squares of the objects' "
        "counts summed). List more properties in 'required', or split the schema"
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
    at all) or to no schema in it (:func:`_ref_target_problem`), a ``pattern`` with a lookaround
    (its regex converter has none) or an anchor it ignores
    (``a^b``: :func:`~minisgl_plugin_xgrammar.patterns.anchored_alternatives`), and an integer's bound
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
        elif isinstance(ref, str) and ref not in ("", "#") and not ref.startswith("#/"):
            # a plain-name fragment names an "$anchor": xgrammar resolves JSON pointers only, and
            # compiled {"$ref": "#foo"} with no constraint at all (a string answered an integer's)
            found.append(
                f"'$ref' {ref!r} names an anchor, which the xgrammar backend cannot follow (write the "
                f"JSON pointer to the schema, such as '#/$defs/Name') at {path}"
            )
        elif isinstance(ref, str) and (problem := _ref_target_problem(schema, ref)):
            # (xgrammar's own words, "Cannot find field 'a' in #/$defs/a", named no path; and a
            # rewrite adds definitions that such a pointer could come to point at)
            found.append(f"'$ref' {ref!r} {problem} at {path}")
        pattern = sub.get("pattern")
        if isinstance(pattern, str) and _LOOKAROUND.search(pattern):
            found.append(
                f"'pattern' {pattern!r} has a lookaround, which the xgrammar backend cannot follow, at {path}"
            )
        names = sub.get("patternProperties")
        for key, written in [("pattern", pattern)] + [("patternProperties", name) for name in names or ()]:
            if isinstance(written, str) and anchored_alternatives(written) is None:
                found.append(
                    f"{key!r} {written!r} has '^' or '$' inside it (not at the start or end of the "
                    f"pattern or of one of its alternatives), which the xgrammar backend cannot "
                    f"follow, at {path}"
                )
        if not _integer_only(sub):
            # a number's bounds are read as 64-bit floats: 9007199254740992 passed minimum
            # 9007199254740993 (2**53+1, read as 2**53) beside "type": "number" (a random-schema walk)
            found += [
                f"{key!r} {_shown(sub[key])} is an integer a 64-bit float does not hold exactly (the "
                f"xgrammar backend reads a number's bounds as floats: {float(sub[key])!r}; an integer "
                f"up to 2**53 is held exactly), at {path}"
                for key in _RANGE_KEYWORDS
                if _is_number(sub.get(key)) and _readable(sub[key]) and float(sub[key]) != sub[key]
            ]
            found += [
                f"{key!r} {sub[key]!r} at {path}, which the xgrammar backend writes with 6 decimals as "
                f"{written}: the bound itself would pass (the 64-bit float it reads has other decimals there); "
                "give it as a whole number, or as an inclusive bound"
                for key in _exclusive_bounds_in_force(sub)
                if (written := _loosened_bound(key, sub[key])) is not None
            ]
        else:
            found += [
                f"{key!r} {_shown(sub[key])} is beyond the 64-bit integers (-2**63 to 2**63-1) the xgrammar "
                f"backend takes as an integer's bounds, at {path}"
                for key in _RANGE_KEYWORDS
                if _readable(sub.get(key)) and not _INT64_MIN <= sub[key] <= _INT64_MAX
            ]
    return found


def _exclusive_bounds_in_force(schema: dict) -> list[str]:
    """The exclusive bounds of a number schema that xgrammar applies: ``exclusiveMinimum`` where it
    is at least the ``minimum`` beside it (or none is), ``exclusiveMaximum`` where at most the
    ``maximum``. xgrammar writes a number's range as a regex of the bounds printed with 6 decimals,
    and a float's 6 decimals may be another number: ``exclusiveMaximum`` 20659077510.9 printed as
    20659077510.900002 let 20659077510.9 itself through (a probe after a random-schema walk)."""
    found = []
    for exclusive, inclusive, wins in (
        ("exclusiveMinimum", "minimum", lambda a, b: a >= b),
        ("exclusiveMaximum", "maximum", lambda a, b: a <= b),
    ):
        bound, other = schema.get(exclusive), schema.get(inclusive)
        if _is_number(bound) and (not _is_number(other) or wins(bound, other)):
            found.append(exclusive)
    return found


def _loosened_bound(key: str, bound: Any) -> Decimal | None:
    """The bound xgrammar writes for the exclusive bound ``key`` (``exclusiveMinimum`` or
    ``exclusiveMaximum``) of a number, where it lies beyond ``bound`` (letting ``bound`` itself
    through), else None. xgrammar (0.2.9) writes a number's range with 6 decimals: the bound
    printed so (``%.6f``), moved a millionth inward where that reads as a float beyond it. A float
    whose 6 decimals read as itself but are another decimal stays beyond: 20659077510.9 prints as
    20659077510.900002 (the float is 20659077510.9000015...), 887960813819214.4 as ...214.375000."""
    if not isinstance(bound, float) or not math.isfinite(bound):
        return None
    written = Decimal(f"{bound:.6f}")
    step = Decimal("0.000001")
    if key == "exclusiveMinimum":
        written += step if float(written) < bound else 0
        loosened = written < Decimal(repr(bound))
    else:
        written -= step if float(written) > bound else 0
        loosened = written > Decimal(repr(bound))
    return written if loosened else None


def _ref_target_problem(root: Any, ref: str) -> str | None:
    """What is wrong with where the JSON pointer ``ref`` ("#/$defs/Name") leads in ``root``, or
    None: nothing there, something other than a schema (an object, true or false), or a schema's
    value (its ``const``, ``enum``, ``default`` or ``examples``: read as a schema, it would be
    rewritten as one, changing the value)."""
    tokens = _pointer(ref)
    found = _at_pointer(root, tokens) if tokens is not None else None
    if found is None or not isinstance(found[0], (dict, bool)):
        return "points at no schema in this one"
    place = _deepest_on_pointer(root, tokens)
    read = place[2] if place is not None else 0
    if read < len(tokens) and tokens[read] in _VALUE_KEYWORDS:
        return f"points into the {tokens[read]!r} of a schema, a value the xgrammar backend does not read as a schema,"
    return None


#: keywords whose value is a JSON value, not a schema
_VALUE_KEYWORDS = ("const", "enum", "default", "examples")


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


def accepting_nothing(schema: Any) -> list[str]:
    """The parts of ``schema`` that accept no value, each as "... at PATH": ``anyOf`` or ``oneOf``
    of no schemas, an ``enum`` none of whose values keeps to the length limits beside it, a
    ``const`` that breaks them or that the ``enum`` beside it does not list (xgrammar compiles the
    ``const`` alone). xgrammar compiles each into a grammar that a server answered ""
    for (it refuses ``false`` and an empty ``enum`` itself). And an integer whose bounds leave no
    integer (``minimum`` 2.5, ``maximum`` 2.7): rounded to whole bounds for xgrammar, that read
    "minimum greater than maximum", of bounds the user never wrote."""
    found: list[str] = []
    choices = _ChoiceFilters(schema)
    for sub, path, _ in _walk(schema):
        found += [f"{key!r} of no schemas at {path}" for key in ("anyOf", "oneOf") if sub.get(key) == []]
        if sub.get("type") == []:  # (xgrammar compiled it with no constraint at all)
            found.append(f"'type' of no types at {path}")
        limits = _length_limits(sub)
        values = sub.get("enum")
        if "const" in sub and isinstance(values, list) and not _listed(sub["const"], values):
            # xgrammar compiles the const alone: "b" passed {"enum": ["a"], "const": "b"}
            found.append(f"'const' that the 'enum' beside it rules out at {path}")
        elif limits is not None and "const" in sub and not _fits(sub["const"], limits):
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


def _listed(value: Any, values: list) -> bool:
    """Whether ``value`` is one of ``values`` as JSON Schema's ``enum`` compares them (1 and 1.0
    alike, True apart from 1, in arrays and objects too)."""
    import jsonschema

    return jsonschema.Draft202012Validator({"enum": values}).is_valid(value)


#: the largest ``multipleOf`` of an integer xgrammar enforces (it ignores a larger one)
MAX_INTEGER_MULTIPLE_OF = 1024


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
    a ``pattern`` beside such a format, and a schema naming no type that both names and values
    are held to (:func:`_names_also_values`)."""
    found: list[str] = []
    for sub, where, _ in _walk(schema, path):
        found += _unenforced_here(sub, where)
        found += _overlapping_one_of(sub, where, schema)
        found += _dropped_beside(sub, where, schema)
        found += _names_ruled_out(sub, where, schema)
        found += _names_not_strings(sub, where, schema)
    return found + _names_also_values(schema, path)


def _names_also_values(root: Any, path: str = "#") -> list[str]:
    """Each schema naming no type but holding keywords of some that both property names and values
    are held to (a ``$ref`` to it from each side), as "... at PATH". For names it becomes a string
    schema (``one_schema_per_type``: xgrammar writes a name as whatever its schema allows), which
    would refuse a value of another type that the schema allows (``{"b": 1}`` for
    ``"additionalProperties": {"$ref": "#/propertyNames"}`` beside ``"propertyNames": {"maxLength": 1}``)."""
    names = _name_schemas(root)
    values = _value_schemas(root) if names else set()
    return [
        f"a schema naming no 'type' that is both a 'propertyNames' and a value's schema at {where} "
        "(the backend writes it as a string schema for the names, which would refuse the values "
        "of other types it allows; give it a 'type', or write it once for each)"
        for sub, where, _ in _walk(root, path)
        if id(sub) in names and id(sub) in values and _types_left_open(sub)
    ]


def _names_not_strings(schema: dict, path: str, root: Any) -> list[str]:
    """A ``propertyNames`` (or a branch or definition it leads to) that allows values other than
    strings, as one entry: xgrammar writes a name as whatever its schema allows, so ``{"anyOf":
    [{"type": "number"}, ...]}``, ``"type": ["string", "null"]`` or ``{"enum": [1, "a"]}`` let it
    write ``{1:1}`` or ``{null:1}``, which is not JSON. A name is a string: such a schema must
    describe strings only."""
    names = schema.get("propertyNames")
    if not isinstance(names, dict):
        return []
    stack, seen = [(names, f"{path}/propertyNames")], set()
    while stack:
        sub, where = stack.pop()
        if not isinstance(sub, dict) or id(sub) in seen:
            continue
        seen.add(id(sub))
        kind = sub.get("type")
        values = sub.get("enum") if isinstance(sub.get("enum"), list) else []
        values = values + ([sub["const"]] if "const" in sub else [])
        if (kind is not None and kind != "string") or any(not isinstance(v, str) for v in values):
            return [
                f"'propertyNames' at {path} allowing values other than strings (at {where}: a "
                "property name is a string, and the backend would write the others as names, "
                "which is not JSON; describe strings only)"
            ]
        if "$ref" in sub:
            stack.append((_resolve({"$ref": sub["$ref"]}, root), sub["$ref"]))
        for key in ("anyOf", "oneOf", "allOf"):
            branches = sub.get(key) if isinstance(sub.get(key), list) else []
            stack += [(branch, f"{where}/{key}/{i}") for i, branch in enumerate(branches)]
    return []


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
    # (strict mode: no keys outside 'properties' unless 'additionalProperties' says so, or an
    # object naming no keys gets it: open_counted_containers)
    if repeatable_key_count(schema, additional_properties_default=_counts_properties_of_none(schema)):
        found.append(f"'minProperties' with keys outside 'properties' at {path}")
    required = schema.get("required")
    properties = schema.get("properties")
    found += _names_extra_keys_pass(schema, path)
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


def _names_extra_keys_pass(schema: dict, path: str) -> list[str]:
    """Where ``additionalProperties`` allows extra keys (anything but false) beside ``properties``,
    what lets an extra key be a name of ``properties`` with the extra keys' schema: a name that JSON
    writes with an escape (a quote, a backslash, a control character; xgrammar left it out of the
    extra keys unescaped, so ``{"a\\"b": "x"}`` passed ``{"properties": {"a\\"b": {"type":
    "integer"}}, "additionalProperties": {"type": "string"}}``), and a ``propertyNames`` (xgrammar
    writes the extra keys as its names, ``properties``' among them: ``{"a": "s"}`` passed
    ``{"properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"},
    "propertyNames": {"pattern": "^[a-z]*$"}}``). The escapes of the other extra keys:
    :func:`~minisgl_plugin_xgrammar.patterns.plain_extra_keys`."""
    names = schema.get("properties")
    if not isinstance(names, dict) or not names or schema.get("additionalProperties", False) is False:
        return []
    found = []
    escaped = [name for name in names if any(c in '"\\' or ord(c) < 0x20 for c in name)]
    if escaped:
        found.append(
            f"the name {escaped[0]!r} of 'properties', which JSON writes with an escape, beside "
            f"'additionalProperties' at {path} (an extra key written so would pass; rename the property)"
        )
    if "propertyNames" in schema:
        found.append(
            f"'propertyNames' beside 'properties' and 'additionalProperties' at {path} (it lets the "
            "names of 'properties' through as extra keys, with the extra keys' schema)"
        )
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
