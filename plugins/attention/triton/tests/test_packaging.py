"""The packaging conformance suite on the installed distribution, as the core sees it."""

from __future__ import annotations

from minisgl_core.testing.packaging_suite import PluginPackagingSuite


class TestTritonPackaging(PluginPackagingSuite):
    plugin = "triton"
    provides = {"attention": ["triton"]}
