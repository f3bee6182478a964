"""Keeping a renamed or removed API name working, with a warning, for one minor version.

The rule (see docs/plugins.md, "Versioning"): a name of :mod:`minisgl_core.api` that changes in
API ``X.Y`` keeps working under its old spelling through ``X.Y`` and is removed in ``X.(Y+1)``.
Every use of the old spelling warns :class:`MinisglDeprecationWarning` naming the replacement and
the version that removes it. The helpers refuse to run once the core's ``API_VERSION`` reaches
that version, so a forgotten alias fails the test suite instead of living forever.

In ``minisgl_core/api/__init__.py``, after ``API_VERSION``::

    __getattr__ = renamed({"OldName": "NewName"}, globals(), since="1.1")

On a class, for a renamed attribute or method: ``old_name = renamed_attribute("new_name", since="1.1")``.
On a function or class that goes away: ``@deprecated(since="1.1", use="minisgl_core.api.Other")``.
A module whose names moved elsewhere (``minisgl_core.api.layers`` in 2.0): :func:`moved_module`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import sys
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


class MinisglDeprecationWarning(DeprecationWarning):
    """A plugin uses an API name that the next minor version of minisgl removes."""


def removal_version(since: str) -> str:
    """The API version that removes a name deprecated in ``since`` (the next minor)."""
    major, minor = (int(part) for part in since.split("."))
    return f"{major}.{minor + 1}"


def _check_not_expired(what: str, since: str, current: str | None) -> None:
    if current is None:
        from minisgl_core.api import API_VERSION  # at call time: the api package imports this module

        current = API_VERSION
    removed_in = removal_version(since)
    as_tuple = tuple(int(part) for part in current.split("."))
    if as_tuple >= tuple(int(part) for part in removed_in.split(".")):
        raise RuntimeError(
            f"{what} was deprecated in API {since} and must be removed in {removed_in}; "
            f"the API is {current}: delete the alias"
        )


def warn_deprecated(old: str, *, since: str, use: str | None = None, stacklevel: int = 3) -> None:
    """Warn that ``old`` is deprecated since ``since``; ``use`` names the replacement."""
    instead = f"; use {use} instead" if use else ""
    warnings.warn(
        f"{old} is deprecated since minisgl API {since} and is removed in {removal_version(since)}{instead}",
        MinisglDeprecationWarning,
        stacklevel=stacklevel,
    )


def deprecated(*, since: str, use: str | None = None, current: str | None = None) -> Callable[[T], T]:
    """Decorate a function (warns on each call) or a class (warns on instantiation and subclassing)."""

    def decorate(obj: T) -> T:
        name = getattr(obj, "__qualname__", repr(obj))
        _check_not_expired(name, since, current)
        if isinstance(obj, type):
            original_init = obj.__init__
            original_subclass_hook = obj.__dict__.get("__init_subclass__")

            @functools.wraps(original_init)
            def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
                warn_deprecated(name, since=since, use=use)
                original_init(self, *args, **kwargs)

            def __init_subclass__(cls: type, **kwargs: Any) -> None:
                warn_deprecated(f"subclassing {name}", since=since, use=use)
                if original_subclass_hook is not None:
                    original_subclass_hook.__func__(cls, **kwargs)
                else:
                    super(obj, cls).__init_subclass__(**kwargs)

            obj.__init__ = __init__  # type: ignore[misc]
            obj.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]
            return obj

        @functools.wraps(obj)  # type: ignore[arg-type]
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            warn_deprecated(name, since=since, use=use)
            return obj(*args, **kwargs)  # type: ignore[operator]

        return wrapper  # type: ignore[return-value]

    return decorate


def renamed(
    aliases: Mapping[str, str], namespace: dict[str, Any], *, since: str, current: str | None = None
) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` serving each old name in ``aliases`` as its new name, with a warning."""
    module = namespace.get("__name__", "?")
    for old in aliases:
        _check_not_expired(f"{module}.{old}", since, current)

    def __getattr__(name: str) -> Any:
        if name in aliases:
            warn_deprecated(f"{module}.{name}", since=since, use=f"{module}.{aliases[name]}")
            return namespace[aliases[name]]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


