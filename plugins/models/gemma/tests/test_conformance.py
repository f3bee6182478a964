"""GemmaForCausalLM, Gemma2ForCausalLM and Gemma3ForCausalLM against the model and packaging conformance suites."""

from __future__ import annotations

from minisgl_plugin_gemma.model import Gemma2ForCausalLM, Gemma3ForCausalLM, GemmaForCausalLM

from minisgl_core.testing.model_suite import ModelSuite
from minisgl_core.testing.packaging_suite import PluginPackagingSuite


class TestGemmaConformance(ModelSuite):
    model_cls = GemmaForCausalLM
    architecture = "GemmaForCausalLM"
    config_overrides = dict(initializer_range=0.7)


class TestGemma2CappedConformance(ModelSuite):
    model_cls = Gemma2ForCausalLM
    architecture = "Gemma2ForCausalLM"
    config_overrides = dict(
        tie_word_embeddings=False,
        num_key_value_heads=1,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0,
        query_pre_attn_scalar=8,
    )


class TestGemma3Conformance(ModelSuite):
    model_cls = Gemma3ForCausalLM
    architecture = "Gemma3ForCausalLM"
    # (layers 0 and 2 slide, 1 attends fully: both ropes)
    config_overrides = dict(
        tie_word_embeddings=False, num_hidden_layers=3, sliding_window_pattern=2, num_key_value_heads=1
    )


class TestGemmaPackaging(PluginPackagingSuite):
    plugin = "gemma"
    provides = {
        "models": [
            "GemmaForCausalLM",
            "Gemma2ForCausalLM",
            "Gemma3ForCausalLM",
            "Gemma3ForConditionalGeneration",
        ]
    }
