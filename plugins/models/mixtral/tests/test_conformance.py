"""MixtralForCausalLM against the model and packaging conformance suites."""

from __future__ import annotations

from minisgl_plugin_mixtral.model import MixtralForCausalLM

from minisgl_core.testing.model_suite import ModelSuite
from minisgl_core.testing.packaging_suite import PluginPackagingSuite


class TestMixtralForCausalLMConformance(ModelSuite):
    model_cls = MixtralForCausalLM
    architecture = "MixtralForCausalLM"


class TestMixtralPackaging(PluginPackagingSuite):
    plugin = "mixtral"
    provides = {"models": ["MixtralForCausalLM"]}
