"""How the engine names the plugins it runs when one misbehaves at request time: the selection,
the plugin and its distribution, as start-up errors name them."""

from __future__ import annotations

import traceback

from minisgl_core.plugin_results import WrongResult
from minisgl_core.plugins import Plugins

#: what each kind of selection is called in a message
KIND_WORDS = {
    "models": "model",
    "attention": "attention backend",
    "caches": "cache",
    "policies": "scheduling policy",
    "quantization": "quantization method",
    "tool_parsers": "tool call parser",
    "reasoning_parsers": "reasoning parser",
}


def selected_plugin(plugins: Plugins, kind: str, name: str) -> str:
    """``scheduling policy 'lpm' (plugin 'lpm', minisgl-plugin-lpm 0.1.0)``: the selection
    ``name`` of ``kind`` and what provides it, as far as the registry knows."""
    what = f"{KIND_WORDS.get(kind, kind)} {name!r}"
    reg = plugins.registry[kind].get(name)
    if reg is None:
        return what
    info = reg.plugin
    if info.distribution == "?":  # an entry point without a distribution (made in a test)
        return f"{what} (plugin {info.name!r})"
    return f"{what} (plugin {info.name!r}, {info.distribution} {info.version})"


class PluginFailure(RuntimeError):
    """A selected plugin raised during an engine step. The message names the selection, the
    plugin, its distribution and the function that raised; ``__cause__`` is the plugin's own
    exception. The engine does not step again after one (see :meth:`Engine.step`).

    ``summary`` is the message without the plugin's own exception text (``... failed in
    X.forward with RuntimeError``): what a server tells its clients, whose log keeps the rest."""

    def __init__(self, message: str, summary: str | None = None) -> None:
        super().__init__(message)
        self.summary = summary


class PluginBlame:
    """Finds which selected plugin an exception of an engine step came from: the innermost frame
    of its traceback in the package of a selected implementation (a model calls its attention
    backend: the backend is innermost), or for a :class:`WrongResult` (a value the core could
    not use, returned from the plugin's code, so no frame of it) the object that returned it."""

    def __init__(self, plugins: Plugins, selected: list[tuple[str, str]]) -> None:
        #: top-level package -> what of it the engine runs ("attention backend 'x' (plugin ...)")
        self.packages: dict[str, list[str]] = {}
        #: the same by (top-level package, kind)
        self.kinds: dict[tuple[str, str], list[str]] = {}
        for kind, name in dict.fromkeys(selected):
            reg = plugins.registry[kind].get(name)
            package = reg.target.partition(":")[0].split(".")[0] if reg is not None else "minisgl_core"
            if package != "minisgl_core":  # (a class of the core's own would take every frame)
                self.packages.setdefault(package, []).append(selected_plugin(plugins, kind, name))
                self.kinds.setdefault((package, kind), []).append(selected_plugin(plugins, kind, name))

    def failure(self, exc: BaseException) -> PluginFailure | None:
        """``exc`` as a :class:`PluginFailure` naming its plugin; None when no selected plugin's
        code is in its traceback (the core's own error: raised as it is)."""
        if isinstance(exc, WrongResult):
            labels = self.kinds.get((type(exc.owner).__module__.split(".")[0], exc.kind))
            if labels:  # (the message names the class: two selections of one package, say both)
                message = f"{' or '.join(labels)}: {exc}"
                return PluginFailure(message, message)  # (the core's words only: for clients too)
        culprit = None
        for frame, _ in traceback.walk_tb(exc.__traceback__):
            package = frame.f_globals.get("__name__", "").split(".")[0]
            if package in self.packages:
                culprit = (package, frame.f_code)
        if culprit is None:
            return None
        package, code = culprit
        where = getattr(code, "co_qualname", code.co_name)
        what_failed = f"{' and '.join(self.packages[package])} failed in {where}"
        return PluginFailure(
            f"{what_failed}: {type(exc).__name__}: {exc}", f"{what_failed} with {type(exc).__name__}"
        )
