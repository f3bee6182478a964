"""Llama: exactly the shared decoder (bias, tied embeddings and rope scaling come from config.json);
Mistral: Llama's decoder under another architecture name, without a sliding window shorter than
its context."""

from __future__ import annotations

import json
from typing import Any

from minisgl_core.layers import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    qk_norm = False


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral's architecture is Llama's plus ``sliding_window``, applied whenever it is set (no
    ``use_sliding_window`` switch, as Qwen2 has): a window of at least the context is full
    attention, which this decoder computes; a shorter one (Mistral-7B-v0.1's 4,096 of 32,768) is
    refused rather than computed as full attention past the window."""

    @classmethod
    def unsupported_setting(cls, hf: dict[str, Any]) -> str | None:
        window, context = hf.get("sliding_window"), hf.get("max_position_embeddings", 4096)
        if isinstance(window, int) and isinstance(context, int) and window < context:
            return (
                f"sliding_window {json.dumps(window)} (shorter than max_position_embeddings {context}) is not "
                "supported: sliding-window attention is not implemented"
            )
        return super().unsupported_setting(hf)
