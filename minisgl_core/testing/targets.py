"""How every conformance suite takes the class it tests: the class itself, ``"module:Class"``, or a
name an installed plugin registers (looked up through the core's loader, as a start selects it)."""

from __future__ import annotations

import functools
import importlib
from typing import Any


def resolve(kind: str, target: type | str) -> type:
    """A class given as itself, as ``"module:Class"``, or as a name an installed plugin registers
    under ``kind`` (``"caches"``, ``"attention"``...: the keys of ``minisgl_core.plugins.KINDS``)."""
    if not isinstance(target, str):
        return target
    if ":" in target:
        module, _, attribute = target.partition(":")
        return getattr(importlib.import_module(module), attribute)
    return registered(kind, target)


@functools.cache
def registered(kind: str, name: str) -> type:
    """The class an installed plugin registers as ``name`` (once a process: a suite asks for its
    class in every test and hypothesis example, and loading the plugins takes about 30 ms)."""
    from minisgl_core.plugins import Plugins

    return Plugins.load().resolve(kind, name)


def build(cls: type, *args: Any, **kwargs: Any) -> Any:
    """``cls(*args, **kwargs)`` as the core builds it: with ``ctx=`` a scheduler's context when
    its constructor takes ``ctx`` (API 2.9), whose ``options`` hold every installed plugin's
    options at their defaults and whose ``resolve`` looks in the installed plugins."""
    from minisgl_core import plugins

    if not plugins.takes_context(cls):
        return cls(*args, **kwargs)
    return plugins.build(cls, suite_context(), *args, **kwargs)


@functools.cache
def suite_context() -> Any:
    """The ProcessContext the suites build a component with (a scheduler's, as offline)."""
    from minisgl_core.api import ProcessContext
    from minisgl_core.plugins import Plugins

    loaded = Plugins.load()
    return ProcessContext(role="scheduler", options=loaded.option_defaults(), _plugins=loaded)
