"""Llama: exactly the shared decoder (bias, tied embeddings and rope scaling come from config.json);
Mistral: Llama's decoder under another architecture name, without a sliding window shorter than
its context."""

from minisgl_core.layers import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    qk_norm = False


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral's architecture is Llama's plus ``sliding_window``, applied whenever it is set (no
    ``use_sliding_window`` switch, as Qwen2 has): a window of at least the context is full
    attention, which this decoder computes; a shorter one (Mistral-7B-v0.1's 4,096 of 32,768) is
    refused rather than computed as full attention past the window."""

    window_when_set = True
