"""Llama: exactly the shared decoder (bias, tied embeddings and rope scaling come from config.json)."""

from minisgl_core.layers import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    qk_norm = False
