"""Qwen3MoeForCausalLM against the model and packaging conformance suites."""

from __future__ import annotations

from minisgl_plugin_qwen3_moe.model import Qwen3MoeForCausalLM

from minisgl_core.testing.model_suite import ModelSuite
from minisgl_core.testing.packaging_suite import PluginPackagingSuite


class TestQwen3MoeForCausalLMConformance(ModelSuite):
    model_cls = Qwen3MoeForCausalLM
    architecture = "Qwen3MoeForCausalLM"


class TestQwen3MoePackaging(PluginPackagingSuite):
    plugin = "qwen3-moe"
    provides = {"models": ["Qwen3MoeForCausalLM"]}
