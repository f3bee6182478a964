"""GraniteForCausalLM against the model and packaging conformance suites."""

from __future__ import annotations

from minisgl_plugin_granite.model import GraniteForCausalLM

from minisgl_core.testing.model_suite import ModelSuite
from minisgl_core.testing.packaging_suite import PluginPackagingSuite


class TestGraniteForCausalLMConformance(ModelSuite):
    model_cls = GraniteForCausalLM
    architecture = "GraniteForCausalLM"
    config_overrides = dict(embedding_multiplier=12.0, residual_multiplier=0.22,
                            attention_multiplier=0.0078125, logits_scaling=8.0, tie_word_embeddings=True)  # fmt: skip


class TestGranitePackaging(PluginPackagingSuite):
    plugin = "granite"
    provides = {"models": ["GraniteForCausalLM"]}
