"""LlamaForCausalLM against the model and packaging conformance suites."""

from __future__ import annotations

from minisgl_plugin_llama.model import LlamaForCausalLM

from minisgl_core.testing.model_suite import ModelSuite
from minisgl_core.testing.packaging_suite import PluginPackagingSuite


class TestLlamaForCausalLMConformance(ModelSuite):
    model_cls = LlamaForCausalLM
    architecture = "LlamaForCausalLM"


class TestLlamaPackaging(PluginPackagingSuite):
    plugin = "llama"
    provides = {"models": ["LlamaForCausalLM"]}
