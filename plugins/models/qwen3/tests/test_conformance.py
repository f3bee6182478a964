"""Qwen3ForCausalLM against the model and packaging conformance suites."""

from __future__ import annotations

from minisgl_plugin_qwen3.model import Qwen3ForCausalLM

from minisgl_core.testing.model_suite import ModelSuite
from minisgl_core.testing.packaging_suite import PluginPackagingSuite


class TestQwen3ForCausalLMConformance(ModelSuite):
    model_cls = Qwen3ForCausalLM
    architecture = "Qwen3ForCausalLM"


class TestQwen3Packaging(PluginPackagingSuite):
    plugin = "qwen3"
    provides = {"models": ["Qwen3ForCausalLM"]}
