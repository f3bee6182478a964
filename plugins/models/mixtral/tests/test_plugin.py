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
    assert MixtralForCausalLM.unsupported_setting({**hf, "sliding_window": 4096}) == (
        "sliding_window 4096 (shorter than max_position_embeddings 32768) is not supported: "
        "sliding-window attention is not implemented; a context of at most 4096 tokens never reaches "
        "the window (--max-context-len 4096, or max_context_len=4096 in LLM())"
    )
    assert MixtralForCausalLM.unsupported_setting({**hf, "sliding_window": 4096}, context_len=4096) is None
    assert MixtralForCausalLM.unsupported_setting({**hf, "sliding_window": None}) is None
