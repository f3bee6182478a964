"""The thin plugin module registers Olmo2ForCausalLM lazily and points at a real Model subclass."""

from __future__ import annotations

import importlib

import minisgl_plugin_olmo2

from minisgl_core.api import Model
from minisgl_core.layers import DecoderForCausalLM


def test_registers_the_architecture() -> None:
    registered: list[tuple[str, str]] = []
    minisgl_plugin_olmo2.minisgl_register_models(
        register=lambda name, target: registered.append((name, target))
    )
    assert registered == [("Olmo2ForCausalLM", "minisgl_plugin_olmo2.model:Olmo2ForCausalLM")]
    module, _, attribute = registered[0][1].partition(":")
    cls = getattr(importlib.import_module(module), attribute)
    assert issubclass(cls, DecoderForCausalLM) and issubclass(cls, Model)
    assert minisgl_plugin_olmo2.MINISGL_API == "2.0"
