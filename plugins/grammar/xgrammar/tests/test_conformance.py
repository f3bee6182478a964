"""The shared grammar-backend suite on xgrammar, and its packaging as the core sees it."""

from __future__ import annotations

from minisgl_core.testing.grammar_suite import GrammarBackendSuite
from minisgl_core.testing.packaging_suite import PluginPackagingSuite


class TestXGrammarBackend(GrammarBackendSuite):
    backend_cls = "xgrammar"


class TestXGrammarBackendPackaging(PluginPackagingSuite):
    plugin = "xgrammar"
    provides = {"grammars": ["xgrammar"]}
