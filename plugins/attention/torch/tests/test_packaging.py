"""The torch plugin against the packaging conformance suite (the installed distribution, as the core sees it)."""

from __future__ import annotations

from minisgl_core.testing.packaging_suite import PluginPackagingSuite


class TestTorchPackaging(PluginPackagingSuite):
    plugin = "torch"
    provides = {"attention": ["torch"]}
