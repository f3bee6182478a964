"""The thin plugin module registers the four architectures lazily and points at real Model subclasses."""

from __future__ import annotations

import importlib

import minisgl_plugin_gemma

from minisgl_core.api import Model
from minisgl_core.layers import DecoderForCausalLM


def test_registers_the_architectures() -> None:
    registered: list[tuple[str, str]] = []
    minisgl_plugin_gemma.minisgl_register_models(
        register=lambda name, target: registered.append((name, target))
    )
    assert registered == [
        ("GemmaForCausalLM", "minisgl_plugin_gemma.model:GemmaForCausalLM"),
        ("Gemma2ForCausalLM", "minisgl_plugin_gemma.model:Gemma2ForCausalLM"),
        ("Gemma3ForCausalLM", "minisgl_plugin_gemma.model:Gemma3ForCausalLM"),
        ("Gemma3ForConditionalGeneration", "minisgl_plugin_gemma.model:Gemma3ForConditionalGeneration"),
    ]
    for _, target in registered:
        module, _, attribute = target.partition(":")
        cls = getattr(importlib.import_module(module), attribute)
        assert issubclass(cls, DecoderForCausalLM) and issubclass(cls, Model)
    # Gemma 2's attention soft-cap reaches the backends through KVSpec.logits_soft_cap (API 2.6)
    assert minisgl_plugin_gemma.MINISGL_API == "2.8"
