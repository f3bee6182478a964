"""The thin plugin module registers LlamaForCausalLM and MistralForCausalLM lazily and points at a real Model subclass."""

from __future__ import annotations

import importlib

import minisgl_plugin_llama

from minisgl_core.api import Model
from minisgl_core.layers import DecoderForCausalLM


def test_registers_the_architecture() -> None:
    registered: list[tuple[str, str]] = []
    minisgl_plugin_llama.minisgl_register_models(
        register=lambda name, target: registered.append((name, target))
    )
    assert registered == [
        ("LlamaForCausalLM", "minisgl_plugin_llama.model:LlamaForCausalLM"),
        ("MistralForCausalLM", "minisgl_plugin_llama.model:MistralForCausalLM"),
    ]
    for _, target in registered:
        module, _, attribute = target.partition(":")
        cls = getattr(importlib.import_module(module), attribute)
        assert issubclass(cls, DecoderForCausalLM) and issubclass(cls, Model)
    assert minisgl_plugin_llama.MINISGL_API == "2.0"
