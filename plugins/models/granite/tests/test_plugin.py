"""The thin plugin module registers GraniteForCausalLM lazily and points at a real Model subclass."""

from __future__ import annotations

import importlib

import minisgl_plugin_granite

from minisgl_core.api import Model
from minisgl_core.layers import DecoderForCausalLM


def test_registers_the_architecture() -> None:
    registered: list[tuple[str, str]] = []
    minisgl_plugin_granite.minisgl_register_models(
        register=lambda name, target: registered.append((name, target))
    )
    assert registered == [("GraniteForCausalLM", "minisgl_plugin_granite.model:GraniteForCausalLM")]
    module, _, attribute = registered[0][1].partition(":")
    cls = getattr(importlib.import_module(module), attribute)
    assert issubclass(cls, DecoderForCausalLM) and issubclass(cls, Model)
    assert minisgl_plugin_granite.MINISGL_API == "2.0"
