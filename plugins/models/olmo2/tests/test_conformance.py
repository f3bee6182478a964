"""Olmo2ForCausalLM against the model and packaging conformance suites."""

from __future__ import annotations

from minisgl_plugin_olmo2.model import Olmo2ForCausalLM

from minisgl_core.testing.model_suite import ModelSuite
from minisgl_core.testing.packaging_suite import PluginPackagingSuite


class TestOlmo2ForCausalLMConformance(ModelSuite):
    model_cls = Olmo2ForCausalLM
    architecture = "Olmo2ForCausalLM"


class TestOlmo2TiedConformance(ModelSuite):
    model_cls = Olmo2ForCausalLM
    architecture = "Olmo2ForCausalLM"
    config_overrides = dict(tie_word_embeddings=True, num_key_value_heads=1)


class TestOlmo2Packaging(PluginPackagingSuite):
    plugin = "olmo2"
    provides = {"models": ["Olmo2ForCausalLM"]}
