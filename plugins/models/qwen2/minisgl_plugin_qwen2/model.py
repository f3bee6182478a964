"""Qwen2 (and Qwen2.5): the shared Llama-family decoder with a bias on q, k and v, none on o_proj."""

from minisgl_core.layers import DecoderForCausalLM


class Qwen2ForCausalLM(DecoderForCausalLM):
    qkv_bias = True