class renamed_attribute:  # lower case: used like a function in class bodies
    """Class-body descriptor: the old attribute name reads (and writes) the new one, with a warning."""

    def __init__(self, new_name: str, *, since: str, current: str | None = None) -> None:
        self.new_name, self.since, self.current = new_name, since, current
        self.old_name = "?"

    def __set_name__(self, owner: type, name: str) -> None:
        self.old_name = f"{owner.__qualname__}.{name}"
        _check_not_expired(self.old_name, self.since, self.current)

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        warn_deprecated(self.old_name, since=self.since, use=self.new_name)
        return getattr(owner if obj is None else obj, self.new_name)

    def __set__(self, obj: Any, value: Any) -> None:
        warn_deprecated(self.old_name, since=self.since, use=self.new_name)
        setattr(obj, self.new_name, value)


# ---------------------------------------------------------------- moved modules

#: files whose frames are import machinery or this module, never "the caller"
_MACHINERY = ("<frozen importlib", __file__)


def _caller(extra_files: Sequence[str] = ()) -> tuple[str, int]:
    """The module that triggered the access in progress, skipping import machinery, this module
    and ``extra_files``, and the ``stacklevel`` for :func:`warnings.warn` called right here's
    caller (one frame up) that points at that module's line."""
    skip = (*_MACHINERY, *extra_files)
    frame = sys._getframe(2)  # the caller of the function that called this one
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        # warnings.warn does not count importlib's bootstrap frames in stacklevel
        name = frame.f_code.co_filename
        level += not ("importlib" in name and "_bootstrap" in name)
        frame = frame.f_back
    if frame is None:
        return "?", 2
    return frame.f_globals.get("__name__", "?"), level


@functools.lru_cache(maxsize=1)
def _distributions() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distribution_of(module: str) -> str | None:
    """The installed distribution that provides ``module`` (``"minisgl-plugin-x"``), if any."""
    names = _distributions().get(module.partition(".")[0])
    return names[0] if names else None


def _who(module: str) -> str:
    dist = distribution_of(module)
    return f"{module} ({dist})" if dist else module


class _MovedModule(types.ModuleType):
    """A submodule of a moved module: every attribute read forwards to the new module."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self.__dict__["_moved_forward"](name)


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``old.sub`` (for each ``sub`` of ``submodules``) as a forwarding module."""

    def __init__(self, old: str, forwarders: dict[str, Callable[[str], Any]]) -> None:
        self.old, self.forwarders = old, forwarders

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        parent, _, sub = fullname.rpartition(".")
        if parent != self.old or sub not in self.forwarders:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _MovedModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__["_moved_forward"] = self.forwarders[module.__name__.rpartition(".")[2]]


def moved_module(
    namespace: dict[str, Any],
    new: str,
    *,
    since: str,
    submodules: Sequence[str] = (),
    current: str | None = None,
) -> Callable[[str], Any]:
    """Keep a module whose names moved to ``new`` importable, as the module-level ``__getattr__``
    of the old one: ``from old import X`` (and ``from old.sub import X`` for each of
    ``submodules``) returns ``new``'s ``X`` and warns :class:`MinisglDeprecationWarning` once per
    importing module and name, naming that module, its distribution and the import to use.

    In the old module: ``__getattr__ = moved_module(globals(), "pkg.new", since="2.0", submodules=(...))``.
    Its submodules need no files: a finder on ``sys.meta_path`` serves them (and the old module
    becomes a package: its ``__path__`` is set empty)."""
    old = namespace["__name__"]
    _check_not_expired(old, since, current)
    warned: set[tuple[str, str]] = set()

    def forwarder(old_module: str, new_module: str) -> Callable[[str], Any]:
        def forward(name: str) -> Any:
            try:
                value = getattr(importlib.import_module(new_module), name)
            except AttributeError:
                raise AttributeError(f"module {old_module!r} has no attribute {name!r}") from None
            caller, level = _caller()
            if (caller, f"{old_module}.{name}") not in warned:
                warned.add((caller, f"{old_module}.{name}"))
                warnings.warn(
                    f"{_who(caller)} imports {name} from {old_module}, which moved in minisgl API "
                    f"{since} and is removed in {removal_version(since)}; use "
                    f"`from {new_module} import {name}` instead",
                    MinisglDeprecationWarning,
                    stacklevel=level,
                )
            return value

        return forward

    subs = {sub: forwarder(f"{old}.{sub}", f"{new}.{sub}") for sub in submodules}
    if subs:
        namespace.setdefault("__path__", [])
        sys.meta_path.append(_MovedFinder(old, subs))
    return forwarder(old, new)
