"""Llama: exactly the shared decoder (bias, tied embeddings and rope scaling come from config.json);
Mistral: Llama's decoder under another architecture name, with its sliding window in every layer."""

from minisgl_core.layers import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    qk_norm = False


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral's architecture is Llama's plus ``sliding_window``, applied in every layer whenever
    it is set (no ``use_sliding_window`` switch, as Qwen2 has): a window of at least the context is
    full attention; a shorter one (Mistral-7B-v0.1's 4,096 of 32,768) goes to the attention
    backend (API 2.7), which must declare "sliding_window"."""

    window_when_set = True
