"""The shared grammar-backend suite on llguidance, and its packaging as the core sees it."""

from __future__ import annotations

from minisgl_core.testing.grammar_suite import GrammarBackendSuite
from minisgl_core.testing.packaging_suite import PluginPackagingSuite


class TestLLGuidanceBackend(GrammarBackendSuite):
    backend_cls = "llguidance"


class TestLLGuidanceBackendPackaging(PluginPackagingSuite):
    plugin = "llguidance"
    provides = {"grammars": ["llguidance"]}


def test_plugin_registers_the_backend_lazily() -> None:
    import importlib

    import minisgl_plugin_llguidance

    registered: list[tuple[str, str]] = []
    minisgl_plugin_llguidance.minisgl_register_grammar_backends(
        register=lambda name, target: registered.append((name, target))
    )
    assert registered == [("llguidance", "minisgl_plugin_llguidance.backend:LLGuidanceBackend")]
    module, attribute = registered[0][1].split(":")
    assert getattr(importlib.import_module(module), attribute).__name__ == "LLGuidanceBackend"
