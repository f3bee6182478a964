"""The stable API cannot change by accident: names and signatures of ``minisgl_core.api`` and the
hookspecs are compared with ``tests/api_snapshot.json``. (``minisgl_core.layers``, the kernels and
model layers plugins may use, is not part of the API since 2.0 and is not compared.)

Any difference fails. To change the API on purpose:

1. bump ``API_VERSION`` in ``minisgl_core/api/__init__.py``: the major for a removed or changed
   name or signature (and keep the old spelling one minor version with
   ``minisgl_core.api.deprecation`` where possible), the minor for additions only;
2. add a line for the new version to ``CHANGELOG.md`` ("- API 1.1: ...");
3. regenerate: ``.venv/bin/python tests/test_api_snapshot.py --update`` (it refuses when 1 or 2
   is missing or the bump is too small; ``--force`` skips those checks, for before a release only).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = ROOT / "tests" / "api_snapshot.json"
CHANGELOG = ROOT / "CHANGELOG.md"


# ---------------------------------------------------------------- describing the API


def _clean(text: str) -> str:
    return re.sub(r" at 0x[0-9a-f]+", "", text)


def _signature(obj: Any) -> str:
    try:
        return _clean(str(inspect.signature(obj)))
    except (TypeError, ValueError):
        return "(?)"


def _value(value: Any) -> str:
    if isinstance(value, (frozenset, set)):
        return "{" + ", ".join(sorted(map(repr, value))) + "}"
    return _clean(repr(value))


def _annotation(annotation: Any) -> str:
    # ForwardRef's repr differs between Python versions; its text does not
    text = getattr(annotation, "__forward_arg__", annotation)
    return text if isinstance(text, str) else inspect.formatannotation(text)


def _member(owner: type, name: str) -> str | None:
    raw = inspect.getattr_static(owner, name)
    if isinstance(raw, staticmethod):
        return "staticmethod " + _signature(raw.__func__)
    if isinstance(raw, classmethod):
        return "classmethod " + _signature(raw.__func__)
    if isinstance(raw, functools.cached_property):
        return "cached_property -> " + _annotation(inspect.signature(raw.func).return_annotation)
    if isinstance(raw, property):
        abstract = "abstract " if getattr(raw, "__isabstractmethod__", False) else ""
        return abstract + "property -> " + _annotation(inspect.signature(raw.fget).return_annotation)
    if inspect.isfunction(raw):
        abstract = "abstract " if getattr(raw, "__isabstractmethod__", False) else ""
        return abstract + "def " + _signature(raw)
    if isinstance(raw, (bool, int, float, str, frozenset, set, tuple)) or raw is None:
        return "= " + _value(raw)
    return None  # descriptors of tuple fields and the like are described as fields


def _fields(cls: type) -> dict[str, str] | None:
    if dataclasses.is_dataclass(cls):
        out = {}
        for f in dataclasses.fields(cls):
            default = "" if f.default is dataclasses.MISSING else " = " + _value(f.default)
            factory = "" if f.default_factory is dataclasses.MISSING else " = <factory>"
            out[f.name] = f"{_annotation(f.type)}{default}{factory}"
        return out
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        defaults = getattr(cls, "_field_defaults", {})
        hints = getattr(cls, "__annotations__", {})
        return {
            name: _annotation(hints.get(name, "?"))
            + (f" = {_value(defaults[name])}" if name in defaults else "")
            for name in cls._fields
        }
    return None


def describe(obj: Any) -> Any:
    if inspect.isclass(obj):
        members = {}
        for name in sorted(dir(obj)):
            definer = next((k for k in obj.__mro__ if name in k.__dict__), None)
            if (name.startswith("_") and name != "__init__") or definer is None:
                continue
            if not definer.__module__.startswith("minisgl_core"):
                continue  # inherited from torch.nn.Module, tuple, ...: not ours to promise
            text = _member(obj, name)
            if text is not None:
                members[name] = text
        return {
            "bases": [f"{b.__module__}.{b.__qualname__}" for b in obj.__bases__],
            "abstract": inspect.isabstract(obj),
            "fields": _fields(obj),
            "members": members,
        }
    if inspect.isfunction(obj):
        return "def " + _signature(obj)
    if isinstance(obj, str):
        return "str"
    if hasattr(obj, "project_name"):  # pluggy's markers: their repr names pluggy's private modules
        return f"{type(obj).__name__}({obj.project_name!r})"
    return _clean(repr(obj))


def describe_api() -> dict[str, Any]:
    import minisgl_core.api as api
    from minisgl_core.api import hookspecs

    marker = f"{hookspecs.PROJECT}_spec"
    hooks = {
        # only the options pluggy has had since 1.0, so a pluggy upgrade alone changes nothing
        name: {
            "signature": _signature(fn),
            "options": {
                k: _value(getattr(fn, marker).get(k)) for k in ("firstresult", "historic", "warn_on_impl")
            },
        }
        for name, fn in sorted(vars(hookspecs).items())
        if inspect.isfunction(fn) and hasattr(fn, marker)
    }
    return {
        "minisgl_core.api": {name: describe(getattr(api, name)) for name in sorted(api.__all__)},
        "hooks": hooks,
    }


# ---------------------------------------------------------------- comparing


def flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(tree, dict) and tree:
        out: dict[str, str] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else key))
        return out
    return {prefix: json.dumps(tree, sort_keys=True)}


def _parameters(signature: str) -> tuple[list[str], str] | None:
    """The parameters (split at top-level commas) and the rest of ``"def (params) -> ret"``."""
    if not signature.startswith('"def ('):
        return None
    depth, params, current = 0, [], ""
    for i, char in enumerate(signature[len('"def (') :], start=len('"def (')):
        if char == ")" and depth == 0:
            params.append(current.strip())
            return [p for p in params if p], signature[i:]
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            params.append(current.strip())
            current = ""
        else:
            current += char
    return None


def extends(old: str, new: str) -> bool:
    """``new`` is the signature ``old`` with parameters added at the end, each with a default:
    every call that worked still does (a dataclass growing a defaulted field, for example)."""
    a, b = _parameters(old), _parameters(new)
    if a is None or b is None or a[1] != b[1]:
        return False
    (old_params, _), (new_params, _) = a, b
    added = new_params[len(old_params) :]
    return new_params[: len(old_params)] == old_params and bool(added) and all("=" in p for p in added)


def bases_extend(old: str, new: str, api: dict[str, Any]) -> bool:
    """A class's ``new`` bases (JSON lists of qualified names) keep every ``old`` base among their
    ancestors, looked up in the ``api`` description: a class inserted between a class and its base
    (``StreamingToolParser`` above ``JsonToolCallParser`` in 2.5) breaks no isinstance check."""
    old_bases, new_bases = json.loads(old), json.loads(new)
    seen: set[str] = set()
    todo = list(new_bases)
    while todo:
        base = todo.pop()
        if base not in seen:
            seen.add(base)
            described = api.get(base.rsplit(".", 1)[-1])
            todo += described.get("bases", []) if isinstance(described, dict) else []
    return old_bases != new_bases and set(old_bases) <= seen


def compare(old: dict[str, Any], new: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """(removed, changed, added) paths between two API descriptions; a signature that only gained
    trailing parameters with defaults, and a class that only gained a base between it and its old
    ones, count as added."""
    a, b = flatten(old), flatten(new)
    api = new.get("minisgl_core.api", {})

    def grew(key: str) -> bool:
        if key.endswith(".bases"):
            return bases_extend(a[key], b[key], api)
        return extends(a[key], b[key])

    removed = sorted(k for k in a if k not in b)
    changed = sorted(k for k in a if k in b and a[k] != b[k] and not grew(k))
    added = sorted([k for k in b if k not in a] + [k for k in a if k in b and a[k] != b[k] and grew(k)])
    return removed, changed, added


def bump_problem(
    old_version: str, new_version: str, removed: list[str], changed: list[str], added: list[str]
) -> str | None:
    """Why the version change does not fit the API change, or None when it does."""
    old_major, old_minor = (int(x) for x in old_version.split("."))
    major, minor = (int(x) for x in new_version.split("."))
    if removed or changed:
        if major <= old_major:
            return (
                f"names were removed or changed: API_VERSION must go to {old_major + 1}.0 (is {new_version})"
            )
    elif added and (major, minor) <= (old_major, old_minor):
        return f"names were added: API_VERSION must go to at least {old_major}.{old_minor + 1} (is {new_version})"
    return None


def changelog_mentions(version: str) -> bool:
    text = CHANGELOG.read_text() if CHANGELOG.is_file() else ""
    return re.search(rf"^\s*[-*#].*\bAPI {re.escape(version)}\b", text, re.M) is not None


def diff_report(removed: list[str], changed: list[str], added: list[str]) -> str:
    lines = (
        [f"  removed: {p}" for p in removed]
        + [f"  changed: {p}" for p in changed]
        + [f"  added:   {p}" for p in added]
    )
    return "\n".join(lines[:40]) + (f"\n  ... {len(lines) - 40} more" if len(lines) > 40 else "")


# ---------------------------------------------------------------- tests


def test_api_matches_the_snapshot() -> None:
    from minisgl_core.api import API_VERSION

    snapshot = json.loads(SNAPSHOT.read_text())
    removed, changed, added = compare(snapshot["api"], describe_api())
    assert not (removed or changed or added), (
        f"minisgl_core.api differs from tests/api_snapshot.json (API {snapshot['api_version']}):\n"
        f"{diff_report(removed, changed, added)}\n{__doc__}"
    )
    assert snapshot["api_version"] == API_VERSION, (
        "API_VERSION changed: regenerate the snapshot (see this file)"
    )


def test_changelog_has_a_line_for_the_api_version() -> None:
    from minisgl_core.api import API_VERSION

    assert changelog_mentions(API_VERSION), f"CHANGELOG.md needs a line '- API {API_VERSION}: ...'"


def test_bump_rules() -> None:
    assert bump_problem("1.0", "1.0", [], [], []) is None
    assert bump_problem("1.0", "1.1", [], [], ["x"]) is None
    assert "at least 1.1" in bump_problem("1.0", "1.0", [], [], ["x"])
    assert "2.0" in bump_problem("1.0", "1.1", [], ["x"], [])
    assert bump_problem("1.3", "2.0", ["x"], [], []) is None


def test_a_changed_signature_is_detected() -> None:
    api = describe_api()
    edited = json.loads(json.dumps(api))
    edited["minisgl_core.api"]["AttentionBackend"]["members"]["forward"] += "  # edited"
    del edited["hooks"]["minisgl_register_models"]
    removed, changed, added = compare(api, edited)
    assert changed == ["minisgl_core.api.AttentionBackend.members.forward"]
    assert removed and all(path.startswith("hooks.minisgl_register_models.") for path in removed)
    assert not added


def test_trailing_defaulted_parameters_are_an_addition() -> None:
    old = '"def (self, a: int, b: dict[str, int] = {}) -> None"'
    assert extends(old, '"def (self, a: int, b: dict[str, int] = {}, c: int | None = None) -> None"')
    assert not extends(old, '"def (self, a: int, b: dict[str, int] = {}, c: int) -> None"')  # no default
    assert not extends(
        old, '"def (self, c: int = 0, a: int, b: dict[str, int] = {}) -> None"'
    )  # not at the end
    assert not extends(
        old, '"def (self, a: int, b: dict[str, int] = {}, c: int = 0) -> int"'
    )  # return changed
    assert not extends(old, old)
    assert compare({"f": "def (x)"}, {"f": "def (x, y=1)"}) == ([], [], ["f"])
    assert compare({"f": "def (x)"}, {"f": "def (y)"}) == ([], ["f"], [])


def test_a_base_inserted_above_a_class_is_an_addition() -> None:
    def api(**bases: list[str]) -> dict[str, Any]:
        return {"minisgl_core.api": {name: {"bases": b} for name, b in bases.items()}}

    old = api(Parser=["m.ABC"], Json=["m.Parser"])
    inserted = api(Parser=["m.ABC"], Streaming=["m.Parser"], Json=["m.Streaming"])
    assert compare(old, inserted) == (
        [],
        [],
        ["minisgl_core.api.Json.bases", "minisgl_core.api.Streaming.bases"],
    )
    # a base taken away, or swapped for an unrelated one, is a change
    assert compare(old, api(Parser=["m.ABC"], Json=["m.ABC"]))[1] == ["minisgl_core.api.Json.bases"]
    assert compare(old, api(Parser=["m.ABC"], Json=["m.Other"]))[1] == ["minisgl_core.api.Json.bases"]


# ---------------------------------------------------------------- regenerating


def update(force: bool = False) -> int:
    from minisgl_core.api import API_VERSION

    current = describe_api()
    if SNAPSHOT.is_file() and not force:
        old = json.loads(SNAPSHOT.read_text())
        removed, changed, added = compare(old["api"], current)
        problem = bump_problem(old["api_version"], API_VERSION, removed, changed, added)
        if problem or not changelog_mentions(API_VERSION):
            print(diff_report(removed, changed, added))
            print(problem or f"add a line for API {API_VERSION} to CHANGELOG.md first", file=sys.stderr)
            return 1
    SNAPSHOT.write_text(
        json.dumps({"api_version": API_VERSION, "api": current}, indent=1, sort_keys=True) + "\n"
    )
    print(f"wrote {SNAPSHOT} for API {API_VERSION}")
    return 0


if __name__ == "__main__":
    if "--update" not in sys.argv:
        sys.exit("usage: python tests/test_api_snapshot.py --update [--force]")
    sys.exit(update(force="--force" in sys.argv))
