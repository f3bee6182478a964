"""How the engine names the plugins it runs when one misbehaves at request time: the selection,
the plugin and its distribution, as start-up errors name them."""

from __future__ import annotations

from minisgl_core.plugins import Plugins

#: what each kind of selection is called in a message
KIND_WORDS = {
    "models": "model",
    "attention": "attention backend",
    "caches": "cache",
    "policies": "scheduling policy",
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
