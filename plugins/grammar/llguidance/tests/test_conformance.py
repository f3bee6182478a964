"""The shared grammar-backend suite on llguidance, and its packaging as the core sees it."""

from __future__ import annotations

from minisgl_core.testing.grammar_suite import GrammarBackendSuite
from minisgl_core.testing.packaging_suite import PluginPackagingSuite


class TestLLGuidanceBackend(GrammarBackendSuite):
    backend_cls = "llguidance"


class TestLLGuidanceBackendPackaging(PluginPackagingSuite):
    plugin = "llguidance"
    provides = {"grammars": ["llguidance"]}
