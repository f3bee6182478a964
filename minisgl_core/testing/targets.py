"""How every conformance suite takes the class it tests: the class itself, ``"module:Class"``, or a
name an installed plugin registers (looked up through the core's loader, as a start selects it)."""

from __future__ import annotations

import functools
import importlib


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
