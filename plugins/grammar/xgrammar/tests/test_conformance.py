"""The shared grammar-backend suite on xgrammar, and its packaging as the core sees it."""

from __future__ import annotations

from minisgl_core.testing.grammar_suite import GrammarBackendSuite
from minisgl_core.testing.packaging_suite import PluginPackagingSuite


class TestXGrammarBackend(GrammarBackendSuite):
    backend_cls = "xgrammar"


class TestXGrammarBackendPackaging(PluginPackagingSuite):
    plugin = "xgrammar"
    provides = {"grammars": ["xgrammar"]}


def test_plugin_registers_the_backend_lazily() -> None:
    import importlib

    import minisgl_plugin_xgrammar

    registered: list[tuple[str, str]] = []
    minisgl_plugin_xgrammar.minisgl_register_grammar_backends(
        register=lambda name, target: registered.append((name, target))
    )
    assert registered == [("xgrammar", "minisgl_plugin_xgrammar.backend:XGrammarBackend")]
    module, attribute = registered[0][1].split(":")
    assert getattr(importlib.import_module(module), attribute).__name__ == "XGrammarBackend"
