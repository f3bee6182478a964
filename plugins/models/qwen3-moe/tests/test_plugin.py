"""The thin plugin module registers Qwen3MoeForCausalLM lazily and points at a real Model subclass;
unsupported settings are refused in one line."""

from __future__ import annotations

import importlib

import minisgl_plugin_qwen3_moe
from minisgl_plugin_qwen3_moe.model import Qwen3MoeForCausalLM, sparse_layer

from minisgl_core.api import Model
from minisgl_core.layers import DecoderForCausalLM


def test_registers_the_architecture() -> None:
    registered: list[tuple[str, str]] = []
    minisgl_plugin_qwen3_moe.minisgl_register_models(
        register=lambda name, target: registered.append((name, target))
    )
    assert registered == [("Qwen3MoeForCausalLM", "minisgl_plugin_qwen3_moe.model:Qwen3MoeForCausalLM")]
    module, _, attribute = registered[0][1].partition(":")
    cls = getattr(importlib.import_module(module), attribute)
    assert issubclass(cls, DecoderForCausalLM) and issubclass(cls, Model)
    # 2.1: its unsupported_setting passes the engine's context_len to the shared decoder's
    assert minisgl_plugin_qwen3_moe.MINISGL_API == "2.1"


def test_more_experts_a_token_than_there_are_is_refused() -> None:
    hf = {"hidden_size": 64, "num_attention_heads": 4, "num_experts": 4, "num_experts_per_tok": 5}
    assert Qwen3MoeForCausalLM.unsupported_setting(hf) == (
        "num_experts_per_tok 5 is not supported (1 to num_experts 4 is)"
    )
    assert Qwen3MoeForCausalLM.unsupported_setting({**hf, "num_experts_per_tok": 4}) is None


def test_sparse_layers_follow_transformers_rule() -> None:
    hf = {"num_experts": 8, "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    assert [sparse_layer(hf, i) for i in range(6)] == [False, True, False, False, False, True]
    assert not any(sparse_layer({"num_experts": 0}, i) for i in range(3))
    assert all(sparse_layer({"num_local_experts": 2}, i) for i in range(3))
