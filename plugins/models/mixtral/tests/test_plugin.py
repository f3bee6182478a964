"""The thin plugin module registers MixtralForCausalLM lazily and points at a real Model subclass;
unsupported settings are refused in one line."""

from __future__ import annotations

import importlib

import minisgl_plugin_mixtral
from minisgl_plugin_mixtral.model import MixtralForCausalLM

from minisgl_core.api import Model
from minisgl_core.layers import DecoderForCausalLM


def test_registers_the_architecture() -> None:
    registered: list[tuple[str, str]] = []
    minisgl_plugin_mixtral.minisgl_register_models(
        register=lambda name, target: registered.append((name, target))
    )
    assert registered == [("MixtralForCausalLM", "minisgl_plugin_mixtral.model:MixtralForCausalLM")]
    module, _, attribute = registered[0][1].partition(":")
    cls = getattr(importlib.import_module(module), attribute)
    assert issubclass(cls, DecoderForCausalLM) and issubclass(cls, Model)
    # 2.1: its unsupported_setting passes the engine's context_len to the shared decoder's
    assert minisgl_plugin_mixtral.MINISGL_API == "2.1"


def test_settings_it_cannot_build_are_refused_in_one_line() -> None:
    hf = {"hidden_size": 64, "num_attention_heads": 4, "num_local_experts": 8, "num_experts_per_tok": 2,
          "max_position_embeddings": 32768}  # fmt: skip
    assert MixtralForCausalLM.unsupported_setting(hf) is None
    assert MixtralForCausalLM.unsupported_setting({**hf, "num_experts_per_tok": 9}) == (
        "num_experts_per_tok 9 is not supported (1 to num_local_experts 8 is)"
    )
    # a window applies in every layer, as Mistral's (API 2.7: the backend computes it)
    assert MixtralForCausalLM.unsupported_setting({**hf, "sliding_window": 4096}) is None
    windowed = {**hf, "sliding_window": 4096, "num_hidden_layers": 3}
    assert MixtralForCausalLM.sliding_window_layers(windowed) == (4096, frozenset({0, 1, 2}))
    assert MixtralForCausalLM.unsupported_setting({**hf, "sliding_window": -1}) == (
        "sliding_window -1 is not supported: the window must be a positive number of tokens"
    )
    assert MixtralForCausalLM.unsupported_setting({**hf, "sliding_window": None}) is None
