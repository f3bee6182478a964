"""``$ref``s kept on the schemas they point at while the rewrites move keywords about
(:func:`refs_through_definitions`, :func:`refuse_moved_refs`). A schema naming no type has its
keywords moved into one branch per type (``#/properties/a`` becomes ``#/anyOf/0/properties/a``, or
a ``$defs`` entry's), a ``patternProperties`` name is rewritten, a moot ``propertyNames`` dropped:
a ``$ref`` into any of them stopped resolving (xgrammar's "Cannot find field 'properties' in
#/properties/a", a 400 for a valid schema). So each schema a ``$ref`` points into first moves into
the root's ``$defs``, which no rewrite moves, leaving a ``$ref`` to it in its place."""

from __future__ import annotations

from typing import Any, NamedTuple

from minisgl_core.api import GrammarError
from minisgl_plugin_xgrammar.schema_walk import (
    _at_pointer,
    _deepest_on_pointer,
    _pointer,
    _pointer_text,
    _walk,
)

#: the name of the definitions :func:`refs_through_definitions` adds, numbered
_TARGET_NAME = "minisgl_ref_{}"


class _Ref(NamedTuple):
    #: the schema holding the ``$ref``, and its path as written
    holder: dict
    path: str
    #: the ``$ref`` as written, and the value it pointed at then
    written: str
    target: Any


def refs_through_definitions(root: Any) -> tuple[list[_Ref], bool]:
    """Move each schema that a ``$ref`` in ``root`` points into (at or below it), other than the
    root and the root's own ``$defs``/``definitions`` entries, into a ``$defs`` entry of the root,
    a ``$ref`` to it left in its place, and point the ``$ref``s there, in place: the rewrites after
    it move no such entry. The ``$ref``s followed, for :func:`refuse_moved_refs` (a ``$ref`` that
    resolves to nothing is refused before: ``invalid_values``), and whether any schema moved."""
    refs: list[_Ref] = []
    #: per schema moved, its place (container, key) and the refs into it (with what follows it)
    moving: dict[tuple[int, Any], tuple[Any, Any, list[tuple[_Ref, list[str]]]]] = {}
    for holder, path, _ in _walk(root):
        tokens = _pointer(holder.get("$ref"))
        found = _at_pointer(root, tokens) if tokens is not None else None
        if found is None:
            continue
        ref = _Ref(holder, path, holder["$ref"], found[0])
        refs.append(ref)
        place = _deepest_schema(root, tokens)
        if place is not None:
            container, key, depth = place
            moving.setdefault((id(container), key), (container, key, []))[2].append((ref, tokens[depth:]))
    definitions = root.setdefault("$defs", {}) if moving and isinstance(root, dict) else None
    if not isinstance(definitions, dict):
        return refs, False
    number = 0
    for container, key, into in moving.values():
        while _TARGET_NAME.format(number) in definitions:
            number += 1
        name = _TARGET_NAME.format(number)
        definitions[name] = container[key]
        container[key] = {"$ref": f"#/$defs/{name}"}
        for ref, rest in into:
            ref.holder["$ref"] = _pointer_text(["$defs", name, *rest])
    return refs, True


def _deepest_schema(root: Any, tokens: list[str]) -> tuple[Any, Any, int] | None:
    """:func:`~minisgl_plugin_xgrammar.schema_walk._deepest_on_pointer`, but None where that is
    one of the root's ``$defs``/``definitions`` entries, which no rewrite moves."""
    place = _deepest_on_pointer(root, tokens)
    if place is None or (place[2] == 2 and tokens[0] in ("$defs", "definitions")):
        return None
    return place


def refuse_moved_refs(root: Any, refs: list[_Ref]) -> None:
    """GrammarError for a ``$ref`` of ``refs`` (:func:`refs_through_definitions`) that no longer
    points at what it did, the rewrites done: one into something other than a schema (an unknown
    keyword) that a rewrite moved. xgrammar would follow it to nothing, or to something else."""
    for ref in refs:
        tokens = _pointer(ref.holder.get("$ref"))
        found = _at_pointer(root, tokens) if tokens is not None else None
        if found is None or found[0] is not ref.target:
            raise GrammarError(
                f"json_schema: '$ref' {ref.written!r} at {ref.path} points into a part of the schema "
                "the xgrammar backend moves to compile it (the keywords of a schema naming no 'type', "
                "'patternProperties' or 'propertyNames'), outside any schema in it: move what it "
                "points at into '$defs' and point there"
            )
