"""Phi3ForCausalLM against the model and packaging conformance suites."""

from __future__ import annotations

from minisgl_plugin_phi3.model import Phi3ForCausalLM

from minisgl_core.testing.model_suite import ModelSuite
from minisgl_core.testing.packaging_suite import PluginPackagingSuite


class TestPhi3ForCausalLMConformance(ModelSuite):
    model_cls = Phi3ForCausalLM
    architecture = "Phi3ForCausalLM"


class TestPhi3Packaging(PluginPackagingSuite):
    plugin = "phi3"
    provides = {"models": ["Phi3ForCausalLM"]}
