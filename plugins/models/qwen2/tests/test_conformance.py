"""Qwen2ForCausalLM against the model and packaging conformance suites."""

from __future__ import annotations

from minisgl_plugin_qwen2.model import Qwen2ForCausalLM

from minisgl_core.testing.model_suite import ModelSuite
from minisgl_core.testing.packaging_suite import PluginPackagingSuite


class TestQwen2ForCausalLMConformance(ModelSuite):
    model_cls = Qwen2ForCausalLM
    architecture = "Qwen2ForCausalLM"


class TestQwen2Packaging(PluginPackagingSuite):
    plugin = "qwen2"
    provides = {"models": ["Qwen2ForCausalLM"]}
