"""LlamaForCausalLM and MistralForCausalLM against the model and packaging conformance suites."""

from __future__ import annotations

from minisgl_plugin_llama.model import LlamaForCausalLM, MistralForCausalLM

from minisgl_core.testing.model_suite import ModelSuite
from minisgl_core.testing.packaging_suite import PluginPackagingSuite


class TestLlamaForCausalLMConformance(ModelSuite):
    model_cls = LlamaForCausalLM
    architecture = "LlamaForCausalLM"


class TestMistralForCausalLMConformance(ModelSuite):
    model_cls = MistralForCausalLM
    architecture = "MistralForCausalLM"
    config_overrides = {"sliding_window": None}


class TestLlamaPackaging(PluginPackagingSuite):
    plugin = "llama"
    provides = {"models": ["LlamaForCausalLM", "MistralForCausalLM"]}
