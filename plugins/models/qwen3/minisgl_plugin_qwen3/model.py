"""Qwen3: the shared Llama-family decoder plus per-head RMS norm on q and k before rope."""

from minisgl_core.layers import DecoderForCausalLM


class Qwen3ForCausalLM(DecoderForCausalLM):
    qk_norm = True
