"""llama.cpp tensor names → Hugging Face checkpoint names, and undoing llama.cpp's Q/K permutation."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (names are read where torch is not: the tokenizer processes open the file)
    import torch

_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_qkv": "self_attn.qkv_proj",  # phi3's fused q, k and v
    # a mixture of experts (qwen3moe): the router, and each expert matrix stacked over the experts
    # ([experts, rows, columns]), which the model's loader splits
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
#: block parts an architecture names otherwise: phi3's ffn_up is gate and up fused (as its
#: checkpoint's gate_up_proj, gate first)
#: Gemma 2 and 3 have four norms a block (gguf's tensor_mapping.py for GEMMA2/GEMMA3): the
#: attention output's, the MLP input's (``ffn_norm``, which is Gemma 1's post_attention_layernorm)
#: and the MLP output's
_GEMMA2_NORMS = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_ARCH_BLOCK = {"phi3": {"ffn_up": "mlp.gate_up_proj"}, "gemma2": _GEMMA2_NORMS, "gemma3": _GEMMA2_NORMS}
#: what llama.cpp's converter adds to every ``*norm.weight`` of a Gemma model (the model scales by
#: ``1 + weight``, llama.cpp's RMS norm by the weight): GemmaModel, Gemma2Model and Gemma3Model in
#: convert_hf_to_gguf.py, Gemma 3's per-head q/k norms included; undone at load
GEMMA_NORM_SHIFT = 1.0

_BLOCK_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")

#: Llama 3's rope scaling as llama.cpp's converter stores it: one divisor per rotary frequency
#: (read into config.json's ``rope_scaling`` when the file is opened; our models compute the table)
ROPE_FREQS = "rope_freqs.weight"
#: tensors that are not weights of our models
IGNORED = frozenset({ROPE_FREQS})
#: Phi-3's longrope scaling as llama.cpp stores it (no model of ours computes it: refused)
LONGROPE_FACTORS = frozenset({"rope_factors_long.weight", "rope_factors_short.weight"})


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The Hugging Face name of a GGUF tensor of a file of ``arch`` (``general.architecture``),
    or None for a tensor we do not know."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    match = _BLOCK_NAME.fullmatch(gguf_name)
    parts = {**_BLOCK, **_ARCH_BLOCK.get(arch, {})}
    if match is None or match.group(2) not in parts:
        return None
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{parts[part]}.{kind}"


def unpermute_qk(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo the row order llama.cpp's converter gives q_proj/k_proj of the llama architecture.

    The converter interleaves each head's two rotary halves (HF's rotate-half layout → GGML's
    adjacent pairs); reading its rows back in the inverse order restores HF's layout."""
    rows = weight.shape[0]
    rest = weight.shape[1:]
    return weight.reshape(num_heads, rows // num_heads // 2, 2, *rest).transpose(1, 2).reshape(rows, *rest)
